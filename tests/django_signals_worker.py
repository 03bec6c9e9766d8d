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

    from stampede import ConfigError
    from stampede.django.commit import invalidate_on_commit

    try:
        invalidate_on_change(Item, item)
        seen["connected twice"] = "accepted"
    except ConfigError:
        seen["connected twice"] = "refused"

    # A cache that cannot be reached fails its invalidation after the commit: the hooks
    # after it (another invalidation, the application's own) still run, and the commit
    # raises nothing.
    down = Stampede.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2, namespace="down")
    unreachable = down.cached_loader("row:{pk}")(lambda pk: pk)
    Item.objects.create(pk=2, name="kept")
    assert item(2) == "kept"
    hooks: list[str] = []
    try:
        with transaction.atomic():
            Item.objects.filter(pk=2).update(name="changed")
            invalidate_on_commit(unreachable, 2)
            transaction.on_commit(lambda: hooks.append("the application's hook"))
            invalidate_on_commit(item, 2)
        seen["after a failed invalidation"] = [item(2), hooks]
    except Exception as error:
        seen["after a failed invalidation"] = f"the commit raised {error!r}"
    down.close()
    print(json.dumps(seen), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
