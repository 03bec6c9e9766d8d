"""The web app's stampede metrics during a Locust run, as a dashboard would show them:
``MetricsSampler`` scrapes its ``/metrics`` (Prometheus text) every second in a thread;
``plot_metrics`` draws rates, the p99 wait and the waits under way per second to a PNG.
Used by run_locust.py (``metrics.png`` beside the reports)."""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("stampede_hits_total", "stampede_misses_total", "stampede_loads_total", "stampede_collapsed_total")


class MetricsSampler:
    """Scrapes ``url`` every ``interval`` seconds until ``stop()``; ``samples`` holds,
    per scrape, the seconds since start and the stampede samples summed over labels
    (``le`` kept for the wait histogram's buckets)."""

    def __init__(self, url: str, interval: float = 1.0) -> None:
        self.url = url
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                continue  # the app is busy or gone: a gap in the plot
            sample: dict[str, Any] = {"t": time.monotonic() - self._started, "buckets": {}}
            for family in text_string_to_metric_families(text):
                for point in family.samples:
                    if point.name == "stampede_wait_seconds_bucket":
                        le = float(point.labels["le"])
                        sample["buckets"][le] = sample["buckets"].get(le, 0.0) + point.value
                    elif point.name.startswith("stampede_"):
                        sample[point.name] = sample.get(point.name, 0.0) + point.value
            self.samples.append(sample)

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


def _p99(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The p99 of the waits that ended between two scrapes, from their buckets (the upper
    bound of the bucket holding it, as histogram_quantile would approach it)."""
    bounds = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in bounds]
    if not counts or counts[-1] <= 0:
        return None
    target = 0.99 * counts[-1]
    for le, count in zip(bounds, counts, strict=True):
        if count >= target:
            return le
    return None


def plot_metrics(samples: list[dict[str, Any]], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(itertools.pairwise(samples))
    times = [after["t"] for _, after in pairs]
    figure, (rates, waits, running) = plt.subplots(3, 1, figsize=(10, 8), dpi=110, sharex=True)
    labels = {
        "stampede_hits_total": "hits/s",
        "stampede_misses_total": "misses/s",
        "stampede_loads_total": "loads/s",
        "stampede_collapsed_total": "collapsed/s (waited for another caller's load)",
    }
    for name, label in labels.items():
        per_second = [
            (after.get(name, 0.0) - before.get(name, 0.0)) / (after["t"] - before["t"]) for before, after in pairs
        ]
        rates.plot(times, per_second, label=label, linewidth=1.4)
    rates.set_yscale("symlog", linthresh=10)
    rates.set_ylabel("per second")
    rates.legend(fontsize=8, loc="upper right")
    p99 = [_p99(before["buckets"], after["buckets"]) for before, after in pairs]
    waits.step(times, [None if value is None else value * 1000 for value in p99], where="post", color="tab:purple")
    waits.set_ylabel("p99 wait, ms\n(bucket bound)")
    waits.set_yscale("log")
    running.plot(times, [after.get("stampede_waits_in_progress", 0.0) for _, after in pairs], color="tab:green")
    running.set_ylabel("waits under way\n(at each scrape)")
    running.set_xlabel("seconds since the run started")
    for axes in (rates, waits, running):
        axes.grid(alpha=0.3)
    rates.set_title(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
