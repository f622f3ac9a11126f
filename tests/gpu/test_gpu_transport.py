"""Seed 002 on GPUs through cgraph.compile (skipped without CUDA).

    s1, s2, s3 ══► r.recv_and_matmul (x3)     one GPU: all four share it (num_gpus=0.25),
                                             the "auto" edges run on CUDA IPC;
                                             two or more GPUs: sender and receiver on
                                             their own GPUs, "nccl" edges on NCCL.

Results must be the same with and without overlap, tensors must arrive on
the receiver's GPU, and teardown must leave no shared-memory segment.
"""

from __future__ import annotations

import glob
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ray = pytest.importorskip("ray")


class GpuWorker:
    def send(self, shape: tuple[int, ...], value: int) -> torch.Tensor:
        return torch.ones(shape, device="cuda") * value

    def nested(self, value: int) -> dict[str, object]:
        return {"t": torch.full((3,), float(value), device="cuda"), "v": value}

    def recv_and_matmul(self, t: torch.Tensor) -> tuple[float, str]:
        torch.matmul(t, t)
        return float(t[0][0].item()), t.device.type

    def describe(self, value: dict[str, object]) -> tuple[list[float], str, object]:
        t = value["t"]
        return t.tolist(), t.device.type, value["v"]  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def gpu_ray(ray_session):  # the session's Ray (tests/conftest.py), which has this machine's GPUs
    return ray_session


def _segments() -> set[str]:
    return set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*"))


@pytest.mark.parametrize("overlap", [False, True])
def test_seed_on_one_shared_gpu_uses_cuda_ipc(gpu_ray, overlap: bool) -> None:
    import cgraph
    from cgraph import InputNode, MultiOutputNode, TorchTensorType

    worker = ray.remote(num_cpus=0, num_gpus=0.25)(GpuWorker)
    senders, receiver = [worker.remote() for _ in range(3)], worker.remote()
    before = _segments()
    try:
        with InputNode() as inp:
            branches = [
                cgraph.with_type_hint(s.send.bind((256, 256), inp),
                                      TorchTensorType(transport="auto", _static_shape=True, _direct_return=True))
                for s in senders
            ]
            nested = cgraph.with_type_hint(senders[0].nested.bind(inp), TorchTensorType(transport="auto"))
            dag = MultiOutputNode([*(receiver.recv_and_matmul.bind(b) for b in branches), receiver.describe.bind(nested)])
        compiled = dag.experimental_compile(_overlap_gpu_communication=overlap)
        try:
            for i in range(5):
                *mats, described = compiled.execute(i).get(timeout=120)
                assert mats == [(float(i), "cuda")] * 3
                assert described == ([float(i)] * 3, "cuda", i)
        finally:
            compiled.teardown()
    finally:
        for actor in (*senders, receiver):
            ray.kill(actor)
    assert _segments() - before == set()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs")
def test_nccl_between_two_gpus(gpu_ray) -> None:
    import cgraph
    from cgraph import InputNode

    worker = ray.remote(num_cpus=0, num_gpus=1)(GpuWorker)
    a, b = worker.remote(), worker.remote()
    try:
        with InputNode() as inp:
            x = cgraph.with_type_hint(a.send.bind((64, 64), inp), cgraph.TorchTensorType(transport="nccl"))
            dag = b.recv_and_matmul.bind(x)
        for overlap in (False, True):
            compiled = cgraph.compile(dag, overlap_gpu_communication=overlap)
            try:
                assert [compiled.execute(i).get(timeout=120) for i in range(3)] == [(float(i), "cuda") for i in range(3)]
            finally:
                compiled.teardown()
    finally:
        ray.kill(a)
        ray.kill(b)


class CpuWorker:
    def describe(self, t: torch.Tensor) -> tuple[list[float], str]:
        return t.flatten().tolist(), t.device.type


def test_cuda_tensors_on_shared_memory_edges_travel_through_the_host(gpu_ray) -> None:
    """No communicator edge: a GPU actor's tensor reaches a CPU actor on the CPU, and the
    driver (it has CUDA here) on its GPU, as Ray Compiled Graphs does."""
    from cgraph import InputNode, MultiOutputNode

    gpu = ray.remote(num_cpus=0, num_gpus=0.25)(GpuWorker).remote()
    cpu = ray.remote(num_cpus=0)(CpuWorker).remote()
    try:
        with InputNode() as inp:
            t = gpu.send.bind((2, 2), inp)
            dag = MultiOutputNode([t, cpu.describe.bind(t)])
        compiled = dag.experimental_compile()
        try:
            on_driver, (values, device) = compiled.execute(3).get(timeout=120)
        finally:
            compiled.teardown()
        assert on_driver.device.type == "cuda" and on_driver.tolist() == [[3.0, 3.0], [3.0, 3.0]]
        assert (values, device) == ([3.0] * 4, "cpu")
    finally:
        ray.kill(gpu)
        ray.kill(cpu)
