"""A worker process for the many-key tests: threads asking a many-key loader for pages.

Prints "ready" once its layer is connected, waits for "go" on stdin, then each thread
asks for its pages (ids drawn with --seed from --ids ids, --page-size a page); prints one
JSON line with what it saw. The loader counts each id it is asked for on the server
(INCR asked:<id>), so the count spans every process.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import Any

import redis

from stampede import Stampede


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pages", type=int, default=4, help="pages per thread")
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--ids", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.05)
    options = parser.parse_args()

    counter = redis.Redis.from_url(options.url, socket_timeout=5)
    layer = Stampede.from_url(options.url, namespace="many")

    @layer.cached_loader_many("product:{product_id}")
    def products(product_ids: list[int]) -> dict[int, dict[str, Any]]:
        pipeline = counter.pipeline(transaction=False)
        for product_id in product_ids:
            pipeline.incr(f"asked:{product_id}")
        pipeline.incr("queries")
        pipeline.execute()
        time.sleep(options.delay)
        return {product_id: {"id": product_id} for product_id in product_ids}

    draw = random.Random(options.seed)
    pages = [
        [draw.sample(range(options.ids), options.page_size) for _ in range(options.pages)]
        for _ in range(options.threads)
    ]
    layer._runner.store.get("warm-up")  # type: ignore[union-attr]  # open a connection
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    wrong: list[Any] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        for page in pages[index]:
            found = products(page)
            if list(found) != page or any(found[id_] != {"id": id_} for id_ in page):
                with lock:
                    wrong.append(page)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"wrong": wrong, "stats": layer.stats()}), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
