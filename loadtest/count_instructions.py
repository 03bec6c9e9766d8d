"""A warm hit's cost in instructions, which a shared machine's noise does not move:
the client process's instructions per call of stampede's hit and of a bare redis-py
GET + orjson.loads, of a warm page of 50 ids (``cached_loader_many``) and a bare
MGET + 50 orjson.loads, and of a cold page of 50 ids never asked before against
cache-aside with no protection (a bare MGET that finds none, the loader, 50 SETs in one
pipeline), counted by valgrind's callgrind. A cold page's figure is per entry: what
each cold id costs the client in a many-key load (its lease, its load's share, its
write), which is what queues up on the cores when many callers miss at once
(``bench_many.py``'s cold pages).

    python loadtest/count_instructions.py            # starts a throwaway server on 127.0.0.1
    python loadtest/count_instructions.py --quick    # fewer calls (CI)

Each workload runs under callgrind, warmed up, then ``--calls`` calls, then three times
as many, each run counted apart (callgrind dumps its counts each time the process calls
``getpgrp``, which it calls only there); the difference over the extra calls is the cost
of one, with the process's start, imports and warm-up left out and what a run costs
besides its calls cancelled out. The bare workloads run one after another in one
process, stampede's in another (Python's start under callgrind, a quarter of a minute,
is paid twice, not once a workload), side by side; the fewest of ``--repeats`` counts
of each is taken. Only the client's instructions count, on the calling thread (the server
is another process, the layer's idle threads are left out, and the kernel's work is not
seen), so this says how much more work stampede's own code adds to a hit, not how long
the hit takes: the round trip, which this leaves out, is most of that
(``bench_hit_path.py``, ``bench_many.py``). The hash seed is fixed and the garbage collector off while the
calls run (a collection's cost would land on whichever count triggered it), so that two
runs count alike; compare figures counted with the same ``--calls``. Needs ``valgrind``
on the PATH; the last line printed is the figures as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import redis

from stampede import Stampede
from stampede.testing import server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}
WORKLOADS = ("bare", "stampede", "bare page", "stampede page", "bare cold page", "stampede cold page")
PROCESSES = (WORKLOADS[0::2], WORKLOADS[1::2])  # the bare ones in one, stampede's in the other
PAGE = list(range(50))
COLD_TTL_MS = 3_600_000


def calls_of(name: str, calls: int) -> int:
    """The calls of a run of ``name``: a page costs a dozen hits, a cold one a hundred,
    so a tenth and a thirtieth as many pages keep the run short."""
    if name.endswith("cold page"):
        return max(10, calls // 30)
    if name.endswith("page"):
        return max(30, calls // 10)
    return calls


def workload(url: str, name: str, calls: int) -> None:
    """Run ``calls`` warm calls of one kind, then ``3 * calls``, each run between two
    marks (in the process callgrind watches)."""
    bare = redis.Redis.from_url(url, socket_timeout=5)
    bare.set("count:raw", orjson.dumps(VALUE))
    page_keys = [f"count:raw:{id_}" for id_ in PAGE]
    bare.mset({key: orjson.dumps(VALUE) for key in page_keys})
    with Stampede.from_url(url, namespace="count") as layer:

        @layer.cached_loader("item:{item_id}", ttl=3600)
        def load(item_id: int) -> dict[str, object]:
            return VALUE

        @layer.cached_loader_many("item:{item_id}", ttl=3600)
        def load_many(item_ids: list[int]) -> dict[int, dict[str, object]]:
            return dict.fromkeys(item_ids, VALUE)

        def bare_page() -> None:
            for raw in bare.mget(page_keys):
                orjson.loads(raw)  # type: ignore[arg-type]

        # Each call a page of ids never asked, in this process or another counted on the
        # same server: from an offset of its own, every id of 15 digits.
        offset = 10**14 + random.SystemRandom().randrange(8 * 10**14)
        cold_ids = iter(range(offset, offset + 10**13, len(PAGE)))

        def cold_page() -> list[int]:
            start = next(cold_ids)
            return list(range(start, start + len(PAGE)))

        def bare_cold_page() -> None:
            ids = cold_page()
            keys = [f"count:cold:{id_}" for id_ in ids]
            assert not any(bare.mget(keys))
            values = dict.fromkeys(ids, VALUE)  # the loader's answer
            pipeline = bare.pipeline(transaction=False)
            for key, id_ in zip(keys, ids, strict=True):
                pipeline.set(key, orjson.dumps(values[id_]), px=COLD_TTL_MS)
            pipeline.execute()

        run = {
            "bare": lambda: orjson.loads(bare.get("count:raw")),  # type: ignore[arg-type]
            "stampede": lambda: load(42),
            "bare page": bare_page,
            "stampede page": lambda: load_many(PAGE),
            "bare cold page": bare_cold_page,
            "stampede cold page": lambda: load_many(cold_page()),
        }[name]
        for _ in range(30 if name.endswith("cold page") else 200):  # warm: the keys written, the code specialized
            run()
        gc.collect()
        gc.disable()  # a collection costs millions: it would land on one count and not the other
        os.getpgrp()  # the mark: callgrind dumps what came before (the start, imports, warm-up)
        for times in (1, 3):
            for _ in range(times * calls):
                run()
            os.getpgrp()  # and each run's count
        gc.enable()
    bare.close()


def instructions(url: str, names: tuple[str, ...], calls: int) -> dict[str, tuple[int, int]]:
    """The instructions callgrind counted on the main thread of a process running the
    ``workload`` of each of ``names`` in turn, in each one's run of its calls and its run
    of three times as many: the layer's own threads (the watchdog) wake on the clock,
    and under valgrind's slowness that would count as work of the calls."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        workloads = [arg for name in names for arg in ("--workload", name)]
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-before=getpgrp",
             f"--callgrind-out-file={out}",
             sys.executable, __file__, *workloads, "--calls", str(calls), "--redis", url],
            capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"), check=True,
        )  # fmt: skip
        # Three dumps a workload (its warm-up, its two runs), numbered from 1; one more
        # would say something else called getpgrp, and the runs could not be told apart.
        dumps = {path.name for path in Path(folder).glob("callgrind.out.*-01")}
        assert dumps == {f"callgrind.out.{dump}-01" for dump in range(1, 3 * len(names) + 1)}, sorted(dumps)
        return {
            name: (_totals(Path(f"{out}.{3 * at + 2}-01")), _totals(Path(f"{out}.{3 * at + 3}-01")))
            for at, name in enumerate(names)
        }


def _totals(dump: Path) -> int:
    text = dump.read_text()
    found = re.search(r"^totals: (\d+)", text, re.MULTILINE)
    assert found, text[-2000:]
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="counts of each, the fewest taken")
    parser.add_argument("--quick", action="store_true", help="fewer calls and counts (CI)")
    parser.add_argument("--workload", choices=WORKLOADS, action="append", help=argparse.SUPPRESS)  # counted
    options = parser.parse_args()
    if options.workload:
        for name in options.workload:
            workload(options.redis, name, calls_of(name, options.calls))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on the PATH (Debian: apt-get install valgrind)")
    if options.quick:
        options.calls = 300  # fewer lets a one-off in redis-py's first calls show
    per_call = {}
    processes = [names for names in PROCESSES for _ in range(options.repeats)]
    with server_url(options.redis) as url, ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        # Side by side, a core each: callgrind counts instructions, which another process
        # on the machine does not change.
        counted = list(pool.map(lambda names: instructions(url, names, options.calls), processes))
    fewest: dict[str, tuple[int, int]] = {}  # what varies only ever adds instructions
    for counts in counted:
        for name, (once, thrice) in counts.items():
            least = fewest.get(name, (once, thrice))
            fewest[name] = (min(once, least[0]), min(thrice, least[1]))
    for name in WORKLOADS:
        once, thrice = fewest[name]
        per_call[name] = (thrice - once) // (2 * calls_of(name, options.calls))
    extra = per_call["stampede"] - per_call["bare"]
    extra_page = per_call["stampede page"] - per_call["bare page"]
    bare_entry = per_call["bare cold page"] // len(PAGE)
    cold_entry = per_call["stampede cold page"] // len(PAGE)
    print(f"\nA warm hit, client-side instructions per call (callgrind, {options.calls} and {3 * options.calls} calls)")
    print(f"   bare GET + orjson.loads   {per_call['bare']:>9,}")
    print(f"   stampede cached_loader    {per_call['stampede']:>9,}")
    print(f"   stampede's own            {extra:>+9,} ({extra / per_call['bare']:+.1%})")
    print(f"A warm page of {len(PAGE)} ids, the same (a tenth as many calls)")
    print(f"   bare MGET + orjson.loads  {per_call['bare page']:>9,}")
    print(f"   cached_loader_many        {per_call['stampede page']:>9,}")
    print(f"   stampede's own            {extra_page:>+9,} ({extra_page / per_call['bare page']:+.1%})")
    print(f"A cold page of {len(PAGE)} ids, per entry (a thirtieth as many calls)")
    print(f"   no protection             {bare_entry:>9,}   (MGET, loader, SET)")
    print(f"   cached_loader_many        {cold_entry:>9,}   (MGET, lease, loader, write and release)")
    print(f"   stampede's own            {cold_entry - bare_entry:>+9,} ({cold_entry / bare_entry:.1f}x)")
    print(json.dumps({"instructions": per_call, "own": extra, "own_page": extra_page,
                      "cold_entry": cold_entry, "bare_cold_entry": bare_entry}))  # fmt: skip


if __name__ == "__main__":
    main()
