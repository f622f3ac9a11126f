"""Hierarchical (two-level) reduce-scatter and all-gather, their cost rows, and slice_bytes.

Each layout runs every case on one fabric (one thread per rank) and checks, per
case: the hierarchical reduce-scatter's chunk against numpy and against the
ring's (bitwise where the result does not depend on the order: integers, MAX,
and a single node, where hierarchical is the ring); the all-gather exactly;
and the hierarchical reduce-scatter followed by its all-gather, an allreduce,
bitwise equal on every rank.

    layout "2 nodes x 2" = (0, 0, 1, 1)     rails: ranks 0 2 and ranks 1 3
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Hashable, Sequence

import numpy as np
import pytest

from cgraph.comm.algorithms import (
    ALGORITHMS,
    ALLGATHER_ALGORITHMS,
    REDUCESCATTER_ALGORITHMS,
    allgather,
    allreduce,
    reducescatter,
)
from cgraph.comm.algorithms.partition import Bounds, chunk_bounds
from cgraph.comm.tuning import cost_model
from cgraph.comm.tuning.cost_model import (
    CostParams,
    collective_terms,
    predict_collective,
    slice_bytes,
)
from cgraph.comm.types import UFUNC, ReduceOp
from tests.fabric import LocalTransport, run_ranks
from tests.unit.test_collective_allreduce import Case, check, make_input

pytestmark = pytest.mark.slow  # left out of `make test-fast`

LAYOUTS: dict[str, tuple[Hashable, ...]] = {
    "2 nodes x 2": (0, 0, 1, 1),
    "3 nodes x 2": (0, 0, 1, 1, 2, 2),
    "2 nodes x 4": (0, 0, 0, 0, 1, 1, 1, 1),
    "irregular 3+1": (0, 0, 0, 1),
    "single node": (0, 0, 0, 0),
    "interleaved": (0, 1, 0, 1),  # the rails' order is the buffer's: no staging copy
    "uneven 1+2+4": (0, 1, 1, 2, 2, 2, 2),
}
SENTINEL = -7

CASES = [
    (Case(n, op, dt, seed=i), uneven)
    for i, (n, op, dt, uneven) in enumerate(
        (n, op, dt, uneven)
        for n in (0, 1, 7, 1000)
        for op in (ReduceOp.SUM, ReduceOp.MAX)
        for dt in (np.float32, np.float64, np.int64)
        for uneven in (False, True)
    )
]
LARGE = [(Case(1 << 18, ReduceOp.SUM, np.float32, seed=99), False)]  # 1 MiB


def bounds_for(count: int, p: int, uneven: bool) -> Bounds:
    """Balanced, or random cuts with an empty chunk, handed to the ranks in reverse order."""
    if not uneven:
        return chunk_bounds(count, p)
    cuts = sorted(np.random.default_rng([count, p]).integers(0, count + 1, p - 2).tolist())
    edges = [0, cuts[0], *cuts, count]  # cuts[0] twice: one empty chunk
    return tuple(reversed([(edges[i], edges[i + 1]) for i in range(p)]))


def run_layout(nodes: Sequence[Hashable], cases: list[tuple[Case, bool]], rendezvous: bool) -> None:
    p = len(nodes)
    inputs = [[make_input(r, c) for r in range(p)] for c, _ in cases]
    endpoints = LocalTransport.create(p, nodes, rendezvous=rendezvous, timeout=30)

    def body(t: LocalTransport) -> list[dict[str, np.ndarray]]:
        outs = []
        for (case, uneven), per_rank in zip(cases, inputs, strict=True):
            bounds = bounds_for(case.count, p, uneven)
            outs.append(one_rank(t, per_rank[t.rank], case, bounds))
        return outs

    outputs = run_ranks(endpoints, body)
    for i, (case, uneven) in enumerate(cases):
        bounds = bounds_for(case.count, p, uneven)
        check_case(case, bounds, inputs[i], [outputs[r][i] for r in range(p)], len(set(nodes)))


def one_rank(t: LocalTransport, x: np.ndarray, case: Case, bounds: Bounds) -> dict[str, np.ndarray]:
    out = {}
    for name in ("ring", "hierarchical"):
        buf = x.copy()
        mine = reducescatter(t, buf, case.op, bounds, algorithm=name)
        a, b = bounds[t.rank]
        assert mine.size == b - a and (mine.size == 0 or np.shares_memory(mine, buf))
        out[f"rs {name}"] = mine.copy()
        gathered = np.full(case.count, SENTINEL, dtype=case.dtype)
        gathered[a:b] = x[a:b]
        allgather(t, gathered, bounds, algorithm=name)
        out[f"ag {name}"] = gathered
    buf = x.copy()
    reducescatter(t, buf, case.op, bounds, "hierarchical")
    allgather(t, buf, bounds, "hierarchical")
    out["allreduce"] = buf
    return out


def order_free(case: Case) -> bool:
    """Whether the result cannot depend on the reduction order (integers, MAX)."""
    return bool(np.issubdtype(case.dtype, np.integer)) or case.op is ReduceOp.MAX


def assert_reduced(case: Case, inputs: list[np.ndarray], got: np.ndarray, a: int, b: int) -> None:
    """``got`` reduces ``inputs[r][a:b]`` over r: exactly where the order cannot matter,
    else (float SUM, reassociated) within 2 p eps sum |x|."""
    stacked = np.stack(inputs)[:, a:b]
    if order_free(case):
        np.testing.assert_array_equal(got, UFUNC[case.op].reduce(stacked, axis=0), str(case))
        return
    wide = stacked.astype(np.float64)
    bound = np.abs(wide).sum(axis=0) * 2 * len(inputs) * np.finfo(case.dtype).eps
    assert (np.abs(got - wide.sum(axis=0)) <= bound).all(), case


def check_case(case: Case, bounds: Bounds, inputs: list[np.ndarray],
               outs: list[dict[str, np.ndarray]], num_nodes: int) -> None:
    gathered = np.full(case.count, SENTINEL, dtype=case.dtype)
    for r, (a, b) in enumerate(bounds):
        gathered[a:b] = inputs[r][a:b]
    for rank, got in enumerate(outs):
        a, b = bounds[rank]
        assert_reduced(case, inputs, got["rs hierarchical"], a, b)
        if order_free(case) or num_nodes == 1:  # one node: hierarchical is the ring
            assert got["rs hierarchical"].tobytes() == got["rs ring"].tobytes(), (case, rank)
        np.testing.assert_array_equal(got["ag hierarchical"], gathered)
        assert got["ag hierarchical"].tobytes() == got["ag ring"].tobytes()
    check(case, inputs, [got["allreduce"] for got in outs])  # bitwise equal on every rank


@pytest.mark.parametrize("rendezvous", [False, True], ids=["buffered", "rendezvous"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts(layout: str, rendezvous: bool) -> None:
    run_layout(LAYOUTS[layout], CASES + ([] if rendezvous else LARGE), rendezvous)


def test_uneven_bounds_have_empty_chunks_and_leave_rank_order() -> None:
    bounds = bounds_for(7, 4, uneven=True)
    assert sorted(bounds)[0][0] == 0 and sorted(bounds)[-1][1] == 7
    assert any(a == b for a, b in bounds) and list(bounds) != sorted(bounds)


# --------------------------------------------------------------------------- registry
def test_registries_dispatch_by_name_and_name_the_choices() -> None:
    assert set(REDUCESCATTER_ALGORITHMS) == set(ALLGATHER_ALGORITHMS) == {"ring", "hierarchical"}
    (t,) = LocalTransport.create(1)
    buf = np.arange(4.0)
    mine = reducescatter(t, buf, ReduceOp.MAX, ((1, 3),))  # positional, as the backends call
    assert mine.tolist() == [1.0, 2.0] and np.shares_memory(mine, buf)
    allgather(t, buf, ((0, 4),), "hierarchical")
    choices = r"; choose one of \['hierarchical', 'ring'\]"
    with pytest.raises(ValueError, match="unknown reducescatter algorithm 'flat'" + choices):
        reducescatter(t, buf, algorithm="flat")
    with pytest.raises(ValueError, match="unknown allgather algorithm 'x'" + choices):
        allgather(t, buf, algorithm="x")
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'x'"):
        allreduce(t, buf, ReduceOp.SUM, "x")


def test_hierarchical_checks_its_arguments() -> None:
    endpoints = LocalTransport.create(2, (0, 1))
    with pytest.raises(ValueError, match="1 chunk bounds for 2 ranks"):
        reducescatter(endpoints[0], np.zeros(4), ReduceOp.SUM, ((0, 4),), "hierarchical")
    with pytest.raises(ValueError, match="C-contiguous"):
        allgather(endpoints[0], np.zeros((4, 4))[:, 0], None, "hierarchical")


# --------------------------------------------------------------------------- cost rows
CLUSTER = CostParams(alpha=1e-5, beta=1e-9, gamma=1e-10)
SLOW_INTER = CostParams(alpha=2e-6, beta=1e-11, gamma=2e-11, alpha_inter=1e-5, beta_inter=4e-11)
KINDS = ("reducescatter", "allgather")


@pytest.mark.parametrize("kind", KINDS)
def test_hierarchical_sends_fewer_bytes_between_nodes_than_the_ring(kind: str) -> None:
    p, n = 8, 1 << 20  # 2 nodes x 4
    ring = collective_terms(kind, "ring", p, n, 4)
    hier = collective_terms(kind, "hierarchical", p, n, 4)
    assert (ring.steps_inter, hier.steps, hier.steps_inter) == (7, 3, 1)
    assert math.isclose(ring.moved_inter, 7 / 8 * n) and math.isclose(hier.moved_inter, n / 8)
    assert math.isclose(hier.moved + hier.moved_inter, ring.moved + ring.moved_inter)  # (p-1)/p n
    assert hier.reduced == ring.reduced == (7 / 8 * n if kind == "reducescatter" else 0)
    assert predict_collective(kind, "hierarchical", p, n, SLOW_INTER, 4) < predict_collective(
        kind, "ring", p, n, SLOW_INTER, 4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["ring", "hierarchical"])
def test_equal_parameters_give_the_one_class_totals(kind: str, name: str) -> None:
    p, n = 12, 3 << 20
    for rpn in (None, 12, 4, 3, 1):
        t = collective_terms(kind, name, p, n, rpn)
        one_class = ((t.steps + t.steps_inter) * CLUSTER.alpha
                     + (t.moved + t.moved_inter) * CLUSTER.beta + t.reduced * CLUSTER.gamma)
        assert math.isclose(predict_collective(kind, name, p, n, CLUSTER, rpn), one_class)
    ring_one_node = collective_terms(kind, "ring", p, n)
    assert collective_terms(kind, name, p, n, p) == ring_one_node  # one node: nothing to split
    assert math.isclose(predict_collective(kind, "ring", p, n, CLUSTER, 4),
                        predict_collective(kind, "ring", p, n, CLUSTER))
    nothing = cost_model.Terms(0, 0, 0)
    assert collective_terms(kind, name, 1, n) == collective_terms(kind, name, p, 0) == nothing


def test_allreduce_rows_are_their_halves() -> None:
    p, n, rpn = 8, 1 << 20, 4  # one slice each
    for allreduce_name, half in (("ring", "ring"), ("reduction_server", "hierarchical")):
        whole = cost_model.terms(allreduce_name, p, n, rpn)
        halves = (collective_terms("reducescatter", half, p, n, rpn)
                  + collective_terms("allgather", half, p, n, rpn))
        for field in ("steps", "moved", "reduced", "steps_inter", "moved_inter"):
            assert math.isclose(getattr(whole, field), getattr(halves, field)), field
    assert set(ALGORITHMS) == set(cost_model.COLLECTIVE_COST["allreduce"])
    with pytest.raises(ValueError, match="no cost formula for 'tree' \\(allgather\\)"):
        collective_terms("allgather", "tree", p, n)
    with pytest.raises(ValueError, match="no cost formulas for 'gather'"):
        collective_terms("gather", "ring", p, n)


# --------------------------------------------------------------------------- slice_bytes
def test_slice_bytes_is_a_bounded_power_of_two() -> None:
    for p, rpn in ((1, None), (8, None), (8, 4), (16, 4), (16, 1)):
        for n in (0, 1, 1 << 20, 64 << 20, 1 << 30):
            for params in (CLUSTER, SLOW_INTER):
                size = slice_bytes(p, n, params, rpn)
                assert 256 << 10 <= size <= 16 << 20 and size & (size - 1) == 0
    assert slice_bytes(16, 1000, SLOW_INTER, 4) == 256 << 10  # one slice whatever: the smallest


def test_slice_bytes_grows_with_alpha() -> None:
    params = [CostParams(a / 5, 1e-11, 2e-11, alpha_inter=a, beta_inter=4e-11)
              for a in (1e-7, 1e-6, 1e-5, 1e-4)]
    sizes = [slice_bytes(16, 64 << 20, p, ranks_per_node=4) for p in params]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert sizes[-1] == 16 << 20  # latency-bound: as few slices as allowed


def test_pipelined_time_hides_all_but_the_slowest_stage() -> None:
    stages = [cost_model.Terms(1, 0, 0), cost_model.Terms(3, 0, 0)]  # 1 and 3 alphas a slice
    p1 = CostParams(1.0, 0.0, 0.0)
    assert cost_model.pipelined_time(stages, 1, p1, depth=2) == 4.0
    assert cost_model.pipelined_time(stages, 5, p1, depth=2) == 4.0 + 4 * 3.0
    assert cost_model.pipelined_time(stages, 5, p1, depth=1) == 4.0 + 4 * 4.0  # no overlap


def test_slice_bytes_names_its_one_model_and_feeds_the_reduction_server() -> None:
    with pytest.raises(ValueError, match="not 'ring'"):
        slice_bytes(8, 1 << 20, CLUSTER, 4, name="ring")
    size = slice_bytes(4, 1 << 20, CostParams(1e-9, 1e-9, 1e-10), 2)
    assert size < 1 << 20  # cheap messages: several slices
    case = Case(3 * size // 8 + 5, ReduceOp.SUM, np.float64)  # 3 / 8 slices of float64 and a bit
    inputs = [make_input(r, case) for r in range(4)]

    def body(t: LocalTransport) -> np.ndarray:
        buf = inputs[t.rank].copy()
        allreduce(t, buf, case.op, "reduction_server", slice_bytes=size)
        return buf

    check(case, inputs, run_ranks(LocalTransport.create(4, (0, 0, 1, 1)), body))


def test_the_shared_workspace_alternates_halves_and_takes_one_set_above_the_cap(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Calls of changing sizes, with two halves and with one set of slots (cap lowered), on
    two nodes of two and one node of four: every rank gets numpy's sum, bit for bit alike."""
    from cgraph.comm.algorithms import shared

    monkeypatch.setattr(shared, "DOUBLE_BUFFER_BYTES", 4096)
    real_barrier = shared.barrier

    def late(t):  # type: ignore[no-untyped-def]
        real_barrier(t)
        if t.rank % 2:  # these ranks fall behind after every barrier: rank 0 runs ahead
            time.sleep(0.002)

    monkeypatch.setattr(shared, "barrier", late)
    counts = (1000, 7, 3, 60, 300, 1, 0, 50, 2, 129, 2000, 5, 40) * 2
    for layout, rendezvous in itertools.product(((0, 0, 1, 1), (0, 0, 0, 0)), (False, True)):
        def body(t):  # type: ignore[no-untyped-def]
            outs = []
            for count in counts:
                buf = np.arange(count, dtype=np.float64) * (t.rank + 1)
                shared.allreduce_shared(t, buf, ReduceOp.SUM)
                outs.append(buf)
            return outs

        got = run_ranks(LocalTransport.create(4, layout, rendezvous=rendezvous), body)
        for i, count in enumerate(counts):
            want = np.arange(count, dtype=np.float64) * 10
            assert all(np.array_equal(g[i], want) for g in got), (layout, count)
