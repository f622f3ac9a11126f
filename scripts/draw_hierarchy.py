"""Draw the hierarchical reduction server (docs/images/collective-hierarchy.png).

    .venv/bin/python scripts/draw_hierarchy.py [out.png]

Two nodes of four ranks. Inside each node the ranks reduce-scatter over shared
memory (a ring), so local rank i holds its node's sum of slot i; across nodes
only the ranks of one local index (a rail) talk, each reducing one shard of its
slot; then the same steps run backwards (all-gather). Drawn with matplotlib.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "collective-hierarchy.png"
RANKS = 4
INTRA, INTER, NODE = "#4c72b0", "#dd8452", "#eef2f8"


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=120)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6)
    ax.axis("off")
    pos = {}
    for k, (x0, name) in enumerate(((0.4, "node A"), (6.6, "node B"))):
        ax.add_patch(FancyBboxPatch((x0, 0.7), 3.0, 4.5, boxstyle="round,pad=0.05", fc=NODE, ec="#8a94a6"))
        ax.text(x0 + 1.5, 5.45, f"{name}: shared memory", ha="center", fontsize=11, weight="bold")
        x = x0 + (2.1 if k == 0 else 0.9)  # the ranks face the other node
        for i in range(RANKS):
            pos[(k, i)] = (x, 4.6 - 1.1 * i)
            ax.add_patch(plt.Circle(pos[(k, i)], 0.4, fc="white", ec=INTRA, lw=2))
            ax.text(*pos[(k, i)], f"rank {k * RANKS + i}\nslot {i}", ha="center", va="center", fontsize=8)
        bend = 0.5 if k == 0 else -0.5  # the ring bulges away from the rails
        for i in range(RANKS):
            _arrow(ax, pos[(k, i)], pos[(k, (i + 1) % RANKS)], INTRA, bend if i < RANKS - 1 else -bend * 0.6)
    for i in range(RANKS):
        _arrow(ax, pos[(0, i)], pos[(1, i)], INTER, 0.0, both=True)
        ax.text(5.0, 4.68 - 1.1 * i, f"rail {i}", ha="center", fontsize=8, color=INTER)
    ax.text(5.0, 0.25, "steps: 1 reduce-scatter in each node (ring)   2 reduce-scatter on each rail "
            "(between nodes)\n3 all-gather on each rail   4 all-gather in each node; slices pipeline "
            "through the four", ha="center", fontsize=8.5)
    ax.plot([], [], color=INTRA, lw=2, label="within a node: shared-memory links")
    ax.plot([], [], color=INTER, lw=2, label="between nodes: one rail per local rank (TCP / NIC)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 1.02), ncol=2, fontsize=8.5, frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def _arrow(ax: object, a: tuple[float, float], b: tuple[float, float], color: str, bend: float,
           both: bool = False) -> None:
    ax.add_patch(FancyArrowPatch(a, b, connectionstyle=f"arc3,rad={bend}",  # type: ignore[attr-defined]
                                 arrowstyle="<|-|>" if both else "-|>", mutation_scale=12,
                                 color=color, lw=1.6, shrinkA=16, shrinkB=16))


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
