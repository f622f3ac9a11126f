"""GPU communicators in spawned processes (skipped without CUDA).

    CUDA IPC (one GPU is enough): two processes on GPU 0 exchange tensors device to
        device; send/recv, the star collectives, and a sender that overwrites its
        tensor right after ``send`` (the receiver must still see the old values).
    NCCL (needs two GPUs): two Ray tasks, one GPU each, rendezvous through a
        store actor made here (``NcclRendezvous``); send/recv and every collective
        on ``comm.stream``.
"""

from __future__ import annotations

import multiprocessing
import uuid

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _ipc_rank(ends, queue) -> None:  # type: ignore[no-untyped-def]
    try:
        from cgraph.comm.cuda_ipc import CudaIpcCommunicator

        torch.cuda.set_device(0)
        comm = CudaIpcCommunicator(ends)
        queue.put((comm.rank, _script(comm)))
        comm.destroy()
    except BaseException as exc:  # noqa: BLE001
        queue.put((ends[0].rank, repr(exc)))


def _nccl_rank(rendezvous, rank):  # type: ignore[no-untyped-def]
    """In a Ray task holding one GPU (Ray makes it device 0 there)."""
    from cgraph.comm.torch.process_group import NcclCommunicator

    try:
        comm = NcclCommunicator(rendezvous, rank, 2)
        result = _script(comm)
        comm.destroy()
        return rank, result
    except BaseException as exc:  # noqa: BLE001
        return rank, repr(exc)


def _script(comm) -> dict[str, object]:  # type: ignore[no-untyped-def]
    r, dev = comm.rank, comm.device
    out: dict[str, object] = {}
    with torch.cuda.stream(comm.stream):
        t = torch.full((1024,), float(r + 1), device=dev)
        buf = torch.empty(1024, device=dev)
        if r == 0:
            comm.send(t, 1)
            t.fill_(-5.0)  # after send returns, on the same stream: the receiver keeps 1.0
            comm.recv(buf, 1)
        else:
            comm.recv(buf, 0)
            comm.send(t, 0)
        x = torch.arange(8.0, device=dev) * (r + 1)
        comm.allreduce(x, "sum")
        parts = [torch.empty(8, device=dev) for _ in range(2)]
        comm.allgather(parts, torch.full((8,), float(r), device=dev))
        mine = torch.empty(4, device=dev)
        comm.reducescatter(mine, torch.arange(8.0, device=dev), "max")
        b = torch.full((3,), float(r), device=dev)
        comm.broadcast(b, 1)
    comm.synchronize()
    comm.barrier()
    out["p2p"] = sorted(set(buf.tolist()))
    out["allreduce"] = x.tolist()
    out["allgather"] = [p.tolist() for p in parts]
    out["reducescatter"] = mine.tolist()
    out["broadcast"] = b.tolist()
    return out


def _check(results: dict[int, object]) -> None:
    assert not [v for v in results.values() if isinstance(v, str)], results
    for r in (0, 1):
        res = results[r]
        assert res["p2p"] == [2.0 if r == 0 else 1.0]  # type: ignore[index]
        assert res["allreduce"] == [3.0 * i for i in range(8)]  # type: ignore[index]
        assert res["allgather"] == [[0.0] * 8, [1.0] * 8]  # type: ignore[index]
        assert res["reducescatter"] == [float(i) for i in range(4 * r, 4 * r + 4)]  # type: ignore[index]
        assert res["broadcast"] == [1.0] * 3  # type: ignore[index]


def _collect(procs, queue) -> dict[int, object]:  # type: ignore[no-untyped-def]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return results


def test_cuda_ipc_between_two_processes_on_one_gpu() -> None:
    from cgraph.comm.cuda_ipc import create_ipc_links

    channels, ends = create_ipc_links(uuid.uuid4().hex[:8], "ipc", 2)
    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    try:
        results = _collect([mp.Process(target=_ipc_rank, args=(e, queue)) for e in ends], queue)
    finally:
        for ch in channels:
            ch.close()
            ch.unlink()
    _check(results)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs")
def test_nccl_between_two_gpus(ray_session) -> None:  # type: ignore[no-untyped-def]
    ray = ray_session
    from cgraph.comm.torch.process_group import NcclRendezvous

    assert ray.cluster_resources().get("GPU", 0) >= 2, "the session's Ray should have every GPU of this machine"
    rendezvous, store = NcclRendezvous.create(f"test/{uuid.uuid4().hex[:8]}", timeout_s=60)
    try:
        rank_task = ray.remote(num_cpus=0, num_gpus=1)(_nccl_rank)
        results = dict(ray.get([rank_task.remote(rendezvous, r) for r in (0, 1)], timeout=180))
    finally:
        ray.kill(store)
    _check(results)
