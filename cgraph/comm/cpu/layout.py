"""Where a "cpu" group's ranks sit, and the links that follow from it.

A "cpu" group's ranks talk through shared memory wherever they share a node.
Which ranks share one is known only once every rank has joined, so a rank's
first call (not its ``init``, which never waits for peers) settles it::

    connect(membership)       this rank's node id and pid -> the store's keys (never waits)
    first call: links()       every rank's node id <- the store's keys  (waits up to timeout_s)
      all on the store's node      the store's mesh, as joined (one Ray node: as before)
      otherwise, per node          the node's first rank to get here makes that node's
                                   mesh and posts its ends under the store's keys; the
                                   others attach them
      several nodes                plus one authenticated TCP connection per pair of
                                   ranks on two nodes (``comm.socket_links``), made
                                   when a call first needs it

    2 nodes x 2 ranks:   0 ══shm══ 1          2 ══shm══ 3
                          ╲──────── TCP ──────────────╱   0-2, 0-3, 1-2, 1-3

Each rank watches the other ranks of its node (their pids, ``comm.peer_watch``):
when one dies the group is aborted at once, so the ranks blocked on its memory
wake with an error naming it instead of waiting for the timeout (a peer on
another node is noticed through its TCP connections closing).

The rank that made a node's mesh owns its segments (named after its pid, so
the next store or compile on that node frees them if it dies) and unlinks them
when it destroys the group. The keys (node ids, mesh ends, listening addresses)
travel by Ray calls to the store actor, as the gloo backend's do. A pair of ranks
on two nodes connects when a call first needs it (two ranks may talk while the
others are idle); a rank listens only until its lower-ranked peers are in, and
every connection proves it knows the group's secret, which only Ray delivers.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cgraph.channels.segments import segment_name
from cgraph.comm import rendezvous
from cgraph.comm.cpu.arena import ShmArena
from cgraph.comm.cpu.framed import FramedTransport
from cgraph.comm.cpu.mesh import LinkEnds, create_links
from cgraph.comm.cpu.peer_watch import PeerWatch
from cgraph.errors import CollectiveTimeoutError

if TYPE_CHECKING:
    from cgraph.channels.shm_channel import ShmChannel, ShmHandle
    from cgraph.comm.cpu.links import SocketLinks
    from cgraph.comm.rendezvous import Membership

ANSWER_MARGIN_S = 30.0
"""How much longer than the group's timeout a rank waits for the store to answer a wait."""


@dataclass
class Links:
    """A rank's settled links and the segments it made (its node's mesh, if it leads it)."""

    transport: FramedTransport
    made: list[ShmChannel] = field(default_factory=list)
    arena: ShmArena | None = None  # the node's workspace, where this rank leads the node
    peers_here: dict[int, int] = field(default_factory=dict)  # the other ranks of this node: rank -> pid
    watch: PeerWatch | None = None

    def watch_peers(self, on_death: Callable[[int, int], None]) -> None:
        """Call ``on_death(rank, pid)`` when a rank of this node dies (``comm.peer_watch``)."""
        if self.peers_here and self.watch is None:
            self.watch = PeerWatch(self.peers_here, on_death)

    def release(self) -> None:
        """Stop watching, drop this rank's mappings and unlink the segments it made (destroy)."""
        if self.watch is not None:
            self.watch.stop()
        self.transport.detach()
        for channel in self.made:
            channel.unlink()
        if self.arena is not None:
            self.arena.unlink()


def announce(membership: Membership, node: str) -> None:
    """Post this rank's node id and pid under the store's keys (at connect; never waits)."""
    _set(membership, f"node/{membership.rank}", f"{node} {os.getpid()}".encode())


def settle(membership: Membership, node: str) -> Links:
    """This rank's links, once every rank's node is known (see the module docstring).

    Raises:
        CollectiveTimeoutError: a rank did not join within the group's timeout.
    """
    spec = membership.spec
    posted = [_get(membership, f"node/{r}", f"rank {r} to join").decode().split()
              for r in range(spec.world_size)]
    nodes = tuple(node_id for node_id, _ in posted)
    here = {r: int(pid) for r, (node_id, pid) in enumerate(posted) if node_id == node and r != membership.rank}
    if membership.ends is not None and set(nodes) == {membership.node}:
        arena = ShmArena(membership.arena, membership.rank, spec.world_size) if membership.arena else None
        return Links(FramedTransport(membership.ends, spec.name, nodes, spec.timeout_s, arena=arena),
                     peers_here=here)
    mine = [r for r in range(spec.world_size) if nodes[r] == node]
    made, (local, base) = _node_mesh(membership, node, mine)
    try:
        ends = _global_ends(local, mine, membership.rank, spec.world_size)
        remote = _remote_links(membership, nodes) if len(set(nodes)) > 1 else None
    except BaseException:
        for channel in made:  # nobody else will: the group never settled here
            channel.unlink()
        raise
    arena = ShmArena(base, mine.index(membership.rank), len(mine))
    return Links(FramedTransport(ends, spec.name, nodes, spec.timeout_s, remote, arena), made,
                 arena if made else None, here)


def _node_mesh(membership: Membership, node: str,
               mine: Sequence[int]) -> tuple[list[ShmChannel], tuple[LinkEnds, str]]:
    """The links among this node's ranks and its workspace's base name: made by the node's
    first rank to get here (the store counts them), attached by the others."""
    spec, key = membership.spec, f"mesh/{node}"
    first = rendezvous.call(membership.store, "kv_add", _key(membership, f"maker/{node}"), 1,
                            group=spec.name) == 1
    if not first:
        ends, base = pickle.loads(_get(membership, key, f"another rank of node {node[:8]} to make its links"))
        return [], (ends[mine.index(membership.rank)], base)
    tag = f"{rendezvous.SHM_TAG_PREFIX}{spec.name}.{membership.nonce}.{node[:8]}"
    channels, ends = create_links(tag, "link", len(mine))
    base = segment_name(tag, "arena")
    try:
        _set(membership, key, pickle.dumps((ends, base)))
    except BaseException:
        for channel in channels:
            channel.unlink()
        raise
    return channels, (ends[mine.index(membership.rank)], base)


def _global_ends(local: LinkEnds, mine: Sequence[int], rank: int, world_size: int) -> LinkEnds:
    """``local`` (numbered within the node) renumbered by group rank; None for other nodes."""
    where = {r: i for i, r in enumerate(mine)}

    def by_rank(handles: Sequence[ShmHandle | None]) -> tuple[ShmHandle | None, ...]:
        return tuple(handles[where[r]] if r in where and r != rank else None for r in range(world_size))

    return LinkEnds(rank, world_size, by_rank(local.out), by_rank(local.inp))


def _remote_links(membership: Membership, nodes: Sequence[str]) -> SocketLinks:
    """Authenticated sockets to the ranks on other nodes (``comm.socket_links``), each
    connected when a call first needs it."""
    import ray

    from cgraph.channels import tls
    from cgraph.comm.cpu import links as socket_links

    spec, rank = membership.spec, membership.rank
    peers = [r for r in range(spec.world_size) if nodes[r] != nodes[rank]]
    return socket_links.listen(
        rank, peers, membership.secret, f"cpu-links {spec.name}.{membership.nonce}",
        ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]  # unannotated in Ray
        publish=lambda address: _set(membership, f"addr/{rank}", address.encode()),
        address_of=lambda r: _get(membership, f"addr/{r}", f"rank {r}'s address").decode(),
        timeout=spec.timeout_s, use_tls=tls.wanted(None))


def _set(membership: Membership, key: str, value: bytes) -> None:
    spec = membership.spec
    rendezvous.call(membership.store, "kv_set", _key(membership, key), value, group=spec.name)


def _get(membership: Membership, key: str, waiting_for: str) -> bytes:
    spec = membership.spec
    value = rendezvous.call(membership.store, "kv_get", _key(membership, key), spec.timeout_s,
                            timeout=spec.timeout_s + ANSWER_MARGIN_S, group=spec.name)
    if value is None:
        raise CollectiveTimeoutError(
            f"group {spec.name!r}, rank {membership.rank}: waited {spec.timeout_s:g} s for "
            f"{waiting_for}, which never arrived (every rank must call init_collective_group "
            "and then the same collectives; or raise timeout_s). The group is aborted.",
            spec.name, membership.rank)
    return bytes(value)


def _key(membership: Membership, key: str) -> str:
    return f"cpu.{membership.spec.name}.{membership.nonce}/{key}"

