"""Building blocks (reduce, broadcast, allgather, reducescatter, barrier) and the transport."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cgraph.comm.algorithms import allgather, barrier, broadcast, reduce, reducescatter
from cgraph.comm.algorithms.partition import chunk_bounds, slice_bounds
from cgraph.comm.transport import Transport, node_layout
from cgraph.comm.types import ReduceOp
from cgraph.errors import ChannelClosedError, ChannelTimeoutError
from tests.fabric import LocalTransport, run_ranks

MODES = pytest.mark.parametrize("rendezvous", [False, True], ids=["buffered", "rendezvous"])
SIZES = pytest.mark.parametrize("world_size", [1, 2, 3, 6, 7, 16])


def data(rank: int, count: int) -> np.ndarray:
    return np.arange(count, dtype=np.int64) * 10 + rank + 1


@MODES
@SIZES
def test_broadcast_and_reduce_from_every_root(world_size: int, rendezvous: bool) -> None:
    endpoints = LocalTransport.create(world_size, rendezvous=rendezvous, timeout=20)
    count = world_size + 1
    total = sum(data(r, count) for r in range(world_size))

    def body(t: LocalTransport) -> list[np.ndarray]:
        outs = []
        for root in range(world_size):
            buf = data(t.rank, count)
            broadcast(t, buf, root)
            outs.append(buf)
            buf = data(t.rank, count)
            reduce(t, buf, ReduceOp.SUM, root)
            outs.append(buf)
        return outs

    for rank, outs in enumerate(run_ranks(endpoints, body)):
        for root in range(world_size):
            np.testing.assert_array_equal(outs[2 * root], data(root, count))
            reduced = total if rank == root else data(rank, count)  # others left unchanged
            np.testing.assert_array_equal(outs[2 * root + 1], reduced)


@MODES
@SIZES
@pytest.mark.parametrize("count", [0, 1, 5, 100])
def test_reducescatter_then_allgather(world_size: int, rendezvous: bool, count: int) -> None:
    endpoints = LocalTransport.create(world_size, rendezvous=rendezvous, timeout=20)
    total = sum(data(r, count) for r in range(world_size))
    bounds = chunk_bounds(count, world_size)

    def body(t: LocalTransport) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        buf = data(t.rank, count)
        mine = reducescatter(t, buf, ReduceOp.MAX)
        mine_copy = mine.copy()
        gathered = np.zeros(count, dtype=np.int64)
        a, b = bounds[t.rank]
        gathered[a:b] = data(t.rank, count)[a:b]
        allgather(t, gathered)
        buf = data(t.rank, count)
        reducescatter(t, buf, ReduceOp.SUM)
        allgather(t, buf)
        return mine_copy, gathered, buf

    pieces = [data(r, count)[a:b] for r, (a, b) in enumerate(bounds)]
    for rank, (mine, gathered, allreduced) in enumerate(run_ranks(endpoints, body)):
        a, b = bounds[rank]
        np.testing.assert_array_equal(mine, data(world_size - 1, count)[a:b])
        np.testing.assert_array_equal(gathered, np.concatenate(pieces) if count else gathered)
        np.testing.assert_array_equal(allreduced, total)


def test_reducescatter_with_uneven_bounds() -> None:
    bounds = ((0, 1), (1, 7), (7, 7), (7, 9))
    endpoints = LocalTransport.create(4, rendezvous=True)

    def body(t: LocalTransport) -> np.ndarray:
        buf = np.full(9, t.rank + 1.0)
        return reducescatter(t, buf, ReduceOp.SUM, bounds).copy()

    outs = run_ranks(endpoints, body)
    assert [o.size for o in outs] == [1, 6, 0, 2]
    assert all((o == 10.0).all() for o in outs)


@MODES
@pytest.mark.parametrize("world_size", [1, 2, 5, 8, 11])
def test_barrier_holds_everyone_until_the_last_arrives(world_size: int, rendezvous: bool) -> None:
    endpoints = LocalTransport.create(world_size, rendezvous=rendezvous, timeout=20)
    arrived: list[int] = []
    lock = threading.Lock()

    def body(t: LocalTransport) -> int:
        if t.rank == world_size - 1:
            time.sleep(0.05)
        with lock:
            arrived.append(t.rank)
        barrier(t)
        with lock:
            return len(arrived)

    assert run_ranks(endpoints, body) == [world_size] * world_size


def test_root_out_of_range() -> None:
    (t,) = LocalTransport.create(1)
    with pytest.raises(ValueError, match="root 3 is outside 0..0"):
        broadcast(t, np.zeros(2), 3)


# --------------------------------------------------------------------------- transport
def test_local_transport_is_a_transport_with_a_node_layout() -> None:
    endpoints = LocalTransport.create(4, node_of=lambda r: f"host{r // 2}")
    assert isinstance(endpoints[0], Transport)
    assert [t.rank for t in endpoints] == [0, 1, 2, 3]
    assert node_layout(endpoints[3]) == ("host0", "host0", "host1", "host1")
    assert node_layout(LocalTransport.create(2)[0]) == (0, 0)
    with pytest.raises(ValueError, match="names 3 ranks"):
        LocalTransport.create(2, node_of=(0, 0, 1))


def test_buffered_send_returns_before_the_receive_and_keeps_fifo_order() -> None:
    a, b = LocalTransport.create(2)
    for value in (1.0, 2.0, 3.0):
        a.send(np.full(3, value), 1)  # buffered: returns at once, data copied
    got = np.empty(3)
    for value in (1.0, 2.0, 3.0):
        b.recv(got, 0)
        assert (got == value).all()


def test_rendezvous_send_waits_for_the_receiver() -> None:
    a, b = LocalTransport.create(2, rendezvous=True, timeout=5)
    done = threading.Event()
    sender = threading.Thread(target=lambda: (a.send(np.ones(2), 1), done.set()))
    sender.start()
    assert not done.wait(0.1)
    b.recv(np.empty(2), 0)
    assert done.wait(5)
    sender.join()


def test_naive_exchange_deadlocks_under_rendezvous_but_sendrecv_does_not() -> None:
    def naive(t: LocalTransport) -> None:
        t.send(np.ones(2), 1 - t.rank)
        t.recv(np.empty(2), 1 - t.rank)

    with pytest.raises(ChannelTimeoutError, match="rank [01] send to rank [01]"):
        run_ranks(LocalTransport.create(2, rendezvous=True, timeout=0.2), naive)

    def exchange(t: LocalTransport) -> float:
        got = np.empty(2)
        t.sendrecv(np.full(2, t.rank + 1.0), 1 - t.rank, got, 1 - t.rank)
        return float(got[0])

    assert run_ranks(LocalTransport.create(2, rendezvous=True, timeout=5), exchange) == [2.0, 1.0]


def test_size_mismatch_is_reported_and_other_ranks_are_released() -> None:
    def body(t: LocalTransport) -> None:
        if t.rank == 0:
            t.send(np.ones(3), 1)
        elif t.rank == 1:
            t.recv(np.empty(4), 0)
        else:
            t.recv(np.empty(1), 0)  # never sent: closed when rank 1 fails

    with pytest.raises(ValueError, match="rank 1 recv from rank 0: message of 3 x float64"):
        run_ranks(LocalTransport.create(3, timeout=30), body)


def test_aborted_fabric_fails_later_calls() -> None:
    a, b = LocalTransport.create(2)
    a.abort("test")
    with pytest.raises(ChannelClosedError, match="closed"):
        b.send(np.ones(1), 0)


def test_partition() -> None:
    assert chunk_bounds(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))
    assert chunk_bounds(2, 3, offset=5) == ((5, 6), (6, 7), (7, 7))
    assert slice_bounds(10, 4) == ((0, 4), (4, 8), (8, 10))
    assert slice_bounds(0, 4) == ()
