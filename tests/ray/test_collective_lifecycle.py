"""A group's life as Ray users live it: declared again after a destroy, a store that
outlives the rank that made it, links freed after a store was killed, queries that
never block, and bad input refused before anything is sent (the group stays usable)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray

import cgraph.collective as col
from cgraph.comm import rendezvous
from tests.ray.collective_helpers import (  # noqa: F401 - no_group_segments is an autouse fixture
    destroy_everywhere,
    fresh,
    group_segments,
    init,
    no_group_segments,
    run_all,
    spawn_members,
)


@pytest.fixture(scope="module")
def members(ray_session):
    yield from spawn_members(2)


def summed(name):
    def call(*_):
        t = np.full(4, col.get_rank(name) + 1, np.int64)
        col.allreduce(t, name)
        return t.tolist()

    return call


def test_a_destroyed_name_can_be_declared_again(members):
    name, early = fresh("again"), fresh("early")
    try:
        col.declare_collective_group(members, 2, [0, 1], "cpu", name)
        first = run_all(members, summed(name))
        run_all(members, col.destroy_collective_group, name)
        col.destroy_collective_group(name)
        col.declare_collective_group(members, 2, [1, 0], "cpu", name)  # ranks swapped
        second = run_all(members, summed(name))
        ranks = run_all(members, col.get_rank, name)
        # an actor that destroys a name "just in case" before it exists can still join it
        run_all(members, col.destroy_collective_group, early)
        col.declare_collective_group(members, 2, [0, 1], "cpu", early)
        third = run_all(members, summed(early))
    finally:
        destroy_everywhere(members, name, early)
    assert first == second == third == [[3] * 4] * 2
    assert ranks == [1, 0]


def test_a_group_destroyed_on_the_driver_is_dropped_by_its_members(members):
    """The driver's destroy of a group it is not in: the members' next query says so, and
    they can init a group of that name again."""
    name = fresh("outside")
    try:
        col.declare_collective_group(members, 2, [0, 1], "cpu", name)
        before = run_all(members, summed(name))
        col.destroy_collective_group(name)  # on the driver, no member
        after = run_all(members, col.is_group_initialized, name)
        ranks = run_all(members, col.get_rank, name)
        again = run_all(members, init(2, name, timeout_s=20), per_rank=lambda i: (i,))
        summed_again = run_all(members, summed(name))
    finally:
        destroy_everywhere(members, name)
    assert before == summed_again == [[3] * 4] * 2
    assert after == [False, False] and ranks == [-1, -1]
    assert again == [(0, 2), (1, 2)]


def test_a_member_whose_name_lookup_still_finds_the_killed_store_sees_the_group_gone(members):
    """A process answers a name lookup from its cache until Ray's notice of the actor's death
    reaches it (CI saw one member say True here). The member's query must not trust it."""
    name = fresh("stale")

    def query_with_a_stale_lookup(store):
        found = rendezvous.find_store
        rendezvous.find_store = lambda _group: store  # the cache's answer
        try:
            return col.is_group_initialized(name), col.get_rank(name)
        finally:
            rendezvous.find_store = found

    try:
        col.declare_collective_group(members, 2, [0, 1], "cpu", name)
        run_all(members, summed(name))
        store = rendezvous.find_store(name)
        col.destroy_collective_group(name)
        after = ray.get(members[0].run.remote(query_with_a_stale_lookup, store), timeout=60)
    finally:
        destroy_everywhere(members, name)
    assert after == ("ok", (False, -1))


def test_the_store_outlives_the_rank_that_created_it(members):
    """Ray ends a non-detached actor when its creator drops its handle; the creator
    leaving first must not take the store (and the other rank's links) with it."""
    name = fresh("creator")

    def again(rank):
        col.destroy_collective_group(name)
        col.init_collective_group(2, rank, "cpu", name, timeout_s=20)
        return summed(name)()

    try:
        ray.get(members[0].run.remote(init(2, name, timeout_s=20), 0), timeout=60)  # creates it
        ray.get(members[1].run.remote(init(2, name, timeout_s=20), 1), timeout=60)
        run_all(members, summed(name))
        assert ray.get(members[0].run.remote(col.destroy_collective_group, name), timeout=60)[0] == "ok"
        time.sleep(1.0)  # time for Ray to collect a store nobody holds
        alive = ray.get(members[1].run.remote(
            lambda: ray.get(rendezvous.find_store(name).spec.remote(), timeout=10).name), timeout=60)
        ray.get(members[1].run.remote(col.destroy_collective_group, name), timeout=60)
        results = run_all(members, again, per_rank=lambda i: (i,))
    finally:
        destroy_everywhere(members, name)
    assert alive == ("ok", name)
    assert results == [[3] * 4] * 2


def test_links_of_a_killed_store_are_freed_by_the_next_group(members):
    """A store killed outright (ray.shutdown() before any destroy does that) cannot run
    its exit hook; the next store made on the node removes the links of dead stores."""
    name, later = fresh("killed"), fresh("later")
    try:
        col.declare_collective_group(members, 2, [0, 1], "cpu", name)
        run_all(members, summed(name))
        left = [s for s in group_segments() if f"_col.{name}." in s]
        ray.kill(rendezvous.find_store(name), no_restart=True)
        deadline = time.monotonic() + 30
        while rendezvous.find_store(name) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        col.declare_collective_group(members, 2, [0, 1], "cpu", later)
        run_all(members, summed(later))
        still = [s for s in group_segments() if f"_col.{name}." in s]
    finally:
        for actor in members:  # the killed group's records in the members
            ray.get(actor.run.remote(col.destroy_collective_group, name), timeout=60)
        destroy_everywhere(members, later)
    assert left, "the group made no links: nothing was tested"
    assert still == []


@pytest.mark.skipif(not col.gloo_available(), reason="torch without gloo")
def test_queries_on_a_declared_group_do_not_wait_for_the_other_ranks(members):
    """Joining a gloo group waits for every rank; asking about it must not."""
    name = fresh("peek")

    def ask():
        start = time.monotonic()
        answer = (col.is_group_initialized(name), col.get_rank(name), col.get_collective_group_size(name))
        return answer, time.monotonic() - start

    try:
        col.declare_collective_group(members, 2, [1, 0], "gloo", name, timeout_s=20)
        (answer, took), = run_all(members[:1], ask)  # the other member makes no call at all
        import torch

        def use():
            t = torch.ones(2)
            col.allreduce(t, name)
            z = torch.tensor([1 + 2j, col.get_rank(name) * 1j])  # gloo gathers no complex type
            outs = [torch.zeros(2, dtype=z.dtype) for _ in range(2)]
            col.allgather(outs, z, name)
            return t.tolist(), [o.tolist() for o in outs]

        values = run_all(members, use)
    finally:
        destroy_everywhere(members, name)
    assert answer == (True, 1, 2)
    assert took < 10
    assert values == [([2.0, 2.0], [[1 + 2j, 0j], [1 + 2j, 1j]])] * 2


def test_bad_input_is_refused_before_anything_is_sent(members):
    name = fresh("refuse")

    def misuse(rank):
        out = {}
        for label, fn in [
            ("datetime", lambda: col.allreduce(np.array(["2026-01-01"] * 2, "datetime64[D]"), name)),
            ("complex_max", lambda: col.allreduce(np.ones(2, np.complex64), name, op="max")),
            ("list_dtype", lambda: col.reducescatter(np.zeros(2, np.int32),
                                                     [np.full(2, 0.6, np.float32)] * 2, name)),
        ]:
            try:
                fn()
                out[label] = "no error"
            except Exception as exc:  # noqa: BLE001
                out[label] = (type(exc).__name__, str(exc))
        t = np.full(2, rank + 1.0)
        col.broadcast(t, np.int64(1), name)  # a numpy integer is a rank too
        out["broadcast"] = t.tolist()
        col.allreduce(t, name)  # none of the above broke the group
        out["sum"] = t.tolist()
        return out

    try:
        run_all(members, init(2, name, timeout_s=20), per_rank=lambda i: (i,))
        results = run_all(members, misuse, per_rank=lambda i: (i,))
    finally:
        destroy_everywhere(members, name)
    for out in results:
        assert out["datetime"][0] == "ValueError" and "cannot reduce dtype datetime64" in out["datetime"][1]
        assert out["complex_max"][0] == "ValueError" and "complex" in out["complex_max"][1]
        assert out["list_dtype"][0] == "ValueError" and "float32" in out["list_dtype"][1]
        assert out["broadcast"] == [2.0, 2.0] and out["sum"] == [4.0, 4.0]


def test_any_failure_inside_a_call_wakes_the_other_ranks(members):
    """Not only a CollectiveError: whatever breaks one rank mid-call aborts the group, so
    the peers fail at once, naming it, instead of waiting out timeout_s."""
    name = fresh("boom")

    def call(rank):
        from cgraph.comm import algorithms

        star = algorithms.ALGORITHMS["star"]

        def broken(*args, **kwargs):
            raise RuntimeError("boom inside the algorithm")

        if rank == 0:
            algorithms.ALGORITHMS["star"] = broken
        start = time.monotonic()
        try:
            col.allreduce(np.ones(4), name, algorithm="star")
            outcome = "no error"
        except Exception as exc:  # noqa: BLE001
            outcome = (type(exc).__name__, str(exc))
        finally:
            algorithms.ALGORITHMS["star"] = star
        return outcome, time.monotonic() - start

    try:
        run_all(members, init(2, name, timeout_s=30), per_rank=lambda i: (i,))
        (first, _), (second, waited) = run_all(members, call, per_rank=lambda i: (i,))
    finally:
        destroy_everywhere(members, name)
    assert first == ("RuntimeError", "boom inside the algorithm")
    assert second[0] == "CollectiveGroupError" and "boom inside the algorithm" in second[1], second
    assert waited < 20


def test_ranks_disagreeing_on_timeout_is_an_error(members):
    name = fresh("timeouts")
    try:
        first = ray.get(members[0].run.remote(init(2, name, timeout_s=20), 0), timeout=60)
        second = ray.get(members[1].run.remote(init(2, name, timeout_s=2), 1), timeout=60)
    finally:
        destroy_everywhere(members, name)
    assert first[0] == "ok"
    assert second[0] == "CollectiveGroupError" and "timeout_s=20" in second[1] and "timeout_s=2" in second[1]
