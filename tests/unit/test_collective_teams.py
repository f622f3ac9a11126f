"""Teams: pure splits (as NVSHMEM's) and collectives on a sub-team of a transport.

world 0..7, split_2d xrange 3:   rows (x)      columns (y)
    0 1 2                         (0 1 2)       (0 3 6)
    3 4 5                         (3 4 5)       (1 4 7)
    6 7                           (6 7)         (2 5)
"""

from __future__ import annotations

import numpy as np
import pytest

from cgraph.comm.algorithms import ALGORITHMS, allreduce, barrier, broadcast
from cgraph.comm.teams import (
    Team,
    TeamTransport,
    node_team,
    node_teams,
    split_2d,
    split_strided,
    world_team,
)
from cgraph.comm.types import ReduceOp
from tests.fabric import LocalTransport, run_ranks


def test_split_strided() -> None:
    world = world_team(16)
    assert split_strided(world, 0, 2, 6) == Team((0, 2, 4, 6, 8, 10))  # NVSHMEM figure 3
    evens = split_strided(world, 0, 2, 8)
    assert split_strided(evens, 1, 3, 3) == Team((2, 8, 14))  # indices into the parent
    assert str(split_strided(world, 5, 1, 1)) == "Team(5)"
    with pytest.raises(ValueError, match="reaches parent rank 16"):
        split_strided(world, 1, 3, 6)
    with pytest.raises(ValueError, match="stride >= 1"):
        split_strided(world, 0, 0, 2)


def test_split_2d() -> None:
    world = world_team(8)
    rows = {r: split_2d(world, 3, r)[0] for r in range(8)}
    cols = {r: split_2d(world, 3, r)[1] for r in range(8)}
    assert rows[4] == Team((3, 4, 5)) and rows[7] == Team((6, 7))
    assert cols[4] == Team((1, 4, 7)) and cols[5] == Team((2, 5))
    assert all(r in rows[r] and r in cols[r] for r in range(8))
    assert split_2d(world, 20, 3) == (world, Team((3,)))
    sub = Team((10, 11, 12, 13))
    assert split_2d(sub, 2, 13) == (Team((12, 13)), Team((11, 13)))
    with pytest.raises(ValueError, match="not a member"):
        split_2d(sub, 2, 0)


def test_team_rank_translation() -> None:
    team = Team((4, 1, 7))
    assert team.size == 3 and team.team_rank(7) == 2 and team.world_rank(1) == 1
    assert 1 in team and 2 not in team
    with pytest.raises(ValueError, match="distinct"):
        Team((1, 1))


def test_node_teams() -> None:
    layout = ("b", "a", "b", "c", "a")
    assert node_teams(layout) == (Team((0, 2)), Team((1, 4)), Team((3,)))
    assert node_team(layout, 4) == Team((1, 4))


@pytest.mark.parametrize("rendezvous", [False, True], ids=["buffered", "rendezvous"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_allreduce_on_sub_teams_gives_each_team_its_own_sum(
    algorithm: str, rendezvous: bool
) -> None:
    """12 ranks in a 4-wide grid: allreduce along rows, then along columns, on one fabric."""
    endpoints = LocalTransport.create(
        12, node_of=lambda r: r // 2, rendezvous=rendezvous, timeout=20
    )
    world = world_team(12)
    options = {"slice_bytes": 16} if algorithm in ("chain", "ring", "reduction_server") else {}

    def body(t: LocalTransport) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x_team, y_team = split_2d(world, 4, t.rank)
        row = np.full(9, float(t.rank))
        allreduce(TeamTransport(t, x_team), row, ReduceOp.SUM, algorithm, **options)
        col = np.full(5, t.rank, dtype=np.int64)
        allreduce(TeamTransport(t, y_team), col, ReduceOp.MAX, algorithm)
        barrier(TeamTransport(t, y_team))
        odd = np.full(3, float(t.rank))
        if t.rank % 2:
            odd_team = split_strided(world, 1, 2, 6)
            allreduce(TeamTransport(t, odd_team), odd, ReduceOp.SUM, algorithm)
        return row, col, odd

    for rank, (row, col, odd) in enumerate(run_ranks(endpoints, body)):
        start = rank - rank % 4
        assert (row == sum(range(start, start + 4))).all()
        assert (col == 8 + rank % 4).all()
        assert (odd == (36 if rank % 2 else rank)).all()


def test_team_transport_ranks_and_broadcast() -> None:
    endpoints = LocalTransport.create(6, node_of=lambda r: r // 3)
    team = Team((5, 3, 1))

    def body(t: LocalTransport) -> tuple[int, int, object, np.ndarray] | None:
        if t.rank not in team:
            return None
        tt = TeamTransport(t, team)
        buf = np.array([float(t.rank)])
        broadcast(tt, buf, root=1)  # team rank 1 is world rank 3
        return tt.rank, tt.world_size, tt.node_of(2), buf

    results = run_ranks(endpoints, body)
    assert results[5][:3] == (0, 3, 0) and results[1][0] == 2
    assert all(results[r][3][0] == 3.0 for r in (1, 3, 5))
    with pytest.raises(ValueError, match="not a member"):
        TeamTransport(endpoints[0], team)
