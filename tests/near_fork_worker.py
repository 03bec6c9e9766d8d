"""A layer whose near cache holds a copy, forked (as gunicorn --preload does): a script the
near-cache fork test runs in a subprocess.

    python tests/near_fork_worker.py REDIS_URL

The child must not serve its parent's copies (nobody keeps them exact in the child), must
register as a member of its own, and must then drop its own copy when the parent
invalidates. Prints the child's findings as one JSON line.
"""

import json
import os
import sys
import time

import redis

from stampede import Stampede
from stampede._drivers.near import MISSING

url = sys.argv[1]
database = redis.Redis.from_url(url, socket_timeout=5)
database.set("db:fork", 1)
layer = Stampede.from_url(url, namespace="nearfork", near_cache=True)
load = layer.cached_loader("item:{key}")(lambda key: int(database.get("db:fork") or 0))


def serve_from_copy() -> None:
    deadline = time.monotonic() + 10
    hits = layer.stats()["near_hits"]
    while layer.stats()["near_hits"] < hits + 3:
        load(1)
        assert time.monotonic() < deadline, "never served from the near cache"
        time.sleep(0.005)


serve_from_copy()
parent_member = layer._backend.tracker.member  # type: ignore[union-attr]
reader, writer = os.pipe()
child = os.fork()
if child == 0:
    os.close(reader)
    findings = {
        "copy_after_fork": layer._near.get(load.key(1), load._spec.codec, False) is not MISSING,  # type: ignore[union-attr]
        "own_member": layer._backend.tracker.member != parent_member,  # type: ignore[union-attr]
    }
    serve_from_copy()  # its own tracker, started by its first call
    os.write(writer, b"ready\n")
    time.sleep(0.5)  # the parent invalidates meanwhile
    findings["after_invalidation"] = load(1)
    findings["near_invalidations"] = layer.stats()["near_invalidations"]
    print(json.dumps(findings), flush=True)
    layer.close()
    os._exit(0)
os.close(writer)
with os.fdopen(reader) as lines:
    assert lines.readline().strip() == "ready"
database.set("db:fork", 2)
load.invalidate(1)
os.waitpid(child, 0)
layer.close()
