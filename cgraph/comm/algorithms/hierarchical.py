"""Two-level reduce-scatter and all-gather: rings inside nodes, direct exchange on rails.

The flat ring moves in lock step, so on several nodes each of its p-1 steps
waits for a link between nodes. Here only the rails cross nodes (rail i: the
ranks of local index i on every node, as in ``reduction_server``):

    2 nodes x 2 ranks, A = ranks 0 1, B = ranks 2 3; chunk cr ends on rank r
    rails: rail 0 = ranks 0 2, rail 1 = ranks 1 3
    scratch, slot-major:     | c0 c2 | c1 c3 |   (region of local rank 0 | of local rank 1)
    reduce-scatter
      1 intra   ring in each node over the regions: rank 0 holds A's sum of c0 c2,
                rank 2 holds B's sum of c0 c2, rank 1 A's sum of c1 c3, ...
      2 inter   pairwise along each rail: 0 <-> 2, so 0 finishes c0 and 2 finishes c2
      then each rank copies its finished chunk back into the buffer
    all-gather: the reverse (2 inter along the rail, then 1 intra), then copy out

Per rank, (m-1)/m * n/L bytes cross nodes (m nodes of L ranks, n bytes) in m-1
messages, against the ring's (p-1)/p * n bytes in p-1 lock-step steps.

A rail's chunks are not contiguous in the buffer (rail 0 holds c0 and c2), but
the node ring needs one contiguous region per rank, so the chunks are staged
slot-major in a scratch buffer. When that order is already the buffer's (nodes
interleaved as (0, 1, 0, 1) with balanced bounds) the buffer itself is used and
nothing is copied.

Uneven layouts (nodes of different sizes) follow ``reduction_server.Layout``:
a node of L < G ranks (G the largest node) gives local rank i several slots,
and its chunk is cut into one piece per slot, each piece finished on its own
rail. A single node has no second level: the flat ring runs (it is the node
ring). Every element is reduced once by its node-ring owner in ring order, then
by its rail owner in pairwise order: one order, on one rank, so the results are
as deterministic as the ring's, and the all-gather only copies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from cgraph.comm.algorithms.pairwise import allgather_pairwise, reducescatter_pairwise
from cgraph.comm.algorithms.partition import Bounds, chunk_bounds, flat_view
from cgraph.comm.algorithms.reduction_server import Layout
from cgraph.comm.algorithms.ring import _bounds_for, allgather, reducescatter
from cgraph.comm.teams import TeamTransport
from cgraph.comm.transport import Transport, node_layout
from cgraph.comm.types import ReduceOp


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where every piece of every chunk is staged, computed identically on every rank.

    Entry ``s * m + j`` (slot s, node j of m) is the piece of slot s owned by
    its rail member on node j; ``source`` holds each entry's bounds in the
    buffer, ``staged`` its bounds in the scratch (packed, slot-major).
    """

    transport: Transport
    layout: Layout
    source: Bounds
    staged: Bounds

    @property
    def width(self) -> int:
        """m: the number of nodes, the entries per slot."""
        return len(self.layout.nodes)

    def node(self) -> TeamTransport:
        """The ranks of this rank's node."""
        me = self.transport.rank
        return TeamTransport(self.transport, self.layout.nodes[self.layout.node_index(me)])

    def my_slots(self) -> range:
        me = self.transport.rank
        team = self.layout.nodes[self.layout.node_index(me)]
        return self.layout.slot_block(team, team.team_rank(me))

    def mine(self) -> list[int]:
        """The entries holding the pieces of this rank's own chunk."""
        j = self.layout.node_index(self.transport.rank)
        return [s * self.width + j for s in self.my_slots()]

    def regions(self) -> Bounds:
        """Each local rank's contiguous block of the scratch: the entries of its slots."""
        team = self.layout.nodes[self.layout.node_index(self.transport.rank)]
        m = self.width
        blocks = [self.layout.slot_block(team, i) for i in range(team.size)]
        return tuple((self.staged[b[0] * m][0], self.staged[b[-1] * m + m - 1][1]) for b in blocks)

    def rails(self) -> list[tuple[TeamTransport, Bounds]]:
        """For each slot this rank serves: its rail and the slot's entries, in node order."""
        m = self.width
        return [
            (TeamTransport(self.transport, self.layout.rail(s)), self.staged[s * m : (s + 1) * m])
            for s in self.my_slots()
        ]

    def stage(self, flat: np.ndarray, entries: Iterable[int]) -> np.ndarray:
        """A scratch holding ``entries`` copied from ``flat`` (``flat`` itself if in order)."""
        if self.source == self.staged:
            return flat
        scratch = np.empty(self.staged[-1][1], dtype=flat.dtype)
        _copy(flat, self.source, scratch, self.staged, entries)
        return scratch

    def unstage(self, scratch: np.ndarray, flat: np.ndarray, entries: Iterable[int]) -> None:
        """Copy ``entries`` of the scratch back to their places in ``flat``."""
        if scratch is not flat:
            _copy(scratch, self.staged, flat, self.source, entries)


def _copy(src: np.ndarray, src_at: Bounds, dst: np.ndarray, dst_at: Bounds,
          entries: Iterable[int]) -> None:
    for e in entries:
        dst[dst_at[e][0] : dst_at[e][1]] = src[src_at[e][0] : src_at[e][1]]


def _packed(bounds: Bounds) -> Bounds:
    """The same sizes laid end to end from 0."""
    out, start = [], 0
    for a, b in bounds:
        out.append((start, start + b - a))
        start += b - a
    return tuple(out)


def _plan(transport: Transport, chunks: Bounds) -> _Plan | None:
    """The staging of ``chunks`` on the transport's node layout; None on a single node."""
    layout = Layout.of(node_layout(transport))
    m = len(layout.nodes)
    if m == 1:
        return None
    source = [(0, 0)] * (layout.slots * m)
    for j, team in enumerate(layout.nodes):
        for i, rank in enumerate(team.ranks):
            block = layout.slot_block(team, i)
            a, b = chunks[rank]
            for s, piece in zip(block, chunk_bounds(b - a, len(block), offset=a), strict=True):
                source[s * m + j] = piece
    return _Plan(transport, layout, tuple(source), _packed(tuple(source)))


def reducescatter_hierarchical(
    transport: Transport,
    buf: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    bounds: Bounds | None = None,
) -> np.ndarray:
    """Reduce ``buf`` across ranks so rank r's chunk r holds the result; return that view.

    The semantics of ``ring.reducescatter``, in two levels (module docstring);
    the flat ring on a single node.

    Args:
        bounds: ``(start, stop)`` of each rank's chunk in the flattened buffer;
            balanced by default. The rest of ``buf`` may hold partial results.

    Raises:
        ValueError: ``buf`` not a writeable contiguous array, or one bound per rank missing.
    """
    flat = flat_view(buf)
    chunks = _bounds_for(transport, flat, bounds)
    plan = _plan(transport, chunks)
    if plan is None:
        return reducescatter(transport, flat, op, chunks)
    scratch = plan.stage(flat, range(len(plan.source)))
    reducescatter(plan.node(), scratch, op, plan.regions())
    for rail, shards in plan.rails():
        reducescatter_pairwise(rail, scratch, op, shards)
    plan.unstage(scratch, flat, plan.mine())
    a, b = chunks[transport.rank]
    return flat[a:b]


def allgather_hierarchical(
    transport: Transport, buf: np.ndarray, bounds: Bounds | None = None
) -> None:
    """Fill every rank's ``buf`` with chunk r taken from rank r (in place), in two levels.

    The semantics of ``ring.allgather`` (module docstring); the flat ring on a single node.

    Args:
        bounds: ``(start, stop)`` of each rank's chunk; balanced by default.

    Raises:
        ValueError: ``buf`` not a writeable contiguous array, or one bound per rank missing.
    """
    flat = flat_view(buf)
    chunks = _bounds_for(transport, flat, bounds)
    plan = _plan(transport, chunks)
    if plan is None:
        allgather(transport, flat, chunks)
        return
    scratch = plan.stage(flat, plan.mine())
    for rail, shards in plan.rails():
        allgather_pairwise(rail, scratch, shards)
    allgather(plan.node(), scratch, plan.regions())
    plan.unstage(scratch, flat, range(len(plan.source)))
