"""Shared memory on every node: a node's segments are made there, closed and removed there.

The driver can only map its own node's /dev/shm. A channel between two actors of
another node (and the landing channel of a relay into that node) is made by an
actor of that node, its *agent* (the first graph actor there), at compile::

    driver                                   node2: agent b        other actors of node2
    plan: n2.shm b -> c, n1>c.xnode -> c,d
    ── b.__ray_call__(make_segments, [n2.shm 1 reader, n1>c.xnode.relay 2 readers]) ──▶
                         cleanup_stale_segments(); ShmChannel.create ...
    ◀── ShmHandles ──    (the driver ships them in the programs, never maps them)

    teardown, or the monitor after a failure:
    driver closes "<actor>.watch"  ──CLOSED──▶  watcher thread in each actor of node2
    (a socket channel per actor)                closes its shm endpoints: every waiter
                                                on that node wakes, in any process
    loop end, in each actor of node2: unlink the node's channels it used (idempotent)

Every participant watches and unlinks, not only the agent, so a node's channels
are closed and removed while any of their users is alive; a node whose users all
died keeps segments whose creator is dead, which the next agent's
``cleanup_stale_segments`` (or a collective store's) removes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import ray

from cgraph._boundary import ActorHandle
from cgraph.channels.relay import RelayReader
from cgraph.channels.segments import cleanup_stale_segments, unlink_channel
from cgraph.channels.shm_channel import ShmChannel, ShmHandle, ShmReader, ShmWriter
from cgraph.channels.socket_endpoint import SocketHandle, watch_closed
from cgraph.errors import CompileError

MAKE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodeWatch:
    """``ActorProgram.node_watch``: the node channels an actor off the driver's node uses."""

    watch: SocketHandle  # the driver closes its channel to close them all
    segments: tuple[str, ...]  # their names, unlinked when the actor's loop ends


class RemoteShm:
    """The driver's record of a shared-memory channel made on another node."""

    def __init__(self, handle: ShmHandle, readers: tuple[str, ...]) -> None:
        self.handle, self.readers = handle, readers

    def writer_handle(self) -> ShmHandle:
        return self.handle

    def reader_handle(self, reader: str) -> ShmHandle:
        return replace(self.handle, reader=self.readers.index(reader))

    def close(self) -> None:
        """Closed on its node, by the actors' watchers (the driver closes their watches)."""

    def unlink(self) -> None:
        """Unlinked on its node, by the actors whose loops end."""


class RemoteSegments:
    """The channels other nodes made for one graph (a driver resource): their actors close
    and unlink them; only a compile that fails after making them asks the agents to."""

    def __init__(self, agents: Mapping[str, ActorHandle], wanted: Mapping[str, list[tuple[str, int]]]) -> None:
        self.agents, self.wanted = agents, wanted
        self.handles: dict[str, ShmHandle] = {}

    def close(self) -> None:
        """Closed on their nodes, by the actors' watchers."""

    def unlink(self) -> None:
        """Unlinked on their nodes, by the actors whose loops end."""

    def discard(self) -> None:
        """The compile failed before any loop started: have the agents unlink them."""
        refs = []
        for host, items in self.wanted.items():
            names = [self.handles[cid].name for cid, _ in items if cid in self.handles]
            if names:
                refs.append(self.agents[host].__ray_call__.remote(_unlink_all, names))
        try:
            ray.get(refs, timeout=10.0)
        except Exception:  # noqa: BLE001 - a dead agent's segments are stale: cleaned later
            pass


def _unlink_all(_self: object, names: list[str]) -> None:
    for name in names:
        unlink_channel(name)


def make_remote(requests: Mapping[str, list[tuple[str, int]]], agents: Mapping[str, ActorHandle],
                tag: str, max_inflight: int, buffer_size: int) -> dict[str, ShmHandle]:
    """Have each node's agent make that node's channels; returns their handles by id.

    Args:
        requests: node -> [(channel id, number of readers)].
        agents: node -> the actor handle that makes them.

    Raises:
        CompileError: an agent did not answer in time.
    """
    refs = {
        host: agents[host].__ray_call__.remote(make_segments, tag, items, max_inflight, buffer_size)
        for host, items in requests.items()
    }
    try:
        made = ray.get(list(refs.values()), timeout=MAKE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise CompileError(
            f"the actors making shared memory on nodes {', '.join(h[:8] for h in refs)} did not "
            f"answer within {MAKE_TIMEOUT_S:.0f} s; one of them is busy with a long method call"
        ) from None
    handles: dict[str, ShmHandle] = {}
    for host, found in zip(refs, made, strict=True):
        handles.update(zip((cid for cid, _ in requests[host]), found, strict=True))
    return handles


def make_segments(_self: object, tag: str, items: list[tuple[str, int]], max_inflight: int,
                  buffer_size: int) -> list[ShmHandle]:
    """In an actor (``__ray_call__``): make this node's channels (after freeing the
    segments of creators that died here)."""
    cleanup_stale_segments()
    return [ShmChannel.create(tag, cid, num_readers=readers, max_inflight=max_inflight,
                              buffer_size=buffer_size).handle for cid, readers in items]


def watch_node(node: NodeWatch, opened: Iterable[object]) -> Callable[[], None]:
    """In an actor: close its ends of its node's channels (among the endpoints it
    ``opened``) when the driver closes the watch; returns what the loop's end calls
    (stop watching, unlink the node's channels)."""
    endpoints: list[ShmReader | ShmWriter] = []
    for endpoint in opened:
        if isinstance(endpoint, RelayReader):
            endpoints += endpoint.shm_endpoints()
        elif isinstance(endpoint, (ShmReader, ShmWriter)):
            endpoints.append(endpoint)

    def close_all() -> None:
        for endpoint in endpoints:
            try:
                endpoint.close()  # sets the shared closed flag: every waiter on it wakes
            except Exception:  # noqa: BLE001 - closing; a detached endpoint is closed already
                pass

    stop = watch_closed(node.watch, close_all)

    def finish() -> None:
        stop()
        for name in node.segments:
            unlink_channel(name)

    return finish
