"""Two-level reduction-server allreduce (Herring / Fairring, seed 001).

Each slice of the buffer goes through four stages:

    1 intra reduce-scatter   ring inside each node: local rank i ends with the
                             node's sum of its region (its "slots")
    2 inter reduce-scatter   each slot is cut into one shard per node; the owners
                             of a slot on every node (its "rail") swap shards
                             directly, so the owner on node k reduces shard k
    3 inter all-gather       each owner sends its finished shard back along the rail
    4 intra all-gather       ring inside each node

    2 nodes x 2 ranks, slots s0 s1          rails: local rank 0 of every node
      node A: a0 a1    node B: b0 b1               owns s0, local rank 1 owns s1
      1: a0 <- sum_A(s0)  a1 <- sum_A(s1)   (and B alike)
      2: a0 <-> b0 on s0: a0 reduces s0[:half], b0 reduces s0[half:]; a1 <-> b1 on s1
      3: a0 <-> b0 swap finished halves;  a1 <-> b1 likewise
      4: a0 <-> a1 swap s0 / s1;  b0 <-> b1 likewise

A slot holds count / G elements where G is the largest node's rank count. On a
regular layout (every node the same size, as Fairring requires) local rank i
owns slot i and the rails are exactly "rank i of every node". Uneven layouts
are supported too: on a node of L < G ranks local rank i owns the contiguous
slots [i*G//L, (i+1)*G//L), so some ranks serve several rails (more work).
Nodes need not be contiguous in rank order: ``node_of`` decides membership.

The buffer is cut into slices of ``slice_bytes``; ``pipeline_order`` interleaves
the stages of up to ``depth`` slices (the staging buffers in flight), oldest
stage first. Every rank runs the same event order, and each stage is a series
of permutation exchanges (``sendrecv``), so a rendezvous transport cannot
deadlock. Every element is reduced by exactly one rank (the shard's server)
and then copied, so all ranks agree bitwise.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from cgraph.comm.algorithms.pairwise import allgather_pairwise, reducescatter_pairwise
from cgraph.comm.algorithms.partition import (
    Bounds,
    chunk_bounds,
    elems_per,
    flat_view,
    slice_bounds,
)
from cgraph.comm.algorithms.ring import allgather, reducescatter
from cgraph.comm.teams import Team, TeamTransport, node_teams
from cgraph.comm.transport import Transport, node_layout
from cgraph.comm.types import ReduceOp

SLICE_BYTES = 4 << 20
"""Default slice (staging buffer) size: 4 MiB."""
DEPTH = 2
"""Default number of slices in flight."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Who serves what, computed identically on every rank from the node layout."""

    nodes: tuple[Team, ...]
    slots: int  # G: slots per slice, the size of the largest node

    @classmethod
    def of(cls, node_of: Sequence[Hashable]) -> Layout:
        nodes = node_teams(node_of)
        return cls(nodes, max(team.size for team in nodes))

    def node_index(self, rank: int) -> int:
        return next(j for j, team in enumerate(self.nodes) if rank in team)

    def slot_block(self, node: Team, local: int) -> range:
        """The slots that local rank ``local`` of ``node`` owns."""
        return range(local * self.slots // node.size, (local + 1) * self.slots // node.size)

    def rail(self, slot: int) -> Team:
        """The owner of ``slot`` on every node, in node order."""
        owners = []
        for node in self.nodes:
            local = next(i for i in range(node.size) if slot in self.slot_block(node, i))
            owners.append(node.ranks[local])
        return Team(tuple(owners))

    def regions(self, node: Team, slot_bounds: Bounds) -> Bounds:
        """Each local rank's contiguous region of a slice (the union of its slots)."""
        blocks = [self.slot_block(node, i) for i in range(node.size)]
        return tuple((slot_bounds[b[0]][0], slot_bounds[b[-1]][1]) for b in blocks)


def pipeline_order(num_slices: int, num_stages: int, depth: int) -> tuple[tuple[int, int], ...]:
    """The (stage, slice) events of a wavefront with at most ``depth`` slices in flight.

    Each tick advances every slice in flight by one stage, oldest first, then
    starts a new slice if fewer than ``depth`` are in flight::

        pipeline_order(3, 2, 2) -> ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))
        pipeline_order(3, 3, 3) -> ((0,0), (1,0),(0,1), (2,0),(1,1),(0,2), (2,1),(1,2), (2,2))
    """
    order: list[tuple[int, int]] = []
    active: list[list[int]] = []  # [slice, next stage], oldest first
    started = 0
    while active or started < num_slices:
        for item in active:
            order.append((item[1], item[0]))
            item[1] += 1
        active = [item for item in active if item[1] < num_stages]
        if len(active) < max(1, depth) and started < num_slices:
            order.append((0, started))
            if num_stages > 1:
                active.append([started, 1])
            started += 1
    return tuple(order)


@dataclass(frozen=True, slots=True)
class _Step:
    """What one stage needs: this rank's view of the layout and one slice."""

    transport: Transport
    layout: Layout
    node: Team
    part: np.ndarray
    op: ReduceOp

    def regions(self) -> Bounds:
        return self.layout.regions(self.node, chunk_bounds(self.part.size, self.layout.slots))

    def my_slots(self) -> range:
        return self.layout.slot_block(self.node, self.node.team_rank(self.transport.rank))


def _intra_reducescatter(step: _Step) -> None:
    reducescatter(TeamTransport(step.transport, step.node), step.part, step.op, step.regions())


def _intra_allgather(step: _Step) -> None:
    allgather(TeamTransport(step.transport, step.node), step.part, step.regions())


def _rails(step: _Step) -> list[tuple[TeamTransport, Bounds]]:
    """For each slot this rank serves: its rail and the slot's per-node shards."""
    slot_bounds = chunk_bounds(step.part.size, step.layout.slots)
    m = len(step.layout.nodes)
    rails = []
    for slot in step.my_slots():
        a, b = slot_bounds[slot]
        rail = TeamTransport(step.transport, step.layout.rail(slot))
        rails.append((rail, chunk_bounds(b - a, m, offset=a)))
    return rails


def _inter_reducescatter(step: _Step) -> None:
    for rail, shards in _rails(step):
        reducescatter_pairwise(rail, step.part, step.op, shards)


def _inter_allgather(step: _Step) -> None:
    for rail, shards in _rails(step):
        allgather_pairwise(rail, step.part, shards)


STAGES: tuple[Callable[[_Step], None], ...] = (
    _intra_reducescatter,
    _inter_reducescatter,
    _inter_allgather,
    _intra_allgather,
)
"""The four stages of one slice, in order."""


def allreduce_reduction_server(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    *,
    slice_bytes: int = SLICE_BYTES,
    depth: int = DEPTH,
) -> None:
    """In-place two-level allreduce over the transport's node layout (see module docstring).

    Args:
        slice_bytes: bytes per slice (staging buffer); equal on every rank.
        depth: slices in flight at once; equal on every rank.
    """
    flat = flat_view(buf)
    if transport.world_size == 1 or flat.size == 0:
        return
    layout = Layout.of(node_layout(transport))
    node = layout.nodes[layout.node_index(transport.rank)]
    slices = slice_bounds(flat.size, elems_per(slice_bytes, flat.itemsize))
    for stage, index in pipeline_order(len(slices), len(STAGES), depth):
        a, b = slices[index]
        STAGES[stage](_Step(transport, layout, node, flat[a:b], op))
