"""The imperative collective API across Ray actors: every op, declared groups, teams, auto, gloo.

Four actors (num_cpus=0) serve every test of the module; each test makes its
own uniquely named groups and destroys them, and the autouse fixture checks
that no link segment of a group is left in /dev/shm. Functions run in the
actors through ``Member.run``, which returns ``("ok", value)`` or the error's
type, message, group and rank, so tests compare plain values.
"""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

import cgraph.collective as col
from cgraph.comm import algorithms
from cgraph.comm.kinds import BACKENDS, KINDS, backend
from cgraph.comm.tensor_views import CONVERT
from cgraph.comm.tuning.autotune import AUTO_SHARE
from cgraph.comm.types import ReduceOp
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
    yield from spawn_members(4)


# --------------------------------------------------------------------------- every op
def every_op(name, kind):
    """All collectives once on this rank; returns what each produced."""
    rank, p = col.get_rank(name), col.get_collective_group_size(name)

    def make(values, dtype=np.float32):
        arr = np.asarray(values, dtype=dtype)
        return torch.from_numpy(arr.copy()) if kind == "torch" else arr.copy()

    out = {}
    for op in ReduceOp:
        t = make(np.arange(6).reshape(2, 3) + rank + 1)
        col.allreduce(t, name, op=op, algorithm="ring")
        out[f"allreduce_{op.value}"] = np.asarray(t).tolist()
    t = make([rank + 1.0] * 3)
    col.reduce(t, dst_rank=p - 1, group_name=name)
    out["reduce"] = np.asarray(t).tolist()
    t = make([rank * 10.0] * 2)
    col.broadcast(t, src_rank=1, group_name=name)
    out["broadcast"] = np.asarray(t).tolist()
    outs = [make([0.0, 0.0]) for _ in range(p)]
    col.allgather(outs, make([rank, rank + 0.5]), name)
    out["allgather"] = [np.asarray(o).tolist() for o in outs]
    got = make([0.0, 0.0])
    col.reducescatter(got, [make([rank + r, 1.0]) for r in range(p)], name)
    out["reducescatter"] = np.asarray(got).tolist()
    ring = make([0.0] * 4)
    if rank == 0:
        col.send(make([7.0, 8.0, 9.0, 10.0]), 1, name)
    elif rank == 1:
        col.recv(ring, 0, name)
    out["recv"] = np.asarray(ring).tolist()
    col.barrier(name)
    return out


@pytest.mark.parametrize("world_size, kind", [(2, "numpy"), (3, "torch"), (4, "numpy")])
def test_every_op(members, world_size, kind):
    name = fresh("ops")
    actors = members[:world_size]
    try:
        assert run_all(actors, init(world_size, name), per_rank=lambda i: (i,)) == [
            (i, world_size) for i in range(world_size)
        ]
        results = run_all(actors, every_op, name, kind)
    finally:
        destroy_everywhere(actors, name)
    p = world_size
    base = np.arange(6).reshape(2, 3)
    contributions = [base + r + 1 for r in range(p)]
    expected = {
        "allreduce_sum": sum(contributions),
        "allreduce_product": np.prod(contributions, axis=0),
        "allreduce_min": np.min(contributions, axis=0),
        "allreduce_max": np.max(contributions, axis=0),
    }
    for rank, out in enumerate(results):
        for key, value in expected.items():
            assert out[key] == value.tolist(), (rank, key)
        reduced = [float(sum(range(1, p + 1)))] * 3 if rank == p - 1 else [rank + 1.0] * 3
        assert out["reduce"] == reduced
        assert out["broadcast"] == [10.0, 10.0]
        assert out["allgather"] == [[r, r + 0.5] for r in range(p)]
        assert out["reducescatter"] == [float(sum(r + rank for r in range(p))), float(p)]
        assert out["recv"] == ([7.0, 8.0, 9.0, 10.0] if rank == 1 else [0.0] * 4)


def allreduce_each_algorithm(name):
    rank, results = col.get_rank(name), {}
    for algorithm in algorithms.ALGORITHMS:
        t = torch.full((1000,), float(rank + 1), dtype=torch.float64)
        col.allreduce(t, name, algorithm=algorithm)
        results[algorithm] = float(t.sum())
    strided = np.ones((4, 6), np.float32)[:, ::2]  # non-contiguous: copied and written back
    col.allreduce(strided, name, algorithm="star")
    bf16 = torch.ones(5, dtype=torch.bfloat16)  # no numpy dtype: reduced as float32
    col.allreduce(bf16, name, algorithm="butterfly")
    return results, strided.tolist(), bf16.float().tolist()


@pytest.mark.parametrize("backend", ["cpu", "gloo"])
def test_every_algorithm_and_awkward_tensors(members, backend):
    name = fresh("algs")
    try:
        run_all(members[:3], init(3, name, backend=backend), per_rank=lambda i: (i,))
        results = run_all(members[:3], allreduce_each_algorithm, name)
    finally:
        destroy_everywhere(members[:3], name)
    for per_algorithm, strided, bf16 in results:
        assert per_algorithm == {a: 6000.0 for a in algorithms.ALGORITHMS}
        assert strided == [[3.0] * 3] * 4 and bf16 == [3.0] * 5


# --------------------------------------------------------------------------- declared, several groups
def test_declared_group_needs_no_setup_call(members):
    name = fresh("declared")
    actors = members[:3]
    col.declare_collective_group(actors, world_size=3, ranks=[2, 0, 1], backend="cpu", group_name=name)

    def use():
        t = np.full(3, col.get_rank(name) + 1.0)
        col.allreduce(t, name, algorithm="chain")
        return col.is_group_initialized(name), col.get_rank(name), t.tolist()

    try:
        assert run_all(actors, use) == [(True, r, [6.0] * 3) for r in (2, 0, 1)]
        assert run_all([members[3]], col.get_rank, name) == [-1]
    finally:
        destroy_everywhere(actors, name)


def test_overlapping_groups_side_by_side(members):
    """Groups A (actors 0-2) and B (actors 1-3) interleave calls; their messages never mix.

    Actors 1 and 2 are in both and call A then B each round (blocking calls over
    overlapping groups need one order, as with NCCL communicators).
    """
    a, b = fresh("A"), fresh("B")
    try:
        run_all(members[:3], init(3, a), per_rank=lambda i: (i,))
        run_all(members[1:], init(3, b), per_rank=lambda i: (2 - i,))  # reversed ranks

        def step(names):
            out = []
            for _ in range(3):
                for name in names:
                    t = np.full(1000, col.get_rank(name) + 1.0)
                    col.allreduce(t, name, algorithm="reduction_server")
                    out.append(float(t[0]))
            return out

        results = ray.get([members[0].run.remote(step, [a]), members[1].run.remote(step, [a, b]),
                           members[2].run.remote(step, [a, b]), members[3].run.remote(step, [b])])
    finally:
        destroy_everywhere(members, a, b)
    assert [r[0] for r in results] == ["ok"] * 4
    assert all(v == 6.0 for r in results for v in r[1])


# --------------------------------------------------------------------------- teams
def team_sums(name):
    rank = col.get_rank(name)
    even = col.split_strided(name, 0, 2, 2, name + ".even")
    row, column = col.split_2d(name, 2, name + ".row", name + ".col")
    out = {"even_rank": even, "row_rank": row, "col_rank": column}
    for team in (name + ".even", name + ".row", name + ".col", col.node_team(name),
                 col.world_team(name)):
        t = np.full(4, rank + 1.0)
        if col.get_rank(team) >= 0:
            col.allreduce(t, team, algorithm="tree")
        out[team.removeprefix(name)] = t[0]
    t = np.full(2, rank + 1.0)
    col.allreduce(t, name, algorithm="ring")  # the parent still works after its teams ran
    out["parent"] = t[0]
    return out


def test_teams_split_strided_and_2d(members):
    name = fresh("teams")
    try:
        run_all(members, init(4, name), per_rank=lambda i: (i,))
        results = run_all(members, team_sums, name)
    finally:
        destroy_everywhere(members, name)
    # ranks laid out 2 wide: rows (0 1) (2 3), columns (0 2) (1 3); values are rank + 1
    for rank, out in enumerate(results):
        assert out["even_rank"] == (rank // 2 if rank % 2 == 0 else -1)
        assert (out["row_rank"], out["col_rank"]) == (rank % 2, rank // 2)
        assert out[".even"] == (4.0 if rank % 2 == 0 else rank + 1.0)
        assert out[".row"] == (3.0 if rank < 2 else 7.0)
        assert out[".col"] == (4.0 if rank % 2 == 0 else 6.0)
        assert out[":node"] == out[":world"] == out["parent"] == 10.0


# --------------------------------------------------------------------------- auto
def test_auto_fits_the_group_and_picks_a_valid_algorithm(members):
    name = fresh("auto")

    def auto():
        values = []
        for _ in range(16):  # a trial on the first call, probes of the runner-up later
            t = np.full(100_000, col.get_rank(name) + 1.0, dtype=np.float32)
            col.allreduce(t, name)  # algorithm="auto": measures and fits on first use
            values.append(float(t.min()) == float(t.max()) == 6.0)
        picks = {n: col.choose_algorithm(n, name) for n in (1 << 10, 1 << 20, 32 << 20)}
        params = col.get_cost_params(name)
        return all(values), picks, params, col.explain(3, 1 << 20, name), col.explain(3, 400_000, name)

    try:
        run_all(members[:3], init(3, name), per_rank=lambda i: (i,))
        results = run_all(members[:3], auto)
    finally:
        destroy_everywhere(members[:3], name)
    first = results[0]
    for correct, picks, params, table, measured in results:
        assert correct, "every auto call (trial, probes) must leave the sum"
        assert picks == first[1], "every rank must pick the same algorithm"
        assert set(picks.values()) <= set(algorithms.ALGORITHMS)
        assert params == first[2] and params is not None and params.beta >= 0
        assert "<- auto" in table and "reduction_server" in table and "ratio" in table
        assert "0 calls" in table, "choose_algorithm(1 MiB) ran its class's trial, no call"
        assert "measured:" in measured and "16 calls" in measured
        assert measured.split("measured:")[1] == first[4].split("measured:")[1], \
            "every rank's probes see the same (slowest-rank) ratios"


# --------------------------------------------------------------------------- gloo
def gloo_ops(name):
    rank, p = col.get_rank(name), col.get_collective_group_size(name)
    t = torch.full((4,), rank + 1.0)
    col.allreduce(t, name, op="max")
    n = np.full(3, rank + 1.0, dtype=np.float32)
    col.allreduce(n, name)
    b = torch.full((2,), float(rank))
    col.broadcast(b, 1, name)
    outs = [torch.zeros(2) for _ in range(p)]
    col.allgather(outs, torch.full((2,), float(rank)), name)
    got = torch.zeros(2)
    col.reducescatter(got, [torch.full((2,), float(r)) for r in range(p)], name)
    r = torch.zeros(3)
    if rank == 0:
        col.send(torch.arange(3.0), 1, name)
    elif rank == 1:
        col.recv(r, 0, name)
    red = torch.full((2,), rank + 1.0)
    col.reduce(red, 0, name)
    col.barrier(name)
    team = col.split_strided(name, 1, 1, 2, name + ".pair")  # ranks 1 and 2
    pair = torch.full((2,), rank + 1.0)
    if team >= 0:
        col.allreduce(pair, name + ".pair")
    return (t.tolist(), n.tolist(), b.tolist(), [o.tolist() for o in outs], got.tolist(),
            r.tolist(), red.tolist(), pair.tolist())


@pytest.mark.skipif(not col.gloo_available(), reason="torch without gloo")
def test_gloo_backend_basic_ops(members):
    name = fresh("gloo")
    try:
        run_all(members[:3], init(3, name, backend="gloo"), per_rank=lambda i: (i,))
        results = run_all(members[:3], gloo_ops, name)
    finally:
        destroy_everywhere(members[:3], name)
    for rank, (t, n, b, outs, got, r, red, pair) in enumerate(results):
        assert t == [3.0] * 4 and n == [6.0] * 3 and b == [1.0, 1.0]
        assert outs == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert got == [3.0 * rank] * 2
        assert r == ([0.0, 1.0, 2.0] if rank == 1 else [0.0] * 3)
        assert red == ([6.0, 6.0] if rank == 0 else [rank + 1.0] * 2)
        assert pair == ([1.0, 1.0] if rank == 0 else [5.0, 5.0])


def through_the_interface(name):
    """The group's object is a ``Communicator``, called as a graph calls one: torch tensors,
    a string op, the default algorithm, and the interface's split."""
    from cgraph.collective import groups
    from cgraph.comm.communicator import Communicator
    from cgraph.comm.teams import Team

    comm = groups.lookup(name).comm
    assert isinstance(comm, Communicator), type(comm)
    t = torch.full((3,), float(comm.rank + 1))
    comm.allreduce(t, "sum")
    r = torch.full((2,), float(comm.rank + 1))
    comm.reduce(r, 0, "sum")
    parts = [torch.zeros(2) for _ in range(comm.world_size)]
    comm.allgather(parts, torch.full((2,), float(comm.rank)))
    team = comm.split(Team((1, 0)))  # both ranks, in the other order
    u = torch.full((1,), float(comm.rank))
    team.broadcast(u, 0)  # team rank 0 is group rank 1
    budget = comm.tuner.budget_s  # "auto"'s first call measures within a share of the timeout
    return t.tolist(), r.tolist(), [p.tolist() for p in parts], team.rank, u.tolist(), budget


@pytest.mark.parametrize("backend", ["cpu", "gloo"])
def test_every_backends_group_is_a_communicator(members, backend):
    name = fresh(f"iface-{backend}")
    try:
        run_all(members[:2], init(2, name, backend=backend), per_rank=lambda i: (i,))
        results = run_all(members[:2], through_the_interface, name)
    finally:
        destroy_everywhere(members[:2], name)
    for rank, (t, r, parts, team_rank, u, budget) in enumerate(results):
        assert budget == pytest.approx(AUTO_SHARE * 30.0)  # the group's timeout_s, on both backends
        assert t == [3.0] * 3 and parts == [[0.0, 0.0], [1.0, 1.0]]
        assert r == ([3.0, 3.0] if rank == 0 else [2.0, 2.0])  # the others keep theirs
        assert team_rank == 1 - rank and u == [1.0]


# --------------------------------------------------------------------------- tables
def test_every_backend_and_tensor_pair_has_a_row():
    assert BACKENDS == ("cpu", "gloo", "nccl")
    for row in map(backend, BACKENDS):
        assert row.tensor in ("numpy", "torch") and callable(row.connect)
    for graph_only in set(KINDS) - set(BACKENDS):
        with pytest.raises(ValueError, match=f"'{graph_only}' is a compiled graph's transport only; choose one of"):
            backend(graph_only)
    assert set(CONVERT) == {(s, t) for s in ("numpy", "torch", "cupy") for t in ("numpy", "torch")}
    assert col.nccl_available() is False or torch.cuda.is_available()


def test_calibration_follows_the_measurements_where_the_shared_model_cannot():
    """On few cores star beats ring although every term of its model is larger."""
    from cgraph.comm.tuning import cost_model
    from cgraph.comm.tuning.autotune import Calibration
    from cgraph.comm.tuning.cost_model import CostParams, Sample

    truth = CostParams(alpha=1e-4, beta=1e-10, gamma=3e-10)
    slowdown = {"star": 0.1}  # measured / model on this made-up host; 1.5 for the others
    sizes = (1 << 18, 1 << 21, 1 << 24)
    samples = [
        Sample(a, 8, n, cost_model.predict(a, 8, n, truth, 8) * slowdown.get(a, 1.5), 8)
        for a in cost_model.candidates(8) for n in sizes
    ]
    cal = Calibration.of(samples)
    assert cost_model.choose(8, 1 << 24, cal.params, 8) != "star"
    assert cal.choose(1 << 24) == "star" and cal.choose(1 << 22) == "star"
    for a in ("star", "ring"):  # ratios hold at and between the measured sizes
        for n in (1 << 18, 1 << 20, 1 << 24):
            expected = cost_model.predict(a, 8, n, truth, 8) * slowdown.get(a, 1.5)
            assert cal.predict(a, n) == pytest.approx(expected, rel=0.05)
    assert "<- auto" in cal.explain(1 << 24)


def ray_style_ops(name):
    """What code written for ray.util.collective does: Ray's ReduceOp enum, torch tensors."""
    from ray.util.collective.types import ReduceOp as RayReduceOp

    rank = col.get_rank(name)
    t = torch.full((3,), rank + 2.0)
    col.allreduce(t, group_name=name, op=RayReduceOp.PRODUCT)
    m = torch.full((2,), float(rank))
    col.allreduce(m, name, RayReduceOp.MIN)
    return rank, t.tolist(), m.tolist()


@pytest.mark.skipif(not col.gloo_available(), reason="torch without gloo")
def test_rays_create_collective_group_and_reduce_ops(members):
    name = fresh("raystyle")
    actors = members[:2]
    col.create_collective_group(actors, 2, [1, 0], backend="gloo", group_name=name)
    try:
        results = run_all(actors, ray_style_ops, name)
    finally:
        destroy_everywhere(actors, name)
    assert sorted(results) == [(0, [6.0] * 3, [0.0] * 2), (1, [6.0] * 3, [0.0] * 2)]
    assert [r[0] for r in results] == [1, 0], "actors[i] got ranks[i]"
