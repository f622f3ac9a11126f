"""Teams: subsets of a transport's ranks, split as in NVSHMEM / OpenSHMEM 1.5.

A ``Team`` is a plain value: the ranks of the underlying transport (the
"world" ranks), listed in team-rank order. Splitting is a pure function of the
parent team, so every member computes the same sub-team with no communication,
and ``TeamTransport`` runs any algorithm over a team by translating ranks on
the existing transport: a sub-team needs no new rendezvous.

    parent = world_team(8)                      world ranks 0 1 2 3 4 5 6 7
    split_strided(parent, 1, 2, 3)  -> Team(1 3 5)

    split_2d(world_team(8), 3, rank)            x teams (rows)   y teams (columns)
        team ranks laid out 3 wide:             Team(0 1 2)      Team(0 3 6)
            0 1 2                               Team(3 4 5)      Team(1 4 7)
            3 4 5                               Team(6 7)        Team(2 5)
            6 7
        rank 4 gets (Team(3 4 5), Team(1 4 7))

Teams share the (src, dst) message queues of their transport: two teams whose
members overlap must run their collectives in the same order on every member.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from cgraph.comm.transport import Transport


@dataclass(frozen=True, slots=True)
class Team:
    """The world ranks of a team, in team-rank order (team rank i is ``ranks[i]``)."""

    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError("a team needs at least one rank")
        if len(set(self.ranks)) != len(self.ranks) or min(self.ranks) < 0:
            raise ValueError(f"team ranks must be distinct and non-negative, got {self.ranks}")

    @property
    def size(self) -> int:
        """The number of ranks in the team."""
        return len(self.ranks)

    def __contains__(self, world_rank: object) -> bool:
        return world_rank in self.ranks

    def team_rank(self, world_rank: int) -> int:
        """The team rank of ``world_rank``.

        Raises:
            ValueError: ``world_rank`` is not a member.
        """
        try:
            return self.ranks.index(world_rank)
        except ValueError:
            raise ValueError(f"rank {world_rank} is not a member of {self}") from None

    def world_rank(self, team_rank: int) -> int:
        """The world rank of ``team_rank``."""
        return self.ranks[team_rank]

    def __str__(self) -> str:
        return "Team(" + " ".join(map(str, self.ranks)) + ")"


def world_team(world_size: int) -> Team:
    """The team of every rank, 0 .. world_size-1."""
    return Team(tuple(range(world_size)))


def split_strided(parent: Team, start: int, stride: int, size: int) -> Team:
    """Parent team ranks ``start, start+stride, ...`` (``size`` of them) as a new team.

    Raises:
        ValueError: ``stride`` or ``size`` below 1, or a rank outside the parent.
    """
    if stride < 1 or size < 1:
        raise ValueError(f"split_strided needs stride >= 1 and size >= 1, got {stride}, {size}")
    last = start + stride * (size - 1)
    if start < 0 or last >= parent.size:
        raise ValueError(
            f"split_strided(start={start}, stride={stride}, size={size}) reaches parent "
            f"rank {last}, but {parent} has {parent.size} ranks"
        )
    return Team(tuple(parent.ranks[start + stride * i] for i in range(size)))


def split_2d(parent: Team, xrange: int, world_rank: int) -> tuple[Team, Team]:
    """The row (x) and column (y) teams of ``world_rank`` in a grid ``xrange`` wide.

    The parent's team ranks are laid out row by row, ``xrange`` per row (the
    last row may be short; ``xrange`` above the parent's size gives one row).
    Each member calls this with its own rank, as each PE calls
    ``nvshmem_team_split_2d``.

    Raises:
        ValueError: ``xrange < 1`` or ``world_rank`` is not in the parent.
    """
    if xrange < 1:
        raise ValueError(f"split_2d needs xrange >= 1, got {xrange}")
    me = parent.team_rank(world_rank)
    row_start, column = me - me % xrange, me % xrange
    x_team = split_strided(parent, row_start, 1, min(xrange, parent.size - row_start))
    rows_in_column = -(-(parent.size - column) // xrange)
    y_team = split_strided(parent, column, xrange, rows_in_column)
    return x_team, y_team


def node_teams(node_of: Sequence[Hashable]) -> tuple[Team, ...]:
    """One team per node, ordered by each node's lowest rank; ``node_of[r]`` is r's node."""
    members: dict[Hashable, list[int]] = {}
    for rank, node in enumerate(node_of):
        members.setdefault(node, []).append(rank)
    return tuple(Team(tuple(ranks)) for ranks in members.values())


def node_team(node_of: Sequence[Hashable], world_rank: int) -> Team:
    """The ranks that share ``world_rank``'s node (NVSHMEMX_TEAM_NODE)."""
    node = node_of[world_rank]
    return Team(tuple(r for r, n in enumerate(node_of) if n == node))


class TeamTransport:
    """A ``Transport`` over the members of ``team``, on top of ``base``'s endpoint.

    Raises:
        ValueError: ``base``'s rank is not in ``team`` or the team names a rank
            the base transport does not have.
    """

    def __init__(self, base: Transport, team: Team) -> None:
        if max(team.ranks) >= base.world_size:
            raise ValueError(f"{team} names ranks beyond world_size {base.world_size}")
        self._base = base
        self._team = team
        self._rank = team.team_rank(base.rank)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._team.size

    @property
    def team(self) -> Team:
        return self._team

    def node_of(self, rank: int) -> Hashable:
        return self._base.node_of(self._team.ranks[rank])

    def send(self, buf: np.ndarray, dst: int) -> None:
        self._base.send(buf, self._team.ranks[dst])

    def recv(self, buf: np.ndarray, src: int) -> None:
        self._base.recv(buf, self._team.ranks[src])

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        self._base.sendrecv(sendbuf, self._team.ranks[dst], recvbuf, self._team.ranks[src])

    def __repr__(self) -> str:
        return f"TeamTransport(rank={self._rank}, {self._team}, base={self._base!r})"
