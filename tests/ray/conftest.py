"""One local CPU Ray instance for the whole tests/ray session (ray.init is slow here)."""

from __future__ import annotations

import glob
import os

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_session():
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(
        address="local",  # never a stale cluster named in /tmp/ray/ray_current_cluster
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    yield ray
    ray.shutdown()


def cgraph_segments() -> list[str]:
    """cgraph's shared-memory segments created by this driver process."""
    return sorted(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*"))


@pytest.fixture
def no_leaks(ray_session):
    """Fail the test if it leaves a cgraph segment of this driver in /dev/shm."""
    before = set(cgraph_segments())
    yield
    leaked = sorted(set(cgraph_segments()) - before)
    assert not leaked, f"leaked shared-memory segments: {leaked}"
