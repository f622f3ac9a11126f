"""Every allreduce algorithm against a directly computed reference.

One thread per rank drives a ``LocalTransport`` endpoint; each thread runs a
whole list of cases (count x op x dtype) on the same endpoints, so a world of
16 threads is started once per test, not once per case. Every case checks:

    * all ranks hold the same bytes (bitwise, not approximately);
    * the result equals the reference: exactly for integers, MIN and MAX;
      within p * eps * reduce(|x|) for float SUM and PRODUCT (reassociation).

World-size coverage: the full op x dtype x count matrix runs on sizes 1, 2, 3,
5, 8 and 16 in both transport modes; every size 1..16 runs a rotating subset
in both modes; hypothesis draws random combinations.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgraph.comm.algorithms import ALGORITHMS, allreduce
from cgraph.comm.types import UFUNC, ReduceOp
from tests.fabric import LocalTransport, run_ranks

pytestmark = pytest.mark.slow  # left out of `make test-fast`

OPS = tuple(ReduceOp)
DTYPES = (np.float32, np.float64, np.int64)
SLICED = ("chain", "ring", "reduction_server")


@dataclass(frozen=True)
class Case:
    count: int
    op: ReduceOp
    dtype: type
    seed: int = 0


def make_input(rank: int, case: Case) -> np.ndarray:
    """Rank ``rank``'s data: small magnitudes so PRODUCT neither overflows nor underflows."""
    rng = np.random.default_rng([case.seed, rank, case.count])
    if np.issubdtype(case.dtype, np.integer):
        values = (
            rng.choice([-2, -1, 1, 2], case.count)
            if case.op is ReduceOp.PRODUCT
            else (rng.integers(-1000, 1000, case.count))
        )
        return values.astype(case.dtype)
    if case.op is ReduceOp.PRODUCT:
        return rng.uniform(0.5, 1.5, case.count).astype(case.dtype)
    return rng.standard_normal(case.count).astype(case.dtype)


def check(case: Case, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
    """Bitwise agreement across ranks, then agreement with the direct reduction."""
    for rank, out in enumerate(outputs):
        assert out.dtype == case.dtype and out.shape == (case.count,)
        assert out.tobytes() == outputs[0].tobytes(), f"rank {rank} differs from rank 0: {case}"
    ufunc = UFUNC[case.op]
    result = outputs[0]
    if np.issubdtype(case.dtype, np.integer) or case.op in (ReduceOp.MIN, ReduceOp.MAX):
        expected = ufunc.reduce(np.stack(inputs), axis=0) if case.count else result
        np.testing.assert_array_equal(result, expected, err_msg=str(case))
        return
    wide = np.stack(inputs).astype(np.float64)
    expected = ufunc.reduce(wide, axis=0)
    bound = ufunc.reduce(np.abs(wide), axis=0) * 2 * len(inputs) * np.finfo(case.dtype).eps
    assert (np.abs(result - expected) <= bound).all(), (
        f"{case}: max error {np.abs(result - expected).max()}"
    )


def run_cases(
    algorithm: str,
    world_size: int,
    cases: Sequence[Case],
    *,
    rendezvous: bool,
    node_of: Sequence[Hashable] | Callable[[int], Hashable] | None = None,
    **options: object,
) -> None:
    """Run every case on one fabric, one thread per rank, and check each."""
    inputs = [[make_input(r, c) for r in range(world_size)] for c in cases]
    endpoints = LocalTransport.create(world_size, node_of, rendezvous=rendezvous, timeout=20)

    def rank_body(t: LocalTransport) -> list[np.ndarray]:
        outs = []
        for case, per_rank in zip(cases, inputs, strict=True):
            buf = per_rank[t.rank].copy()
            allreduce(t, buf, case.op, algorithm, **options)
            outs.append(buf)
        return outs

    outputs = run_ranks(endpoints, rank_body)
    for i, case in enumerate(cases):
        check(case, inputs[i], [outputs[r][i] for r in range(world_size)])


def counts_for(world_size: int) -> list[int]:
    return sorted({0, 1, 7, max(0, world_size - 1), world_size + 1, 1000})


def full_matrix(world_size: int) -> list[Case]:
    return [Case(n, op, dt) for n in counts_for(world_size) for op in OPS for dt in DTYPES]


def rotating_subset(world_size: int) -> list[Case]:
    """Every count once, cycling through the op x dtype pairs (a different start per size)."""
    pairs = list(itertools.product(OPS, DTYPES))
    counts = counts_for(world_size)
    return [Case(n, *pairs[(world_size + 5 * i) % len(pairs)]) for i, n in enumerate(counts)]


def small_options(algorithm: str) -> dict[str, int]:
    """Slices small enough that the 1000-element cases cut into many of them."""
    return {"slice_bytes": 96} if algorithm in SLICED else {}


@pytest.mark.parametrize("rendezvous", [False, True], ids=["buffered", "rendezvous"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_full_matrix(algorithm: str, world_size: int, rendezvous: bool) -> None:
    run_cases(
        algorithm,
        world_size,
        full_matrix(world_size),
        rendezvous=rendezvous,
        node_of=lambda r: r // 2,
    )


@pytest.mark.parametrize("rendezvous", [False, True], ids=["buffered", "rendezvous"])
@pytest.mark.parametrize("world_size", range(1, 17))
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_every_world_size(algorithm: str, world_size: int, rendezvous: bool) -> None:
    cases = rotating_subset(world_size)
    run_cases(
        algorithm,
        world_size,
        cases,
        rendezvous=rendezvous,
        node_of=lambda r: r // 4,
        **small_options(algorithm),
    )


@pytest.mark.parametrize("slice_bytes", [24, 200, 1 << 20])
@pytest.mark.parametrize("algorithm", SLICED)
def test_slicing(algorithm: str, slice_bytes: int) -> None:
    cases = [Case(n, ReduceOp.SUM, np.float32) for n in (0, 1, 13, 1000)]
    cases += [Case(1000, ReduceOp.MAX, np.int64), Case(77, ReduceOp.PRODUCT, np.float64)]
    for world_size, rendezvous in ((4, True), (7, False)):
        run_cases(
            algorithm,
            world_size,
            cases,
            rendezvous=rendezvous,
            node_of=lambda r: r % 3,
            slice_bytes=slice_bytes,
        )


def test_multidimensional_buffer_is_reduced_in_flattened_order() -> None:
    endpoints = LocalTransport.create(3)

    def body(t: LocalTransport) -> np.ndarray:
        buf = np.arange(12, dtype=np.float64).reshape(3, 4) * (t.rank + 1)
        allreduce(t, buf, ReduceOp.SUM, "ring")
        return buf

    for out in run_ranks(endpoints, body):
        np.testing.assert_array_equal(out, np.arange(12).reshape(3, 4) * 6)


def test_unknown_algorithm_and_non_contiguous_buffer_are_rejected() -> None:
    (t,) = LocalTransport.create(1)
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'rings'"):
        allreduce(t, np.zeros(4), ReduceOp.SUM, "rings")
    with pytest.raises(ValueError, match="C-contiguous"):
        allreduce(t, np.zeros((4, 4))[:, 0], ReduceOp.SUM, "ring")


def test_every_op_has_a_ufunc_a_torch_function_and_a_torch_distributed_op() -> None:
    import torch
    import torch.distributed as dist

    from cgraph.comm.types import TORCH_FN, dist_op

    assert set(UFUNC) == set(TORCH_FN) == set(ReduceOp)
    for op in ReduceOp:
        assert callable(getattr(torch, TORCH_FN[op]))
        assert isinstance(dist_op(op), type(dist.ReduceOp.SUM))


@settings(max_examples=25, deadline=None)
@given(
    algorithm=st.sampled_from(list(ALGORITHMS)),
    world_size=st.integers(1, 16),
    count=st.integers(0, 300),
    op=st.sampled_from(OPS),
    dtype=st.sampled_from(DTYPES),
    rendezvous=st.booleans(),
    ranks_per_node=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_random_allreduce(
    algorithm: str,
    world_size: int,
    count: int,
    op: ReduceOp,
    dtype: type,
    rendezvous: bool,
    ranks_per_node: int,
    seed: int,
) -> None:
    run_cases(
        algorithm,
        world_size,
        [Case(count, op, dtype, seed)],
        rendezvous=rendezvous,
        node_of=lambda r: r // ranks_per_node,
        **small_options(algorithm),
    )
