"""The charts of ``astream bench compare`` (matplotlib, the ``plot`` extra): throughput per
configuration per library, simulated accelerators kept at 90 % utilisation, and the cold
epoch against the transfer floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astream.cli._harness.compare import Row

__all__ = ["draw"]

COLORS = {"astream": "#1f77b4", "mosaicml": "#ff7f0e", "litdata": "#2ca02c", "hf": "#d62728",
          "webdataset": "#9467bd", "floor": "#7f7f7f"}


def _bars(plt: Any, rows: list[Row], title: str, xlabel: str, path: Path, floor: bool, log: bool) -> None:
    sides = sorted({s for r in rows for s, v in r.values.items() if v}, key=lambda s: (s != "astream", s))
    if floor and any(r.floor for r in rows):
        sides.append("floor")
    height = 0.8 / max(1, len(sides))
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.45 * len(rows) * max(1, len(sides)) ** 0.5 * 1.4))
    for i, side in enumerate(sides):
        values = [(r.floor if side == "floor" else r.values.get(side)) or 0 for r in rows]
        ys = [k + i * height for k in range(len(rows))]
        ax.barh(ys, values, height=height, label=side, color=COLORS.get(side))
        for y, v in zip(ys, values, strict=True):
            if v:
                ax.text(v, y, f" {v:,.0f}" if v >= 100 else f" {v:.3g}", va="center", fontsize=7)
    ax.set_yticks([k + height * (len(sides) - 1) / 2 for k in range(len(rows))])
    ax.set_yticklabels([r.what for r in rows], fontsize=8)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(rows: list[Row], out: Path) -> list[Path]:
    """Write the charts whose rows there are into ``out``; the paths written.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    charts = (("throughput", "Throughput per configuration (higher is better)", "samples (rows) per second",
               True, True),
              ("cold", "Cold epoch over loopback against the transfer floor (lower is better)", "seconds", True, False),
              ("accelerators", "Simulated accelerators kept >= 90 % busy (higher is better)", "accelerators",
               False, False))
    for name, title, xlabel, floor, log in charts:
        chosen = [r for r in rows if r.chart == name and any(r.values.values())]
        if chosen:
            path = out / f"{name}.png"
            _bars(plt, chosen, title, xlabel, path, floor, log)
            written.append(path)
    return written
