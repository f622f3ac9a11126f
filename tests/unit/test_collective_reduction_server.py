"""The reduction-server allreduce on regular, uneven and interleaved node layouts.

Supported: any layout ``node_of`` describes. Regular layouts (every node the
same size) map slot i to local rank i (Fairring's rails); uneven ones give the
ranks of smaller nodes several slots; nodes need not be contiguous in rank order.
"""

from __future__ import annotations

import numpy as np
import pytest

from cgraph.comm.algorithms.reduction_server import Layout, pipeline_order
from cgraph.comm.teams import Team
from tests.unit.test_collective_allreduce import DTYPES, OPS, Case, run_cases

pytestmark = pytest.mark.slow  # left out of `make test-fast`

LAYOUTS = {
    "1 node x 4": (0, 0, 0, 0),
    "2 nodes x 2": (0, 0, 1, 1),
    "4 nodes x 2": (0, 0, 1, 1, 2, 2, 3, 3),
    "2 nodes x 4": (0, 0, 0, 0, 1, 1, 1, 1),
    "4 nodes x 4": tuple(r // 4 for r in range(16)),
    "3 nodes x 4": tuple(r // 4 for r in range(12)),
    "6 nodes x 1": (0, 1, 2, 3, 4, 5),
    "uneven 3+1": (0, 0, 0, 1),
    "uneven 1+2+4": (0, 1, 1, 2, 2, 2, 2),
    "uneven 4+4+1": (0, 0, 0, 0, 1, 1, 1, 1, 2),
    "interleaved 2 nodes": (0, 1, 0, 1, 0, 1),
    "interleaved uneven": ("b", "a", "b", "c", "a", "b", "b"),
}

CASES = [
    Case(n, op, dt, seed=i)
    for i, (n, op, dt) in enumerate(
        (n, op, dt) for n in (0, 1, 5, 17, 1000) for op in OPS for dt in DTYPES
    )
    if (i % 3 == 0 or n == 1000)
]


@pytest.mark.parametrize("rendezvous", [False, True], ids=["buffered", "rendezvous"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts(layout: str, rendezvous: bool) -> None:
    nodes = LAYOUTS[layout]
    run_cases(
        "reduction_server",
        len(nodes),
        CASES,
        rendezvous=rendezvous,
        node_of=nodes,
        slice_bytes=512,
        depth=3,
    )


@pytest.mark.parametrize("depth", [1, 2, 4, 9])
def test_depths(depth: int) -> None:
    cases = [Case(1000, op, np.float64) for op in OPS]
    run_cases(
        "reduction_server",
        8,
        cases,
        rendezvous=True,
        node_of=LAYOUTS["4 nodes x 2"],
        slice_bytes=256,
        depth=depth,
    )


def test_regular_layout_uses_rails() -> None:
    layout = Layout.of(LAYOUTS["4 nodes x 2"])
    assert layout.slots == 2
    assert [layout.rail(s) for s in range(2)] == [Team((0, 2, 4, 6)), Team((1, 3, 5, 7))]


def test_uneven_layout_spreads_slots_over_the_small_node() -> None:
    layout = Layout.of(LAYOUTS["uneven 1+2+4"])  # nodes (0) (1 2) (3 4 5 6)
    assert layout.slots == 4
    assert [layout.rail(s) for s in range(4)] == [
        Team((0, 1, 3)),
        Team((0, 1, 4)),
        Team((0, 2, 5)),
        Team((0, 2, 6)),
    ]
    assert layout.regions(layout.nodes[1], ((0, 3), (3, 6), (6, 8), (8, 10))) == ((0, 6), (6, 10))


def test_pipeline_order() -> None:
    assert pipeline_order(3, 2, 1) == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))
    assert pipeline_order(3, 3, 3) == (
        (0, 0),
        (1, 0),
        (0, 1),
        (2, 0),
        (1, 1),
        (0, 2),
        (2, 1),
        (1, 2),
        (2, 2),
    )
    assert pipeline_order(0, 4, 2) == ()


@pytest.mark.parametrize("slices,stages,depth", [(5, 4, 1), (5, 4, 2), (7, 4, 3), (3, 4, 8)])
def test_pipeline_order_invariants(slices: int, stages: int, depth: int) -> None:
    order = pipeline_order(slices, stages, depth)
    assert sorted(order) == sorted((k, i) for k in range(stages) for i in range(slices))
    for i in range(slices):  # each slice's stages in order
        assert [k for k, j in order if j == i] == list(range(stages))
    in_flight = 0
    for k, _ in order:  # a slice is in flight from its first to its last stage
        in_flight += (k == 0) - (k == stages - 1)
        assert in_flight <= depth
