"""The "cpu" backend's links across nodes: shared memory inside a "node", gloo between.

Four ranks live in threads of this process, laid out as two nodes of two: each
node's pair shares a shared-memory mesh made here, and every pair on two nodes
goes through a gloo process group (``RemoteLinks``) met through one ``HashStore``.
``FramedTransport`` routes each peer; the algorithms run over it unchanged.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from cgraph.collective.cpu_layout import _global_ends
from cgraph.comm import algorithms
from cgraph.comm.cpu_mesh import create_links
from cgraph.comm.framed_transport import FramedTransport
from cgraph.comm.process_group import process_group
from cgraph.comm.remote_links import INLINE, RemoteLinks
from cgraph.comm.types import ReduceOp
from cgraph.errors import CollectiveGroupError, CollectiveMismatchError, CollectiveTimeoutError

NODES = ("A", "A", "B", "B")


def hybrid(work: Callable[[FramedTransport], Any], nodes: tuple[str, ...] = NODES,
           timeout: float = 20.0) -> list[Any]:
    """Run ``work(transport)`` on every rank of ``nodes`` at once; results (or errors) by rank."""
    n, store = len(nodes), dist.HashStore()
    made, local = [], {}
    for node in sorted(set(nodes)):
        mine = [r for r in range(n) if nodes[r] == node]
        channels, ends = create_links(f"t{uuid.uuid4().hex[:6]}", node, len(mine))
        made += channels
        local.update({r: (ends[i], mine) for i, r in enumerate(mine)})

    def one(rank: int) -> Any:
        ends, mine = local[rank]
        # only the links hold the process group, so closing them closes its connections
        remote = RemoteLinks(process_group("gloo", store, rank, n, datetime.timedelta(seconds=timeout),
                                           "127.0.0.1"))
        t = FramedTransport(_global_ends(ends, mine, rank, n), "g", nodes, timeout, remote)
        try:
            with t.calling(("g", "test")):
                return work(t)
        except Exception as exc:  # noqa: BLE001 - returned for the test to inspect
            t.close()
            return exc
        finally:
            t.detach()

    try:
        with ThreadPoolExecutor(n) as pool:
            return [f.result(timeout=120) for f in [pool.submit(one, r) for r in range(n)]]
    finally:
        for channel in made:
            channel.unlink()


def data(rank: int, count: int, dtype: Any = np.float64) -> np.ndarray:
    return (np.random.default_rng(rank + 31 * count).standard_normal(count) * 100).astype(dtype)


def test_every_algorithm_over_shared_memory_and_gloo_equals_numpy() -> None:
    counts = (0, 1, 7, 5000, 300_000)  # 300k float64: 2.3 MiB, several slices of the sliced ones

    def work(t: FramedTransport) -> dict[tuple[str, int], np.ndarray]:
        got = {}
        for algorithm in sorted(algorithms.ALGORITHMS):
            for count in counts:
                buf = data(t.rank, count)
                algorithms.allreduce(t, buf, ReduceOp.SUM, algorithm)
                got[(algorithm, count)] = buf
        return got

    results = hybrid(work)
    for count in counts:
        want = np.stack([data(r, count) for r in range(4)]).sum(0)
        for algorithm in algorithms.ALGORITHMS:
            for rank, got in enumerate(results):
                assert not isinstance(got, Exception), got
                np.testing.assert_allclose(got[(algorithm, count)], want, rtol=1e-12, atol=1e-9,
                                           err_msg=f"{algorithm} {count} rank {rank}")


def test_max_and_integers_cross_nodes_exactly() -> None:
    every = np.stack([data(r, 999, np.int64) for r in range(4)])

    def work(t: FramedTransport) -> np.ndarray:
        buf = data(t.rank, 999, np.int64)
        algorithms.allreduce(t, buf, ReduceOp.MAX, "reduction_server")
        return buf

    assert all(np.array_equal(got, every.max(0)) for got in hybrid(work))


@pytest.mark.parametrize("nbytes", [INLINE, INLINE + 1])
def test_a_message_inside_its_header_and_one_after_it(nbytes: int) -> None:
    """Rank 0 (node A) and rank 2 (node B) swap messages of either kind, both ways."""

    def work(t: FramedTransport) -> np.ndarray | None:
        if t.rank not in (0, 2):
            return None
        mine = np.full(nbytes, t.rank + 1, dtype=np.uint8)
        got = np.zeros(nbytes, dtype=np.uint8)
        t.sendrecv(mine, 2 - t.rank, got, 2 - t.rank)
        return got

    got = hybrid(work)
    assert got[0].tolist() == [3] * nbytes and got[2].tolist() == [1] * nbytes


def test_a_message_of_another_size_is_a_mismatch_not_a_crash() -> None:
    """gloo kills a process that receives more bytes than it posted; the header prevents it."""

    def work(t: FramedTransport) -> Any:
        if t.rank == 0:
            t.send(np.zeros(100, dtype=np.uint8), 2)
        elif t.rank == 2:
            t.recv(np.zeros(50, dtype=np.uint8), 0)
        return "done"

    got = hybrid(work)
    assert isinstance(got[2], CollectiveMismatchError), got
    assert "rank 0 sent a message of another call, or of another size" in str(got[2])


def test_a_message_of_another_call_is_a_mismatch() -> None:
    def work(t: FramedTransport) -> Any:
        buf = np.zeros(4)
        if t.rank == 0:
            with t.calling(("g", "allreduce sum ring")):
                t.send(buf, 2)
        elif t.rank == 2:
            with t.calling(("g", "allreduce max ring")):
                t.recv(buf, 0)
        return "done"

    got = hybrid(work)
    assert isinstance(got[2], CollectiveMismatchError) and "allreduce max ring" in str(got[2])


def test_a_peer_on_another_node_that_never_sends_times_out_naming_the_layout() -> None:
    def work(t: FramedTransport) -> Any:
        if t.rank == 1:
            t.recv(np.zeros(8), 3)
        elif t.rank == 3:
            time.sleep(4.0)  # alive (its connections open) but silent past the timeout
        return "done"

    got = hybrid(work, timeout=2.0)
    assert isinstance(got[1], CollectiveTimeoutError), got
    text = str(got[1])
    assert "receive from rank 3" in text and "ranks by node: A 0,1; B 2,3" in text


def test_closing_wakes_a_peer_on_another_node() -> None:
    """A rank that gives up drops its process group; a peer blocked on it wakes at once."""

    def work(t: FramedTransport) -> Any:
        if t.rank == 0:
            t.close()
        elif t.rank == 2:
            t.recv(np.zeros(8), 0)
        return "done"

    got = hybrid(work, timeout=60.0)
    assert isinstance(got[2], CollectiveGroupError) and "could not receive from rank 0" in str(got[2])
