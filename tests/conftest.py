"""Shared test set-up: one thread for torch and BLAS on these 2-core machines, and the one
Ray instance of a test session (``ray_session``: tests/ray and tests/gpu share it, since
``make test`` runs both in one pytest process and Ray starts once per process)."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


LOGICAL_GPUS = 4


@pytest.fixture(scope="session")
def ray_session():  # type: ignore[no-untyped-def]
    """A local Ray with 4 CPUs and this machine's GPUs, up until the session ends. Without
    CUDA, Ray gets LOGICAL_GPUS logical ones: placement and transport planning run as on GPUs
    (``ray.get_gpu_ids()``, ``CUDA_VISIBLE_DEVICES``), and nothing touches CUDA."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Actors inherit the environment Ray starts with. A runtime_env with env_vars instead
    # starts every worker through Ray's setup process: 1.33 s an actor against 0.68 s
    # here (median of 12), and the Ray tests start hundreds.
    os.environ["OMP_NUM_THREADS"] = "1"
    ray.init(
        address="local",  # never a stale cluster named in /tmp/ray/ray_current_cluster
        num_cpus=4,
        num_gpus=_cuda_devices() or LOGICAL_GPUS,
        include_dashboard=False,
        log_to_driver=True,
    )
    yield ray
    ray.shutdown()


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
