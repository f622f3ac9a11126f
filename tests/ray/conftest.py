"""Leak checks for tests/ray; the one Ray instance of a test session is tests/conftest.py's ``ray_session``."""

from __future__ import annotations

import glob
import os

import pytest

ray = pytest.importorskip("ray")


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
