"""Recorded executions as a Gantt chart (PNG or SVG): one row per thread of each process.

    d (Worker)  loop  |   [C4      ][C5      ][C6      ]
                comm  | [RECV1][RECV2][RECV3]
    a (Worker)  loop  |[C1]
                comm  |    [SEND1]

Compute, comm (SEND, RECV, COLLECTIVE), channel ops (READ, WRITE) and waits get
their own colours; the driver's execute and get are a row too. Only the last
``executions`` recorded executions are drawn, so the bars stay readable, and an
actor's wait for the input before the driver submitted it is left out (idle).
Drawn with matplotlib (Agg, no display needed); see docs/design-notes.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cgraph.visualize.trace import THREADS, Track, recorded_op

COLOURS = {"COMPUTE": "#4c72b0", "COMM": "#dd8452", "CHANNEL": "#8c8c8c", "WAIT": "#e8e8e8", "DRIVER": "#55a868"}
"""Bar colours by what an op is (matplotlib colour strings)."""


def _what(text: str, thread: str) -> str:
    if thread == "driver":
        return "DRIVER"
    if thread == "collective":  # a collective library call inside a method
        return "COMM"
    op = recorded_op(text)
    if op is None:
        return "WAIT"
    return {"COMPUTE": "COMPUTE", "READ": "CHANNEL", "WRITE": "CHANNEL"}.get(op.kind.name, "COMM")


def draw_timeline(tracks: Iterable[Track], path: str | os.PathLike[str], executions: int = 3,
                  title: str = "") -> Path:
    """Write the Gantt chart of ``tracks`` to ``path`` (format from its suffix: .png, .svg, .pdf).

    Raises:
        ValueError: no recorded event to draw.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    rows_in = list(tracks)
    last = sorted({event[2] for _, _, events, _, _ in rows_in for event in events})[-executions:]
    keep = set(last)
    submitted = {event[2]: event[4] for actor, _, events, _, _ in rows_in if actor == "driver"
                 for event in events if event[0] == "execute"}
    bars: list[tuple[str, list[tuple[float, float, str, str]]]] = []
    start: float  # an event's start (ns), then a bar's (s)
    for actor, label, events, offset, _ in rows_in:
        for thread in sorted({e[1] for e in events}, key=THREADS.__getitem__):
            chosen = []
            for text, th, index, s, e, *_ in events:
                if th != thread or index not in keep:
                    continue
                # an actor waiting for the input before the driver submitted it is idle: not drawn
                start = s - offset if actor == "driver" else max(s - offset, submitted.get(index, s - offset))
                chosen.append((start / 1e6, max(e - offset - start, 0) / 1e6, _what(text, th),
                               text.removesuffix("@comm")))
            if chosen:
                bars.append((label if label == thread else f"{label}  {thread}", chosen))
    if not bars:
        raise ValueError("no recorded event to draw: run the graph (compiled with timeline=True) first")
    origin = min(start for _, row in bars for start, *_ in row)
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(bars) + 1.6))
    for y, (_, row) in enumerate(reversed(bars)):
        ax.broken_barh([(start - origin, max(width, 1e-3)) for start, width, _, _ in row], (y - 0.4, 0.8),
                       facecolors=[COLOURS[what] for _, _, what, _ in row], edgecolor="white", linewidth=0.4)
        span = max(start + width for start, width, _, _ in row) - origin
        for start, width, what, text in row:
            if width > 0.06 * span and what != "WAIT":
                ax.text(start - origin + width / 2, y, text.split(".", 1)[-1], ha="center", va="center",
                        fontsize=7, color="white" if what in ("COMPUTE", "COMM") else "black", clip_on=True)
    ax.set_yticks(range(len(bars)), [name for name, _ in reversed(bars)], fontsize=8)
    ax.set_xlabel("ms (driver's clock)")
    ax.set_title(title or f"last {len(last)} recorded executions", fontsize=10)
    ax.legend(handles=[Patch(color=c, label=k.lower()) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 - 0.2 / max(len(bars), 1)), ncol=len(COLOURS), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
