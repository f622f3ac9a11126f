"""Helpers shared by the collective API tests: a member actor that runs what a test
sends it, unique group names, and the checks that no group leaves segments behind.

Functions run in the actors through ``Member.run``, which returns ``("ok", value)``
or the error's type, message, group and rank, so tests compare plain values.
"""

from __future__ import annotations

import glob
import itertools
import os
import time

import pytest
import ray

import cgraph.collective as col

_names = itertools.count()
_SESSION = f"t{os.getpid()}"  # in every group name of this test run (and its segments')


@ray.remote(num_cpus=0)
class Member:
    """A collective group member that runs whatever function the test sends it."""

    def run(self, fn, *args):
        try:
            return ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001 - returned to the test as plain values
            return (type(exc).__name__, str(exc), getattr(exc, "group", None), getattr(exc, "rank", None))


def group_segments() -> list[str]:
    """Link segments of this test run's groups (made by their store actors, any pid)."""
    return sorted(glob.glob(f"/dev/shm/cgraph_*_col.{_SESSION}.*"))


def fresh(prefix: str) -> str:
    """A group name no other test (or concurrent run) uses."""
    return f"{_SESSION}.{prefix}{next(_names)}"


def run_all(actors, fn, *args, per_rank=None):
    """``fn(*args)`` on every actor (``per_rank(i)`` appends arguments); the values, or fail."""
    refs = [a.run.remote(fn, *args, *(per_rank(i) if per_rank else ())) for i, a in enumerate(actors)]
    results = ray.get(refs, timeout=120)
    for i, result in enumerate(results):
        assert result[0] == "ok", f"actor {i}: {result}"
    return [r[1] for r in results]


def destroy_everywhere(actors, *names):
    for name in names:
        ray.get([a.run.remote(col.destroy_collective_group, name) for a in actors], timeout=60)
        col.destroy_collective_group(name)  # driver side: frees whatever is left


def init(world_size, name, backend="cpu", timeout_s=30.0):
    def setup(rank):
        col.init_collective_group(world_size, rank, backend, name, timeout_s=timeout_s)
        return col.get_rank(name), col.get_collective_group_size(name)

    return setup


def spawn_members(count):
    """``count`` started member actors, killed when the generator closes (fixture body)."""
    actors = [Member.remote() for _ in range(count)]
    ray.get([a.run.remote(lambda: None) for a in actors])
    yield actors
    for actor in actors:
        ray.kill(actor)


@pytest.fixture(autouse=True)
def no_group_segments(ray_session):
    """Fail a test that leaves link segments of its groups in /dev/shm."""
    yield
    deadline = time.monotonic() + 5
    while group_segments() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_segments(), f"leaked link segments: {group_segments()}"
