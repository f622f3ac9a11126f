"""Collective errors are clear and quick, never hangs: mismatches, bad ranks, unknown,
destroyed and aborted groups, team traffic in the parent's call, and a peer that never comes."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray

import cgraph.collective as col
from tests.ray.collective_helpers import (  # noqa: F401 - no_group_segments is an autouse fixture
    Member,
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
    yield from spawn_members(3)


def allreduce_of(name, dtype="float32", shape=(4,), algorithm="ring"):
    def call(*_):
        t = np.ones(shape, dtype=dtype)
        col.allreduce(t, name, algorithm=algorithm)
        return t.tolist()

    return call


def errors(results):
    """(type name, message, group, rank) of every failed result."""
    return [r for r in results if r[0] != "ok"]


@pytest.mark.parametrize(
    "rank0, others, shown",
    [
        (("float64", (4,)), ("float32", (4,)), "float64(4,)"),
        (("float32", (2, 3)), ("float32", (3, 2)), "float32(2, 3)"),
    ],
    ids=["dtype", "shape"],
)
def test_mismatched_dtype_or_shape_is_an_error_on_every_rank(members, rank0, others, shown):
    name = fresh("mismatch")
    actors = members[:3]
    try:
        run_all(actors, init(3, name, timeout_s=20), per_rank=lambda i: (i,))
        start = time.monotonic()
        results = ray.get([a.run.remote(allreduce_of(name, *(rank0 if i == 0 else others)))
                           for i, a in enumerate(actors)], timeout=60)
        elapsed = time.monotonic() - start
        again = ray.get([a.run.remote(allreduce_of(name)) for a in actors], timeout=60)
    finally:
        destroy_everywhere(actors, name)
    assert elapsed < 10, "a mismatch must fail at once, not after the timeout"
    assert len(errors(results)) == 3
    kinds = {r[0] for r in results}
    assert "CollectiveMismatchError" in kinds and kinds <= {"CollectiveMismatchError", "CollectiveGroupError"}
    mismatch = next(r for r in results if r[0] == "CollectiveMismatchError")
    assert shown in mismatch[1] and f"group '{name}'" in mismatch[1] and mismatch[2] == name
    # the group is aborted: later calls say so (and why) instead of hanging
    assert all(r[0] == "CollectiveGroupError" and "aborted" in r[1] for r in again)


def test_peer_that_never_arrives_times_out_naming_group_and_rank(members):
    name = fresh("late")
    actors = members[:2]
    try:
        run_all(actors, init(2, name, timeout_s=1.0), per_rank=lambda i: (i,))
        start = time.monotonic()
        kind, message, group, rank = ray.get(actors[0].run.remote(allreduce_of(name)), timeout=60)
        elapsed = time.monotonic() - start
    finally:
        destroy_everywhere(actors, name)
    assert kind == "CollectiveTimeoutError" and (group, rank) == (name, 0)
    assert f"group '{name}', rank 0" in message and "rank 1" in message and "timeout_s" in message
    assert 0.9 < elapsed < 10


def test_team_call_meeting_a_parent_call_is_a_mismatch(members):
    """Teams share the parent's links; the context in every message keeps them apart."""
    name = fresh("ctx")
    actors = members[:2]

    def call(rank):
        col.split_strided(name, 0, 1, 2, name + ".t")
        return allreduce_of(name + ".t" if rank == 0 else name)()

    try:
        run_all(actors, init(2, name, timeout_s=20), per_rank=lambda i: (i,))
        results = ray.get([a.run.remote(call, i) for i, a in enumerate(actors)], timeout=60)
    finally:
        destroy_everywhere(actors, name)
    mismatches = [r for r in results if r[0] == "CollectiveMismatchError"]
    assert mismatches and "context" in mismatches[0][1]


def test_bad_ranks_unknown_and_destroyed_groups(members):
    name = fresh("bad")
    actors = members[:2]

    def misuse(rank):
        out = {}
        for label, fn in [
            ("send_to_self", lambda: col.send(np.ones(2), rank, name)),
            ("recv_from_7", lambda: col.recv(np.ones(2), 7, name)),
            ("broadcast_from_-1", lambda: col.broadcast(np.ones(2), -1, name)),
            ("unknown", lambda: col.allreduce(np.ones(2), "no-such-group")),
            ("read_only", lambda: col.allreduce(np.frombuffer(b"\0" * 16), name)),
            ("allgather_list", lambda: col.allgather([np.ones(2)], np.ones(2), name)),
            ("python_list", lambda: col.allreduce([1.0, 2.0], name)),
        ]:
            try:
                fn()
                out[label] = "no error"
            except Exception as exc:  # noqa: BLE001
                out[label] = (type(exc).__name__, str(exc))
        col.barrier(name)  # none of the above broke the group
        col.destroy_collective_group(name)
        try:
            col.allreduce(np.ones(2), name)
        except Exception as exc:  # noqa: BLE001
            out["after_destroy"] = (type(exc).__name__, str(exc))
        out["rank_after_destroy"] = col.get_rank(name)
        return out

    try:
        outside = ray.get(actors[0].run.remote(init(2, name + "x"), 5), timeout=60)
        run_all(actors, init(2, name), per_rank=lambda i: (i,))
        results = run_all(actors, misuse, per_rank=lambda i: (i,))
    finally:
        destroy_everywhere(actors, name)
    assert outside[0] == "CollectiveGroupError" and "rank 5 is outside" in outside[1]
    for out in results:
        for label in ("send_to_self", "recv_from_7", "broadcast_from_-1"):
            assert out[label][0] == "CollectiveGroupError" and "outside group" in out[label][1]
        assert out["unknown"][0] == "CollectiveGroupError" and "unknown collective group" in out["unknown"][1]
        assert out["read_only"][0] == "ValueError" and "read-only" in out["read_only"][1]
        assert out["allgather_list"][0] == "ValueError"
        assert out["python_list"][0] == "TypeError" and "np.asarray" in out["python_list"][1]
        assert out["after_destroy"][0] == "CollectiveGroupError" and "destroyed" in out["after_destroy"][1]
        assert out["rank_after_destroy"] == -1


def test_init_disagreements_are_reported(members):
    name = fresh("disagree")
    actors = members[:2]
    try:
        first = ray.get(actors[0].run.remote(init(2, name), 0), timeout=60)
        wrong_size = ray.get(actors[1].run.remote(init(3, name), 1), timeout=60)
        taken = ray.get(actors[1].run.remote(init(2, name), 0), timeout=60)
        unknown_backend = ray.get(actors[1].run.remote(init(2, name, backend="mpi"), 1), timeout=60)
    finally:
        destroy_everywhere(actors, name)
    assert first == ("ok", (0, 2))
    assert wrong_size[0] == "CollectiveGroupError" and "world_size=2" in wrong_size[1]
    assert taken[0] == "CollectiveGroupError" and "taken" in taken[1]
    assert unknown_backend[0] == "ValueError" and "unknown collective backend" in unknown_backend[1]


@pytest.mark.skipif(not col.gloo_available(), reason="torch without gloo")
def test_gloo_mismatch_and_timeout_are_errors_not_crashes(members):
    """Gloo kills the process on a size mismatch: the signature check must come first."""
    import torch

    name = fresh("gloo-err")
    actors = members[:2]

    def sized(rank):
        t = torch.ones(4 if rank == 0 else 6)
        col.allreduce(t, name)
        return t.tolist()

    try:
        run_all(actors, init(2, name, backend="gloo", timeout_s=1.0), per_rank=lambda i: (i,))
        mismatch = ray.get([a.run.remote(sized, i) for i, a in enumerate(actors)], timeout=60)
        fine = run_all(actors, allreduce_of(name, algorithm="auto"))  # still usable
        start = time.monotonic()
        late = ray.get(actors[0].run.remote(allreduce_of(name, algorithm="auto")), timeout=60)
        elapsed = time.monotonic() - start
    finally:
        destroy_everywhere(actors, name)
    assert [r[0] for r in mismatch] == ["CollectiveMismatchError"] * 2
    assert "float32(4,)" in mismatch[0][1] and "float32(6,)" in mismatch[0][1]
    assert fine == [[2.0] * 4] * 2
    assert late[0] == "CollectiveTimeoutError" and (late[2], late[3]) == (name, 0)
    assert elapsed < 15


def test_a_rank_that_dies_mid_call_wakes_the_others_of_its_node(ray_session):
    """Ranks 0 and 1 wait in an allreduce for rank 2, which is killed: they raise an error
    naming it (the node's peer watch aborts the group), not the timeout's error at 60 s."""
    name = fresh("died")
    actors = [Member.remote() for _ in range(3)]

    def waiting(*_):
        try:
            allreduce_of(name)()
            return "no error"
        except Exception as exc:  # noqa: BLE001 - its type and text are the result
            return type(exc).__name__, str(exc)

    try:
        run_all(actors, init(3, name, timeout_s=60), per_rank=lambda i: (i,))
        run_all(actors, allreduce_of(name))  # the links are settled: the watch is on
        calls = [a.run.remote(waiting) for a in actors[:2]]
        time.sleep(1.0)
        ray.kill(actors[2])
        outcomes = [r[1] for r in ray.get(calls, timeout=120)]
    finally:
        for actor in actors[:2]:
            ray.get(actor.run.remote(col.destroy_collective_group, name), timeout=60)
        col.destroy_collective_group(name)
        for actor in actors:
            ray.kill(actor)
    for kind, message in outcomes:
        assert kind == "CollectiveGroupError", (kind, message)
        assert "rank 2 (pid " in message and "on this rank's node died" in message, message
