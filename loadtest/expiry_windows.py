"""Reading the database's query log: how many queries each key cost per expiry window,
and the plot of queries per second over time.

A window opens with a query of a key and lasts until the value that query produced
could first expire: the query's finish plus ttl x (1 - jitter), the shortest TTL the
cache may give it. (The value is written after the query finishes, so it lives at
least that long.) Any other query of the same key that starts inside the window ran
while a valid value or an in-flight load existed: the database was hit twice for one
expiry. With protection on that must never happen; with it off, every caller that
missed at the same moment lands in the same window.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

CLOCK_SLACK = 0.010  # seconds: millisecond TTLs and two clocks (Redis's and ours) reading one time


class LoggedQuery(Protocol):
    @property
    def started(self) -> float: ...
    @property
    def finished(self) -> float: ...
    @property
    def what(self) -> str: ...


@dataclass
class Window:
    what: str
    opened: float
    closes: float
    queries: int = 1
    logged: list[Any] = field(default_factory=list)  # the queries that started in it


def expiry_windows(queries: Iterable[LoggedQuery], min_ttl: float) -> list[Window]:
    """The windows of every key, each with the number of queries that started in it."""
    by_key: dict[str, list[LoggedQuery]] = {}
    for query in queries:
        by_key.setdefault(query.what, []).append(query)
    windows: list[Window] = []
    for what, logged in by_key.items():
        current: Window | None = None
        for query in sorted(logged, key=lambda query: query.started):
            if current is not None and query.started < current.closes - CLOCK_SLACK:
                current.queries += 1
                current.logged.append(query)
                continue
            current = Window(what, query.started, query.finished + min_ttl, logged=[query])
            windows.append(current)
    return windows


def summarize(windows: list[Window]) -> dict[str, Any]:
    """The figures of one run: per window, how many queries; which windows broke the rule."""
    counts = [window.queries for window in windows]
    per_key: dict[str, int] = {}
    for window in windows:
        per_key[window.what] = per_key.get(window.what, 0) + window.queries
    broken = sorted((window for window in windows if window.queries > 1), key=lambda window: -window.queries)
    return {
        "keys": len({window.what for window in windows}),
        "windows": len(windows),
        "queries": sum(counts),
        "max_queries_per_window": max(counts, default=0),
        "mean_queries_per_window": round(statistics.fmean(counts), 2) if counts else 0.0,
        "windows_with_more_than_one_query": len(broken),
        "worst_windows": [{"key": window.what, "queries": window.queries} for window in broken[:5]],
        "queries_by_key": dict(sorted(per_key.items(), key=lambda item: -item[1])),
    }


def explain(windows: list[Window], since: float) -> list[str]:
    """For each window with more than one query, each of its queries: when it started
    and finished (seconds after ``since``), which process made it, and what that process
    noted when it began (the cache's state, its counters: ``ShopDatabase.note``)."""
    lines = []
    for window in windows:
        if window.queries < 2:
            continue
        lines.append(f"{window.what}: {window.queries} queries in the window {window.opened - since:.3f} .. "
                     f"{window.closes - since:.3f} s")  # fmt: skip
        for query in window.logged:
            note = getattr(query, "note", "") or "no note"
            lines.append(f"  {query.started - since:8.3f} .. {query.finished - since:8.3f} s  pid {query.pid}  {note}")
    return lines


def queries_per_second(queries: Iterable[LoggedQuery], since: float) -> list[int]:
    """Queries started in each whole second after ``since``."""
    seconds: list[int] = []
    for query in queries:
        second = int(query.started - since)
        if second < 0:
            continue
        seconds.extend([0] * (second + 1 - len(seconds)))
        seconds[second] += 1
    return seconds


def plot(series: dict[str, list[int]], ttl: float, path: str) -> None:
    """One PNG: database queries per second over time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4.5), dpi=110)
    colours = {"off": "tab:red", "on": "tab:blue"}
    for name, per_second in series.items():
        total = sum(per_second)
        axes.plot(range(len(per_second)), per_second, label=f"protection {name}: {total} queries",
                  color=colours.get(name), linewidth=1.6)  # fmt: skip
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("database queries per second")
    axes.set_title(f"Database load under the same Locust run, TTL {ttl:g} s")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
