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


# --------------------------------------------------------------------------- shared actors
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """Keep each phase's report on the item (``item.rep_call``), for fixtures that ask how
    the test went."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _reinit(instance, args, kwargs):  # type: ignore[no-untyped-def]
    """In the actor: the state of a new one (attributes dropped, ``__init__`` run again)."""
    instance.__dict__.clear()
    instance.__init__(*args, **kwargs)


class ActorPool:
    """Started actors shared by the tests of one module.

    A Ray actor is a worker process that imports Ray (and cgraph on its first graph): about
    0.7 s of CPU on these 2-core machines, where the Ray tests start hundreds. A test takes
    actors of a class (``take``): idle ones come back with a new one's state (attributes
    emptied, ``__init__`` run again with this test's arguments), the rest are started.
    After the test (``settle``) an actor returns to the pool only if the test passed, it is
    alive and answers within a few seconds (not stuck in a method), and no compiled graph
    is live on it; any other is killed, as a fresh actor per test would be. An idle actor
    still costs about 1% of a core (Ray's own threads: 30 idle actors took 29% here), so
    the pool keeps at most ``IDLE`` of them and ends with its module.
    """

    READY_S = 10.0
    """How long an actor given back may take to answer before it is killed instead."""
    IDLE = 6
    """The most idle actors kept; the rest of those given back are killed."""

    def __init__(self) -> None:
        self.idle: dict[object, list[object]] = {}
        self.lent: list[tuple[object, object]] = []

    def take(self, cls, n, *args, **kwargs):  # type: ignore[no-untyped-def]
        idle = self.idle.setdefault(cls, [])
        got = [idle.pop() for _ in range(min(n, len(idle)))]
        renewed = [actor.__ray_call__.remote(_reinit, args, kwargs) for actor in got]
        got += [cls.remote(*args, **kwargs) for _ in range(n - len(got))]
        ray.get(renewed, timeout=60)
        self.lent += [(cls, actor) for actor in got]
        return got

    def settle(self, passed: bool) -> None:
        from cgraph.runtime.monitor import WATCHER

        lent, self.lent = self.lent, []
        busy = WATCHER.live_actors()
        free = [(cls, actor) for cls, actor in lent if passed and actor._actor_id.hex() not in busy]
        pings = [actor.__ray_ready__.remote() for _, actor in free]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=self.READY_S)
        kept = set()
        for (cls, actor), ping in zip(free, pings, strict=True):
            if ping in ready and sum(map(len, self.idle.values())) < self.IDLE:
                try:
                    ray.get(ping)
                except ray.exceptions.RayError:
                    continue  # killed by the test
                self.idle[cls].append(actor)
                kept.add(id(actor))
        for _, actor in lent:
            if id(actor) not in kept:
                ray.kill(actor)

    def close(self) -> None:
        for actors in self.idle.values():
            for actor in actors:
                ray.kill(actor)
        self.idle.clear()


@pytest.fixture(scope="module")
def actor_pool(ray_session):  # type: ignore[no-untyped-def]
    pool = ActorPool()
    yield pool
    pool.close()


@pytest.fixture
def actors(actor_pool, request):  # type: ignore[no-untyped-def]
    """``actors(cls, n, *args, **kwargs)``: n actors of ``cls`` made with those arguments, as
    if new (``ActorPool``); shared by the module's tests."""
    yield actor_pool.take
    report = getattr(request.node, "rep_call", None)
    actor_pool.settle(report is not None and report.passed)


@pytest.fixture(scope="session", autouse=True)
def child_scripts(request):  # type: ignore[no-untyped-def]
    """The session's child scripts (``tests/ray/child_scripts.py``); the longest start now,
    each only if the file of its tests was collected."""
    from tests.ray.child_scripts import ChildScripts

    scripts = ChildScripts()
    scripts.start_early({item.path.name for item in request.session.items})
    yield scripts
    scripts.stop()


@pytest.fixture(scope="module")
def calcs(ray_session):  # type: ignore[no-untyped-def]
    """Four ``Calc`` actors (``random_dags.py``) that a module's random DAGs share."""
    from tests.ray.random_dags import Calc

    actors = [Calc.remote(k) for k in (2, 3, 5, 7)]
    yield actors
    for a in actors:
        ray.kill(a)
