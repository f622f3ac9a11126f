"""Every allreduce algorithm over a gloo process group (``ProcessGroupTransport``).

Four gloo ranks live in threads of this process (one ``HashStore``), laid out
on two pretend nodes (0, 0, 1, 1) so that the reduction server's node teams
and the hierarchy are exercised; every result is compared with numpy's.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from cgraph.comm import algorithms
from cgraph.comm.torch.process_group import process_group
from cgraph.comm.torch.transport import ProcessGroupTransport
from cgraph.comm.types import ReduceOp

pytestmark = pytest.mark.slow  # left out of `make test-fast`

NODES = ("n0", "n0", "n1", "n1")


def over_gloo(work: Callable[[ProcessGroupTransport], Any], nodes: tuple[str, ...] = NODES) -> list[Any]:
    store, n = dist.HashStore(), len(nodes)

    def one(rank: int) -> Any:
        pg = process_group("gloo", store, rank, n, datetime.timedelta(seconds=30), "127.0.0.1")
        try:
            result = work(ProcessGroupTransport(pg, nodes))
            # no rank closes its pairs before every rank is done: with nothing to send (size
            # 0) a fast rank shut down while a slow one still connected (a fresh-clone run)
            pg.barrier().wait()
            return result
        finally:
            pg.shutdown()

    with ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=120) for f in [pool.submit(one, r) for r in range(n)]]


def inputs(rank: int, size: int, dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(rank)
    return (rng.integers(-50, 50, size) if np.dtype(dtype).kind == "i" else rng.standard_normal(size)).astype(dtype)


@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
@pytest.mark.parametrize(("size", "dtype"), [(0, np.float32), (1, np.float64), (7, np.int64), (300_001, np.float32)])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX])
def test_every_algorithm_equals_numpy_over_gloo(algorithm: str, size: int, dtype: Any, op: ReduceOp) -> None:
    def work(t: ProcessGroupTransport) -> np.ndarray:
        buf = inputs(t.rank, size, dtype)
        algorithms.allreduce(t, buf, op, algorithm)
        return buf

    every = np.stack([inputs(r, size, dtype) for r in range(len(NODES))])
    expect = every.sum(axis=0) if op is ReduceOp.SUM else every.max(axis=0)
    for got in over_gloo(work):
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-4)


def test_reducescatter_allgather_broadcast_and_node_of() -> None:
    def work(t: ProcessGroupTransport) -> Any:
        n = 6
        bounds = tuple((r * n, (r + 1) * n) for r in range(t.world_size))
        whole = np.arange(n * t.world_size, dtype=np.float64) * (t.rank + 1)
        mine = algorithms.reducescatter(t, whole.copy(), ReduceOp.SUM, bounds)
        gathered = np.zeros(n * t.world_size)
        gathered[t.rank * n : (t.rank + 1) * n] = t.rank
        algorithms.allgather(t, gathered, bounds)
        b = np.full(3, float(t.rank))
        algorithms.broadcast(t, b, root=2)
        algorithms.barrier(t)
        return mine, gathered, b, [t.node_of(r) for r in range(t.world_size)]

    for rank, (mine, gathered, b, nodes) in enumerate(over_gloo(work)):
        np.testing.assert_array_equal(mine, np.arange(rank * 6, rank * 6 + 6) * 10.0)  # 1+2+3+4
        np.testing.assert_array_equal(gathered, np.repeat(np.arange(4.0), 6))
        np.testing.assert_array_equal(b, [2.0] * 3)
        assert nodes == list(NODES)


def test_a_read_only_buffer_is_sent_and_a_wrong_peer_refused() -> None:
    def work(t: ProcessGroupTransport) -> Any:
        if t.rank == 0:
            frozen = np.arange(4.0)
            frozen.flags.writeable = False
            t.send(frozen, 1)
            with pytest.raises(ValueError, match="no peer 0"):
                t.send(frozen, 0)
            return None
        got = np.zeros(4)
        t.recv(got, 0)
        return got

    assert over_gloo(work, ("a", "a"))[1].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_node_ids_must_cover_the_group() -> None:
    store = dist.HashStore()
    pg = process_group("gloo", store, 0, 1, datetime.timedelta(seconds=5), "127.0.0.1")
    try:
        with pytest.raises(ValueError, match="2 node ids for a process group of 1"):
            ProcessGroupTransport(pg, ("a", "b"))
    finally:
        pg.shutdown()
