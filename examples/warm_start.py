"""A warm start: record which products are asked most, then, after the cache went cold,
load them before traffic finds them missing (``hot_sample``, ``Stampede.warm``).

    python examples/warm_start.py                                  # embedded backend
    python examples/warm_start.py --redis redis://127.0.0.1:6379/0

1. Traffic: ``--calls`` reads of ``--products`` products, drawn from a Zipf law (a few
   products asked again and again), from 4 threads. One call in ten (``--sample``) is
   recorded in the loader's hot set, in the store (``hot_sample=0.1``).
2. The hot set is exported to a JSON file, and the cache restarts empty: the layer is
   closed and a new one opened, in a new namespace (on the embedded backend, a new
   store: what a restart, a flush or a bumped namespace leaves, hot set and all).
3. The new layer imports the hot set, and a warm start loads the ``--warm`` hottest
   products, 8 at a time within a load budget of 4, with a progress bar.
4. Traffic again: the misses of its first calls, against a second cold start without
   warming. It exits non-zero unless the warm start took most of them away.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from stampede import Stampede, WarmReport


def zipf_keys(products: int, calls: int, seed: int) -> list[int]:
    """``calls`` product ids, the k-th most asked about 1/k as often as the first."""
    draw = random.Random(seed)
    weights = [1 / rank for rank in range(1, products + 1)]
    return draw.choices(range(products), weights=weights, k=calls)


def traffic(load: Any, keys: list[int], threads: int = 4) -> None:
    parts = [keys[index::threads] for index in range(threads)]
    workers = [threading.Thread(target=lambda part=part: [load(key) for key in part]) for part in parts]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def progress_bar(report: WarmReport) -> None:
    """Redrawn in a terminal; elsewhere (a log, a pipe) printed at each quarter."""
    width, done, calls = 40, report.done, max(report.calls, 1)
    if sys.stdout.isatty():
        filled = width * done // calls
        print(f"\r   warming [{'#' * filled}{'.' * (width - filled)}] {done}/{report.calls}", end="", flush=True)
    elif done * 4 // calls != (done - 1) * 4 // calls:
        print(f"   warming: {done}/{report.calls}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis or postgresql:// URL; default: the embedded backend")
    parser.add_argument("--products", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--warm", type=int, default=500, help="how many of the hottest products to warm")
    parser.add_argument("--sample", type=float, default=0.1, help="hot_sample: the fraction of calls recorded")
    parser.add_argument("--after", type=int, default=2000, help="calls of traffic measured after each start")
    options = parser.parse_args()

    queries = [0]
    lock = threading.Lock()

    def start() -> tuple[Stampede, Any]:
        """A layer in a namespace of its own, and its product loader."""
        layer = Stampede.from_url(options.redis or "memory://", namespace=f"warm-example-{random.randrange(1 << 30)}")

        @layer.cached_loader("product:{product_id}", hot_sample=options.sample, max_concurrent_loads=4)
        def product(product_id: int) -> dict[str, Any]:
            with lock:
                queries[0] += 1
            time.sleep(0.002)  # the query
            return {"id": product_id, "name": f"product {product_id}"}

        return layer, product

    def misses_of(load: Any, keys: list[int]) -> int:
        before = queries[0]
        traffic(load, keys)
        return queries[0] - before

    layer, product = start()
    try:
        print(f"1. traffic: {options.calls} Zipf reads of {options.products} products")
        traffic(product, zipf_keys(options.products, options.calls, seed=1))
        print(f"   {layer.flush_hot_sets()} sampled calls added to the hot set")
        with tempfile.TemporaryDirectory() as folder:
            saved = Path(folder) / "hot-sets.json"
            saved.write_text(json.dumps(layer.export_hot_sets(product)))
            layer.close()
            layer, product = start()
            print(f"2. the hot set saved to a file ({saved.stat().st_size} bytes); the cache restarted empty")
            imported = layer.import_hot_sets(json.loads(saved.read_text()), product)
        print(f"3. {imported} hot calls imported; a warm start of the {options.warm} hottest products")
        report = layer.warm(product, count=options.warm, on_progress=progress_bar)
        if sys.stdout.isatty():
            print()  # after the bar
        print(
            f"   {report.loaded} loaded, {report.cached} already cached, {report.failed} failed "
            f"in {report.seconds:.2f} s"
        )
        after = zipf_keys(options.products, options.after, seed=2)
        warmed = misses_of(product, after)
        for product_id in range(options.products):  # cold again, without warming
            product.invalidate(product_id)
        cold = misses_of(product, after)
        print(f"4. the first {options.after} calls after the start: {warmed} misses warmed, {cold} cold")
        if report.loaded == 0 or report.failed or warmed * 2 > cold:
            print("FAILED: the warm start did not take most of the misses away")
            sys.exit(1)
        print("OK")
    finally:
        layer.close()


if __name__ == "__main__":
    main()
