"""A worker process for the streamed-load tests: threads iterating one streamed loader.

Prints "ready" once its layer is connected, waits for "go" on stdin, then each of its
--threads threads streams the key; prints one JSON line with what each received. The
generator counts its runs on the server (INCR), so the count spans every process, and
yields --chunks chunks, --pause seconds apart, each naming its run. With --hang the
generator prints "streaming" after its first chunk and never goes on (the leader to be
killed).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import redis
from worker import say  # tests/, this script's folder, is first on its path

from stampede import Stampede, StreamInterrupted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", default="prompt")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.005)
    parser.add_argument("--lock-ttl", type=float, default=10.0)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()

    counter = redis.Redis.from_url(args.url)
    layer = Stampede.from_url(args.url, namespace="streams", lock_ttl=args.lock_ttl)

    @layer.cached_stream("completion:{prompt}")
    def complete(prompt: str) -> Any:
        run = counter.incr(f"runs:{prompt}")
        for index in range(args.chunks):
            yield f"{run}:{index}"
            if args.hang:
                say("streaming")
                threading.Event().wait()
            time.sleep(args.pause)

    layer.check()
    say("ready")
    sys.stdin.readline()
    received: list[Any] = [None] * args.threads

    def stream(slot: int) -> None:
        try:
            received[slot] = list(complete(args.key))
        except StreamInterrupted as error:
            received[slot] = {"interrupted": str(error), "received": error.received}

    threads = [threading.Thread(target=stream, args=(slot,)) for slot in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    say(json.dumps({"received": received, "stats": layer.stats()}))
    layer.close()


if __name__ == "__main__":
    main()
