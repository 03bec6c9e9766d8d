"""A worker process for the multiprocess Prometheus test: PROMETHEUS_MULTIPROC_DIR is set
in its environment (so prometheus-client writes its metrics to files there, as in a
gunicorn worker); ``--threads`` threads call one cold key at once. The loader, in
whichever process leads, blocks until the parent pushes to ``--release`` (the parent does
when the scraped gauge shows every other caller waiting). Prints the layer's stats as
JSON and marks itself dead for the livesum gauges, as a gunicorn child_exit hook would."""

from __future__ import annotations

import argparse
import json
import os
import threading

import redis
from prometheus_client import multiprocess

from stampede import Stampede
from stampede.prometheus import PrometheusMetrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--release", required=True)
    options = parser.parse_args()

    control = redis.Redis.from_url(options.url, socket_timeout=30)
    layer = Stampede.from_url(options.url, namespace=options.namespace, observers=[PrometheusMetrics()])

    @layer.cached_loader("category-map:{shop}", lock_ttl=30, wait_timeout=30)
    def load(shop: str) -> dict[str, str]:
        assert control.blpop([options.release], timeout=20) is not None, "never released"
        return {"shop": shop}

    barrier = threading.Barrier(options.threads)
    results: list[object] = []

    def call() -> None:
        barrier.wait()
        results.append(load("s1"))

    threads = [threading.Thread(target=call) for _ in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [{"shop": "s1"}] * options.threads, results
    layer.close()
    control.close()
    multiprocess.mark_process_dead(os.getpid())
    print(json.dumps(layer.stats()), flush=True)


if __name__ == "__main__":
    main()
