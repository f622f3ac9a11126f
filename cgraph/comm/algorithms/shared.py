"""Allreduce through a node's shared workspace: one copy in, a reduction in place, one copy out.

Over links every step of a reduction pays a copy into a slot, a copy out and a
wake-up. Ranks of one node can do better with memory they all map
(``transport.arena``, ``comm.arena``)::

    L ranks of a node, n bytes in L chunks, workspace = L slots of n bytes
    1 copy in      rank i writes its buffer into slot i, all but chunk i     barrier
    2 reduce       rank i reduces chunk i of every input into slot i's chunk i
                   (its own from its buffer, the others' from their slots; rank 0 +
                   rank 1 + ... in that order: one order, on one rank)
    3 rails        several nodes: rank i allreduces its finished chunk with the ranks of
                   local index i on the other nodes (a ring over the rail), in place,
                   and copies it into its buffer                             barrier
    4 copy out     every rank copies chunk j from slot j, for every j but its own
                   (barrier: only where the workspace holds one set of slots, which
                   the next call overwrites)

Per rank: 2(L-1)/L n bytes copied and (L-1)/L n reduced inside the node, 2 barriers
(4 above ``DOUBLE_BUFFER_BYTES``, where one set of slots spans the workspace and a
call waits for the last one to be done with it), and across nodes only its chunk's
rail (n/L bytes): the hierarchical shape of ``reduction_server`` with shared memory
for its node phases. The barriers are the workspace's semaphores (``ShmArena.meet``)
where the transport has them, messages over the links otherwise. Each element is
reduced by one rank in one order, so every rank gets the same bits.

From ``CMA_MIN_BYTES`` on, where the kernel lets the node's ranks read each other's
memory (``peer_memory``), there is no workspace at all: rank i reads chunk i of every
peer's tensor into a scratch block and adds it into its own, runs the rail, and then
reads every other chunk's result from its owner's tensor (one copy per byte moved,
three barriers).

Transports without a workspace (process groups, teams), node layouts of unequal
sizes and one rank per node (nothing to share) run ``reduction_server`` instead
(the ring on one node).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from cgraph.comm.algorithms.barrier import barrier
from cgraph.comm.algorithms.partition import chunk_bounds, flat_view
from cgraph.comm.algorithms.reduction_server import allreduce_reduction_server
from cgraph.comm.algorithms.ring import allreduce_ring
from cgraph.comm.cpu import peer_memory
from cgraph.comm.teams import Team, TeamTransport, node_teams
from cgraph.comm.transport import Transport, node_layout
from cgraph.comm.types import ReduceOp, combine


class Workspace(Protocol):
    """What this module uses of a node's shared workspace (``comm.cpu.arena.ShmArena``)."""

    board: np.ndarray | None
    peer_reads: bool | None

    def view(self, nbytes: int, barrier: Callable[[], None]) -> np.ndarray: ...

    def turn(self) -> int: ...


class PeerReading(Transport, Protocol):
    """A transport whose ranks of one node may read each other's memory."""

    def peer_read(self, peer: int, pid: int, address: int, out: np.ndarray) -> None: ...

BLOCK_BYTES = 128 << 10
"""The reduction's block (``_reduce_chunk``): small enough that the partial sum stays in the cache."""
CMA_MIN_BYTES = 12 << 20
"""From this size the ranks read each other's tensors where the kernel lets them
(``_allreduce_reading_peers``): fewer bytes through memory, but each read pins the
peer's pages, which below this costs more than the copies it saves (the crossover
measured: docs/design-notes.md, "Numbers behind the code")."""
CMA_BLOCK_BYTES = 1 << 20
"""A read's size: the scratch block stays in the cache while it is added."""
DOUBLE_BUFFER_BYTES = 64 << 20
"""Workspaces up to this size hold two sets of slots, used in turn: a call may then start
copying in while a slower rank still copies the last call's result out, which saves the
last barrier."""


def shares(transport: Transport) -> bool:
    """Whether "shared" runs as itself here: a node workspace, and nodes of equal size > 1."""
    sizes = {t.size for t in _plan(node_layout(transport), transport.rank).teams}
    return getattr(transport, "arena", None) is not None and len(sizes) == 1 and sizes != {1}


@dataclass(frozen=True)
class _Plan:
    """Who is who for one layout and rank (the same every call: computed once)."""

    teams: tuple[Team, ...]
    mine: Team
    local: int
    rail: Team


@functools.lru_cache(maxsize=64)
def _plan(layout: tuple[Hashable, ...], rank: int) -> _Plan:
    teams = node_teams(layout)
    mine = next(t for t in teams if rank in t.ranks)
    local = mine.team_rank(rank)
    return _Plan(teams, mine, local, Team(tuple(t.ranks[local] for t in teams if t.size > local)))


def meet(transport: Transport, node: Transport) -> None:
    """The node's barrier: the workspace's semaphores where the transport has them
    (``node_barrier``: L-1 posts, one sleep), else messages over the node's links."""
    node_barrier = getattr(transport, "node_barrier", None)
    if node_barrier is not None:
        node_barrier()
    else:
        barrier(node)


def allreduce_shared(transport: Transport, buf: np.ndarray, op: ReduceOp = ReduceOp.SUM) -> None:
    """Allreduce ``buf`` in place through the node's shared workspace (module docstring)."""
    if not shares(transport):
        allreduce_reduction_server(transport, buf, op)
        return
    plan = _plan(node_layout(transport), transport.rank)
    arena = transport.arena  # type: ignore[attr-defined]
    flat = flat_view(buf)
    if flat.size == 0:
        return
    size, local = plan.mine.size, plan.local
    node = transport if len(plan.teams) == 1 else TeamTransport(transport, plan.mine)
    if flat.nbytes >= CMA_MIN_BYTES and _peer_reads(transport, arena, node, local):
        _allreduce_reading_peers(cast(PeerReading, transport), node, plan, arena, flat, op)  # it has peer_read
        return
    half = size * flat.nbytes
    halves = 2 if 2 * half <= DOUBLE_BUFFER_BYTES else 1
    region = arena.view(halves * half, lambda: barrier(node))
    # the halves sit at fixed places (a call of another size must not overlap a slower
    # rank's last call); the region only grows between calls (a barrier inside ``view``)
    at = region.nbytes // 2 * arena.turn() if halves == 2 else 0
    if halves == 1:
        meet(transport, node)  # one set of slots over the whole region: the last call's must be done
    slots = region[at : at + half].view(flat.dtype).reshape(size, flat.size)
    bounds = chunk_bounds(flat.size, size)
    lo, hi = bounds[local]
    slots[local, :lo], slots[local, hi:] = flat[:lo], flat[hi:]  # chunk ``local`` stays here
    meet(transport, node)
    _reduce_chunk(op, flat, slots, local, lo, hi)
    if len(plan.teams) > 1:
        allreduce_ring(TeamTransport(transport, plan.rail), slots[local, lo:hi], op)
    flat[lo:hi] = slots[local, lo:hi]
    meet(transport, node)
    for j, (a, b) in enumerate(bounds):
        if j != local:
            flat[a:b] = slots[j, a:b]  # chunk j's result, where rank j left it
    if halves == 1:
        meet(transport, node)  # the next call writes these slots; with two halves it writes the other


def _reduce_chunk(op: ReduceOp, flat: np.ndarray, slots: np.ndarray, local: int, lo: int, hi: int) -> None:
    """Chunk ``local`` of every rank's input, reduced in rank order into ``slots[local]``.

    This rank's own part is read from ``flat`` (it never went into its slot). Block by
    block, so the partial sum stays in the cache: each input is read once and the
    result written once, instead of the result read and written once per slot.
    """
    inputs = [flat if s == local else slots[s] for s in range(slots.shape[0])]
    out = slots[local]
    step = max(1, BLOCK_BYTES // flat.itemsize)
    for b in range(lo, hi, step):
        block = slice(b, min(b + step, hi))
        combine(op, inputs[0][block], inputs[1][block], out[block])
        for s in range(2, len(inputs)):
            combine(op, out[block], inputs[s][block], out[block])


def _peer_reads(transport: Transport, arena: Workspace, node: Transport, local: int) -> bool:
    """Whether every rank of the node may read every other's memory (asked once, agreed by all).

    Each rank posts its pid and the address of a number on the board, tries to read
    every peer's, and posts its verdict; the node uses ``peer_memory`` only if all said
    yes. Transports without the workspace's semaphores (the tests' threads) never do.
    """
    if getattr(transport, "peer_read", None) is None or not hasattr(arena, "board"):
        return False
    if arena.peer_reads is None:
        arena.view(1, lambda: barrier(node))  # maps the board (beside the semaphores) on first use
        token = np.array([os.getpid() * 7919 + local], dtype=np.int64)
        board = arena.board
        assert board is not None  # mapped by the view above
        board[local] = (os.getpid(), token.ctypes.data, 0, 0)
        meet(transport, node)
        ok = all(peer_memory.probe(int(board[s, 0]), int(board[s, 1]), int(board[s, 0]) * 7919 + s)
                 for s in range(board.shape[0]) if s != local)
        board[local, 2] = 1 if ok else 2
        meet(transport, node)
        arena.peer_reads = bool((board[:, 2] == 1).all())
        meet(transport, node)  # the board's verdicts are read: the next call may post again
    return bool(arena.peer_reads)


def _allreduce_reading_peers(transport: PeerReading, node: Transport, plan: _Plan, arena: Workspace,
                             flat: np.ndarray, op: ReduceOp) -> None:
    """The allreduce with no workspace copies: each rank reads its chunk of every peer's
    tensor straight from that peer's memory (``peer_memory``), block by block into a
    scratch block it adds into its own tensor, and afterwards reads the other chunks'
    results from their owners' tensors. Three barriers: inputs posted; chunks reduced;
    every read done (a rank must not return, and let its caller change the tensor,
    while a peer still reads it)."""
    size, local = plan.mine.size, plan.local
    board = arena.board
    assert board is not None  # mapped when the node agreed to read peers
    board[local, :2] = (os.getpid(), flat.ctypes.data)
    meet(transport, node)
    peers = [(int(board[s, 0]), int(board[s, 1])) for s in range(size)]
    bounds = chunk_bounds(flat.size, size)
    lo, hi = bounds[local]
    ranks, item = plan.mine.ranks, flat.itemsize
    step = max(1, CMA_BLOCK_BYTES // item)
    scratch = np.empty(min(step, max(hi - lo, 1)), dtype=flat.dtype)
    for b in range(lo, hi, step):
        e = min(b + step, hi)
        for s in range(size):
            if s != local:
                transport.peer_read(ranks[s], peers[s][0], peers[s][1] + b * item, scratch[: e - b])
                combine(op, flat[b:e], scratch[: e - b], flat[b:e])
    if len(plan.teams) > 1:
        allreduce_ring(TeamTransport(transport, plan.rail), flat[lo:hi], op)
    meet(transport, node)
    for j, (a, b) in enumerate(bounds):
        if j != local:
            transport.peer_read(ranks[j], peers[j][0], peers[j][1] + a * item, flat[a:b])
    meet(transport, node)
