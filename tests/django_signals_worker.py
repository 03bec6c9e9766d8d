"""A worker process for ``stampede.django.commit.invalidate_on_change``: Django configured
with a SQLite file and one model, ``Item``, whose saves and deletes invalidate a cached
loader after their commit. Runs the scenario and prints one JSON line: what the loader
returned at each step, and how many loads it made by then."""

from __future__ import annotations

import json
import sys
from typing import Any

import django
from django.conf import settings


def main() -> None:
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
        INSTALLED_APPS=["django.contrib.contenttypes"],
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection, models, transaction

    from stampede import Stampede
    from stampede.django.commit import invalidate_on_change

    class Item(models.Model):
        name = models.CharField(max_length=50)

        class Meta:
            app_label = "contenttypes"  # an installed app: no app of its own to install

    with connection.schema_editor() as editor:
        editor.create_model(Item)

    loads: list[int] = []
    layer = Stampede(namespace="signals")

    @layer.cached_loader("item:{pk}")
    def item(pk: int) -> str | None:
        loads.append(pk)
        found = Item.objects.filter(pk=pk).first()
        return None if found is None else found.name

    invalidate_on_change(Item, item)
    seen: dict[str, Any] = {}

    def note(step: str) -> None:
        seen[step] = [item(1), len(loads)]

    Item.objects.create(pk=1, name="first")
    note("created")
    with transaction.atomic():
        row = Item.objects.get(pk=1)
        row.name = "second"
        row.save()
        note("saved, not committed")
    note("committed")
    try:
        with transaction.atomic():
            row.name = "third"
            row.save()
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    note("rolled back")
    Item.objects.filter(pk=1).delete()  # QuerySet.delete() sends post_delete per row
    note("deleted")
    print(json.dumps(seen), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
