"""Bar charts of the benchmarks' figures, beside a peer's measured in the same run
(``--plot PATH`` on bench_freshness.py, bench_many.py and bench_http.py).

A figure is one or more panels side by side, each a horizontal bar per row (stampede's
rows blue, a peer's or a baseline's orange), with one or two series per row (e.g. p50
and p99). matplotlib is imported only when a plot is asked for (the ``loadtest`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Panel:
    """One panel: a bar group per name in ``rows``; ``series`` is (label, a value per row)
    for each series, drawn as bars of one row side by side (the first faint when there
    are two)."""

    rows: Sequence[str]
    xlabel: str
    series: Sequence[tuple[str, Sequence[float]]]
    log: bool = False
    notes: Sequence[str] = field(default_factory=list)
    """A text per row written at its bar's end ('' for none)."""


def peer_colour(name: str) -> str:
    """Orange for a peer or a baseline, blue for stampede."""
    return "tab:blue" if name.startswith("stampede") else "tab:orange"


def draw(path: str, title: str, panels: Sequence[Panel]) -> None:
    """Draw ``panels`` side by side into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    most = max(len(panel.rows) for panel in panels)
    figure, axes_row = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 0.55 * most + 2.2), dpi=110)
    axes_all = [axes_row] if len(panels) == 1 else list(axes_row)
    for index, (axes, panel) in enumerate(zip(axes_all, panels, strict=True)):
        rows = list(panel.rows)
        positions = list(range(len(rows)))
        colours = [peer_colour(name) for name in rows]
        shared = index > 0 and rows == list(panels[index - 1].rows)  # its names are the left panel's
        count = len(panel.series)
        height = 0.8 / count
        for number, (label, values) in enumerate(panel.series):
            offset = (count - 1) / 2 * height - number * height
            alpha = 0.5 if count > 1 and number == 0 else 1.0
            bars = axes.barh([p - offset for p in positions], list(values), height=height, color=colours,
                             alpha=alpha, label=label if count > 1 else None)  # fmt: skip
            if panel.notes and number == count - 1:
                axes.bar_label(bars, labels=list(panel.notes), padding=3, fontsize=8)
        if count > 1:
            axes.legend(loc="lower right")
        if panel.log:
            axes.set_xscale("log")
        axes.set_xlabel(panel.xlabel)
        axes.set_yticks(positions, [""] * len(rows) if shared else rows)
        axes.invert_yaxis()
        axes.grid(axis="x", alpha=0.3)
        axes.margins(x=0.15)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
