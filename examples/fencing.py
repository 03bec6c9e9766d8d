"""A named lock with fencing tokens: a paused ex-holder's late write is refused.

    python examples/fencing.py                              # embedded backend
    python examples/fencing.py --redis redis://127.0.0.1:6379/0
    python examples/fencing.py --redis postgresql://app@127.0.0.1/app   # fences from a sequence

A lock's lease can run out while its holder is paused (a GC pause, a VM migration, a
SIGSTOP) and cannot renew it; another process then takes the lock, and when the first
one wakes it does not know. No lock can prevent what it does next, so the resource it
writes to must: every acquisition of ``layer.lock(name)`` returns a fencing token
(``lock.fence``), greater than that of any acquisition before it, and the resource keeps
the greatest token it has seen and refuses writes that carry a smaller one.

    t=0    A takes the lock: fence f; then pauses (here: renew=False and a sleep)
    t=0.3  A's lease runs out; B takes the lock: fence g > f, writes "B" with fence g
    t=0.5  A wakes and writes "A" with fence f: refused, f < g

(Fences are drawn from the server's clock in microseconds as well as a counter, so they
are large numbers that keep growing even if the counter is deleted.)

It prints each step and exits non-zero if the late write got through.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from stampede import Stampede


class FencedStore:
    """A resource that checks fencing tokens: it remembers the greatest it has accepted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value: str | None = None
        self.greatest_fence = 0

    def write(self, value: str, fence: int) -> bool:
        with self._lock:
            if fence < self.greatest_fence:
                return False  # a holder older than one we have heard from
            self.greatest_fence, self.value = fence, value
            return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis or postgresql:// URL; default: the embedded backend")
    options = parser.parse_args()
    layer = Stampede.from_url(options.redis, namespace="fencing") if options.redis else Stampede(namespace="fencing")
    store = FencedStore()
    with layer:
        paused = layer.lock("nightly-report", ttl=0.3, renew=False)  # renew=False plays the pause
        assert paused.acquire()
        assert paused.fence is not None
        print(f"A holds the lock with fence {paused.fence}, and pauses")
        while paused.locked():  # A's lease runs out while it is paused
            time.sleep(0.01)
        with layer.lock("nightly-report", timeout=5) as current:
            assert current.fence is not None
            accepted = store.write("B", current.fence)
            print(f"B holds the lock with fence {current.fence}; its write accepted: {accepted}")
        late = store.write("A", paused.fence)
        print(f"A wakes and writes with fence {paused.fence}: accepted: {late}; the store holds {store.value!r}")
    if late or store.value != "B":
        print("FAILED: the paused ex-holder's write got through")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
