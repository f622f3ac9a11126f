"""Allreduce through a node's shared workspace: one copy in, a reduction in place, one copy out.

Over links every step of a reduction pays a copy into a slot, a copy out and a
wake-up. Ranks of one node can do better with memory they all map
(``transport.arena``, ``comm.arena``)::

    L ranks of a node, n bytes, workspace = L slots of n bytes
    1 copy in      rank i writes its buffer into slot i            barrier
    2 reduce       rank i reduces chunk i of every slot into slot 0's chunk i
                   (slot 0 + slot 1 + ... in that order: one order, on one rank)
    3 rails        several nodes: rank i allreduces its finished chunk with the ranks of
                   local index i on the other nodes (a ring over the rail), in place
                   barrier
    4 copy out     every rank copies slot 0 into its buffer        (barrier: only where
                   the workspace holds one set of slots, which the next call overwrites)

Per rank: 2n bytes copied and (L-1)/L n reduced inside the node, 2 barriers of
ceil(log2 L) rounds (4 above ``DOUBLE_BUFFER_BYTES``, where one set of slots spans
the workspace and a call waits for the last one to be done with it), and across nodes only its chunk's rail (n/L bytes): the
hierarchical shape of ``reduction_server`` with shared memory for its node phases.
Each element is reduced by one rank in one order, so every rank gets the same bits.

Transports without a workspace (process groups, teams), node layouts of unequal
sizes and one rank per node (nothing to share) run ``reduction_server`` instead
(the ring on one node).
"""

from __future__ import annotations

import numpy as np

from cgraph.comm.algorithms.barrier import barrier
from cgraph.comm.algorithms.partition import chunk_bounds, flat_view
from cgraph.comm.algorithms.reduction_server import allreduce_reduction_server
from cgraph.comm.algorithms.ring import allreduce_ring
from cgraph.comm.teams import Team, TeamTransport, node_teams
from cgraph.comm.transport import Transport, node_layout
from cgraph.comm.types import ReduceOp, combine

BLOCK_BYTES = 128 << 10
"""The reduction adds every slot into one block of the chunk before the next block, so
that block stays in the cache: each input is read once and the result written once,
instead of the result read and written once per slot."""
DOUBLE_BUFFER_BYTES = 64 << 20
"""Workspaces up to this size hold two sets of slots, used in turn: a call may then start
copying in while a slower rank still copies the last call's result out, which saves the
last barrier."""


def shares(transport: Transport) -> bool:
    """Whether "shared" runs as itself here: a node workspace, and nodes of equal size > 1."""
    sizes = {t.size for t in node_teams(node_layout(transport))}
    return getattr(transport, "arena", None) is not None and len(sizes) == 1 and sizes != {1}


def allreduce_shared(transport: Transport, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM) -> None:
    """Allreduce ``buf`` in place through the node's shared workspace (module docstring)."""
    if not shares(transport):
        allreduce_reduction_server(transport, buf, op)
        return
    teams = node_teams(node_layout(transport))
    arena = transport.arena  # type: ignore[attr-defined]
    flat = flat_view(buf)
    if flat.size == 0:
        return
    mine = next(t for t in teams if transport.rank in t.ranks)
    local = mine.team_rank(transport.rank)
    node = transport if len(teams) == 1 else TeamTransport(transport, mine)
    half = mine.size * flat.nbytes
    halves = 2 if 2 * half <= DOUBLE_BUFFER_BYTES else 1
    region = arena.view(halves * half, lambda: barrier(node))
    # the halves sit at fixed places (a call of another size must not overlap a slower
    # rank's last call); the region only grows between calls (a barrier inside ``view``)
    at = region.nbytes // 2 * arena.turn() if halves == 2 else 0
    if halves == 1:
        barrier(node)  # one set of slots over the whole region: the last call's must be done
    slots = region[at : at + half].view(flat.dtype).reshape(mine.size, flat.size)
    slots[local] = flat
    barrier(node)
    lo, hi = chunk_bounds(flat.size, mine.size)[local]
    done = slots[0, lo:hi]
    step = max(1, BLOCK_BYTES // flat.itemsize)
    for b in range(lo, hi, step):  # block by block: the partial sum stays in the cache
        block = slice(b, min(b + step, hi))
        for s in range(1, mine.size):
            combine(op, slots[0, block], slots[s, block], slots[0, block])
    if len(teams) > 1:
        rail = Team(tuple(t.ranks[local] for t in teams))
        allreduce_ring(TeamTransport(transport, rail), done, op)
    barrier(node)
    flat[:] = slots[0]
    if halves == 1:
        barrier(node)  # the next call writes these slots; with two halves it writes the other
