"""The CPU communicator across processes, and the interface's star collectives in threads.

    driver (this process): create_links(tag, "g", n)   ──ends[r]──►  process r: CpuCommunicator(ends[r])
                                                                     runs SCRIPT, puts its results on a queue

Each process runs every call once (send/recv of several dtypes, allreduce with
each op and algorithm, allgather, reducescatter from a list and from one
tensor, broadcast, barrier); the test compares with the same arithmetic done
locally.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import uuid
from typing import Any

import pytest
import torch

from cgraph.comm.algorithms import ALGORITHMS
from cgraph.comm.communicator import Communicator, as_reduce_op, missing_methods
from cgraph.comm.cpu.mesh import CpuCommunicator, create_links
from cgraph.comm.teams import Team
from cgraph.comm.types import ReduceOp
from cgraph.errors import ChannelClosedError

OPS = ("sum", "product", "min", "max")


def data(rank: int, n: int = 7) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) * (rank + 1) - rank


def expected_reduce(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    out = tensors[0].clone()
    fn = {"sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum}[op]
    for t in tensors[1:]:
        out = fn(out, t)
    return out


def script(comm: Communicator) -> dict[str, object]:
    r, p = comm.rank, comm.world_size
    out: dict[str, object] = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):  # point to point, a ring
        t = torch.full((3, 2), r + 1).to(dtype)
        buf = torch.empty(3, 2, dtype=dtype)
        if r % 2 == 0:
            comm.send(t, (r + 1) % p)
            comm.recv(buf, (r - 1) % p)
        else:
            comm.recv(buf, (r - 1) % p)
            comm.send(t, (r + 1) % p)
        out[f"p2p-{dtype}"] = buf.float().tolist()
    if r == 0:  # a 0-d tensor
        comm.send(torch.tensor(2.5), 1)
    elif r == 1:
        got = torch.empty(())
        comm.recv(got, 0)
        out["scalar"] = float(got)
    for op in OPS:
        for algorithm in ("ring", "tree", "butterfly"):
            t = data(r)
            comm.allreduce(t, op, algorithm)
            out[f"allreduce-{op}-{algorithm}"] = t.tolist()
    half = data(r).to(torch.bfloat16)
    comm.allreduce(half, "sum")
    out["allreduce-bf16"] = half.float().tolist()
    parts = [torch.empty(7, dtype=torch.float64) for _ in range(p)]
    comm.allgather(parts, data(r))
    out["allgather"] = [x.tolist() for x in parts]
    mine = torch.empty(7, dtype=torch.float64)
    comm.reducescatter(mine, [data(r + j) for j in range(p)], "sum")
    out["reducescatter-list"] = mine.tolist()
    comm.reducescatter(mine, torch.cat([data(r + j) for j in range(p)]), "max")
    out["reducescatter-tensor"] = mine.tolist()
    b = data(r)
    comm.broadcast(b, p - 1)
    out["broadcast"] = b.tolist()
    comm.barrier()
    return out


def _process(ends, queue) -> None:  # type: ignore[no-untyped-def]
    try:
        comm = CpuCommunicator(ends)
        queue.put((ends.rank, script(comm)))
        comm.destroy()
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put((ends.rank, exc))


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_call_across_processes(world_size: int) -> None:
    tag = uuid.uuid4().hex[:8]
    channels, ends = create_links(tag, "g", world_size)
    mp = multiprocessing.get_context("fork")
    queue = mp.Queue()
    procs = [mp.Process(target=_process, args=(e, queue), daemon=True) for e in ends]
    try:
        for proc in procs:
            proc.start()
        results = dict(queue.get(timeout=60) for _ in procs)
        for proc in procs:
            proc.join(timeout=10)
    finally:
        for ch in channels:
            ch.close()
            ch.unlink()
    errors = [v for v in results.values() if isinstance(v, BaseException)]
    assert not errors, errors
    assert not [f for f in os.listdir("/dev/shm") if tag in f]
    p = world_size
    for r in range(p):
        res = results[r]
        assert res["p2p-torch.float32"] == [[float((r - 1) % p + 1)] * 2] * 3
        assert res["p2p-torch.bfloat16"] == res["p2p-torch.float32"]
        assert res["p2p-torch.bool"] == [[1.0] * 2] * 3
        for op in OPS:
            want = expected_reduce(op, [data(k) for k in range(p)]).tolist()
            for algorithm in ("ring", "tree", "butterfly"):
                assert res[f"allreduce-{op}-{algorithm}"] == want, (op, algorithm)
        assert res["allreduce-bf16"] == expected_reduce("sum", [data(k).to(torch.bfloat16) for k in range(p)]).float().tolist()
        assert res["allgather"] == [data(k).tolist() for k in range(p)]
        assert res["reducescatter-list"] == expected_reduce("sum", [data(k + r) for k in range(p)]).tolist()
        assert res["reducescatter-tensor"] == expected_reduce("max", [data(k + r) for k in range(p)]).tolist()
        assert res["broadcast"] == data(p - 1).tolist()
    assert results[1]["scalar"] == 2.5


# --------------------------------------------------------------------------- in threads
def run_threads(world_size: int, fn):  # type: ignore[no-untyped-def]
    """``fn(comm)`` on one thread per rank of a fresh link mesh; results by rank."""
    tag = uuid.uuid4().hex[:8]
    channels, ends = create_links(tag, "t", world_size)
    comms = [CpuCommunicator(e) for e in ends]
    results: list[object] = [None] * world_size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(comms[rank])
        except BaseException as exc:  # noqa: BLE001
            results[rank] = exc
            comms[rank].abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for comm in comms:
        comm.destroy()
    for ch in channels:
        ch.close()
        ch.unlink()
    return results


class StarOnly(Communicator):
    """A user communicator with only send and recv: the interface's collectives do the rest."""

    def __init__(self, inner: CpuCommunicator) -> None:
        self.inner = inner

    rank = property(lambda self: self.inner.rank)  # type: ignore[assignment]
    world_size = property(lambda self: self.inner.world_size)  # type: ignore[assignment]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.inner.send(tensor, dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.inner.recv(tensor, src)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_star_defaults_match_the_cpu_algorithms(world_size: int) -> None:
    def both(comm: CpuCommunicator) -> list[list[float]]:
        star = StarOnly(comm)
        out = []
        for c in (star, comm):
            t = data(c.rank)
            c.allreduce(t, "min")
            parts = [torch.empty(7, dtype=torch.float64) for _ in range(c.world_size)]
            c.allgather(parts, data(c.rank))
            mine = torch.empty(7, dtype=torch.float64)
            c.reducescatter(mine, torch.cat([data(c.rank * 10 + j) for j in range(c.world_size)]), "sum")
            b = data(c.rank)
            c.broadcast(b, 0)
            c.barrier()
            out.append([t.tolist(), [x.tolist() for x in parts], mine.tolist(), b.tolist()])
        return out

    for res in run_threads(world_size, both):
        assert not isinstance(res, BaseException), res
        star, native = res  # type: ignore[misc]
        assert star == native


@pytest.mark.parametrize("world_size", [1, 3])
def test_the_interfaces_reduce_split_and_algorithm_defaults(world_size: int) -> None:
    def fn(comm: CpuCommunicator) -> Any:
        star = StarOnly(comm)
        t = torch.full((4,), float(star.rank + 1))
        star.reduce(t, world_size - 1, "sum")
        refused = []
        for call in (lambda: star.allreduce(torch.ones(2), "sum", "ring"), lambda: star.split(Team((0,)))):
            try:
                call()
            except (ValueError, NotImplementedError) as exc:
                refused.append(f"{type(exc).__name__}: {exc}")
        return t.tolist(), star.nodes, refused

    total = float(sum(range(1, world_size + 1)))
    for rank, res in enumerate(run_threads(world_size, fn)):
        assert not isinstance(res, BaseException), res
        got, nodes, refused = res  # type: ignore[misc]
        assert got == [total if rank == world_size - 1 else rank + 1.0] * 4  # only dst's changes
        assert nodes == (0,) * world_size
        assert refused == ["ValueError: StarOnly offers no allreduce algorithm to choose; got "
                           "algorithm='ring', use 'auto'", "NotImplementedError: StarOnly cannot split into teams"]


def test_abort_wakes_a_blocked_receive() -> None:
    started = threading.Event()

    def fn(comm: CpuCommunicator) -> str:
        if comm.rank == 0:
            started.wait(5)
            comm.abort()
            return "aborted"
        started.set()
        comm.recv(torch.empty(3), 0)  # nobody sends
        return "received?"

    aborted, blocked = run_threads(2, fn)
    assert aborted == "aborted"
    assert isinstance(blocked, ChannelClosedError)


def test_mismatched_receive_says_what_did_not_fit() -> None:
    def fn(comm: CpuCommunicator) -> None:
        if comm.rank == 0:
            comm.send(torch.zeros(4), 1)
        else:
            comm.recv(torch.empty(5), 0)

    _, err = run_threads(2, fn)
    assert isinstance(err, ValueError)
    assert "does not fit a buffer of 20 x uint8" in str(err)


def test_interface_helpers() -> None:
    assert as_reduce_op("MAX") is ReduceOp.MAX and as_reduce_op(ReduceOp.SUM) is ReduceOp.SUM
    with pytest.raises(ValueError, match="unknown reduce op 'avg'"):
        as_reduce_op("avg")
    assert missing_methods(object()) == [
        "initialize", "send", "recv", "allreduce", "allgather", "reducescatter",
        "broadcast", "barrier", "synchronize", "destroy",
    ]
    assert set(ALGORITHMS) >= {"ring", "tree", "butterfly"}
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):
        CpuCommunicator(None, algorithm="nope")  # type: ignore[arg-type]
