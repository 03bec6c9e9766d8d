"""A warm hit's cost in instructions, which a shared machine's noise does not move:
the client process's instructions per call of stampede's hit and of a bare redis-py
GET + orjson.loads, counted by valgrind's callgrind.

    python loadtest/count_instructions.py            # starts a throwaway server on 127.0.0.1
    python loadtest/count_instructions.py --quick    # fewer calls (CI)

Each workload runs in a process of its own under callgrind twice, with ``--calls`` and
with three times as many; the difference over the extra calls is the cost of one, with
the process's start, imports and warm-up cancelled out. Only the client's instructions
count (the server is another process, and the kernel's work is not seen), so this says
how much more work stampede's own code adds to a hit, not how long the hit takes: the
round trip, which this leaves out, is most of that (``bench_hit_path.py``). The hash
seed is fixed so that two runs count alike. Needs ``valgrind`` on the PATH; the last line
printed is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import orjson
import redis

from stampede import Stampede
from stampede.testing import server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}
WORKLOADS = ("bare", "stampede")


def workload(url: str, name: str, calls: int) -> None:
    """Run ``calls`` warm hits of one kind (in the process callgrind watches)."""
    bare = redis.Redis.from_url(url, socket_timeout=5)
    bare.set("count:raw", orjson.dumps(VALUE))
    with Stampede.from_url(url, namespace="count") as layer:

        @layer.cached_loader("item:{item_id}", ttl=3600)
        def load(item_id: int) -> dict[str, object]:
            return VALUE

        for _ in range(200):  # warm: the key written, both paths' code specialized
            load(42)
            orjson.loads(bare.get("count:raw"))  # type: ignore[arg-type]
        if name == "bare":
            for _ in range(calls):
                orjson.loads(bare.get("count:raw"))  # type: ignore[arg-type]
        else:
            for _ in range(calls):
                load(42)
    bare.close()


def instructions(url: str, name: str, calls: int) -> int:
    """All the instructions callgrind counted in a process running ``workload``."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--workload", name, "--calls", str(calls), "--redis", url],
        capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"), check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found, done.stderr[-2000:]
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="fewer calls (CI)")
    parser.add_argument("--workload", choices=WORKLOADS, help=argparse.SUPPRESS)  # the counted process
    options = parser.parse_args()
    if options.workload:
        workload(options.redis, options.workload, options.calls)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on the PATH (Debian: apt-get install valgrind)")
    if options.quick:
        options.calls = 100
    per_call = {}
    with server_url(options.redis) as url:
        for name in WORKLOADS:
            fewer = instructions(url, name, options.calls)
            more = instructions(url, name, 3 * options.calls)
            per_call[name] = (more - fewer) // (2 * options.calls)
    extra = per_call["stampede"] - per_call["bare"]
    print(f"\nA warm hit, client-side instructions per call (callgrind, {options.calls} and {3 * options.calls} calls)")
    print(f"   bare GET + orjson.loads   {per_call['bare']:>9,}")
    print(f"   stampede cached_loader    {per_call['stampede']:>9,}")
    print(f"   stampede's own            {extra:>+9,} ({extra / per_call['bare']:+.1%})")
    print(json.dumps({"instructions": per_call, "own": extra}))


if __name__ == "__main__":
    main()
