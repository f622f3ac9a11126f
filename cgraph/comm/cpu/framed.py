"""A ``Transport`` over shared-memory links whose messages carry the call they belong to.

The "cpu" backend runs cgraph's algorithms over the link mesh of
``cgraph.comm.cpu.mesh`` (one shm channel per ordered pair of
ranks, made by the group's store actor). This transport opens one rank's
``LinkEnds`` and adds the two things a public API needs on top of bare links:

    every message = (tag, array)       tag = (context, signature), e.g.
                                       ("default", "allreduce float32(1024,) sum ring")
                                       ("default[0,2]", "allreduce ...")  a sub-team

* **No silent mix-ups.** The receiver compares the tag of every message with
  the call it is in. Ranks that pass different dtypes or shapes, call
  different collectives, or run a sub-team's call where the parent's is
  expected (teams share the parent's links) get ``CollectiveMismatchError``
  naming both calls, instead of a wrong result or a hang.
* **No hangs.** Every wait has a deadline: a peer that never arrives gives
  ``CollectiveTimeoutError`` naming the group, this rank, the peer and the call.
  A closed link (a peer aborted or the group was destroyed) gives
  ``CollectiveGroupError``.

The tag travels in the same slot as the payload (pickle protocol 5 keeps the
array out of band), so it costs no extra message or wake-up. Links are
buffered (``LINK_SLOTS`` messages), so ``sendrecv`` is a send then a receive.
One call at a time per mesh: the tag is set by ``calling(tag)`` around a call.

A group that spans nodes has shared-memory ends only for the peers on this
rank's node; every other peer is reached through ``remote``
(``comm.socket_links``: a TCP connection per pair), whose messages carry a
fingerprint of the tag instead of the tag::

    ends.out[j] is a link     j on this node: the shared-memory link
    ends.out[j] is None       j on another node: remote.send(fingerprint, buf, j);
                              an exchange posts the send, receives, then waits for it
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from cgraph.channels.opener import open_endpoint
from cgraph.channels.segments import unlink_channel
from cgraph.comm.cpu import peer_memory
from cgraph.comm.cpu.arena import ShmArena
from cgraph.comm.cpu.links import SocketLinks
from cgraph.comm.cpu.mesh import LinkEnds
from cgraph.comm.transport import describe_layout
from cgraph.errors import (
    ChannelClosedError,
    ChannelTimeoutError,
    CollectiveGroupError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
)

if TYPE_CHECKING:
    from cgraph.channels.base import ChannelReader, ChannelWriter

INBAND = 256
"""Messages up to this many bytes travel as bytes inside the tag's tuple (the channel's
one-call path for small plain values) instead of as an out-of-band array."""
NODE = -2
"""The peer an error names for the node's barrier (``node_barrier``): all of this node's ranks."""


Tag = tuple[str, str]
"""(context, signature) of one call: identical on every rank that takes part."""

_IDLE: Tag = ("", "no call")

_End = TypeVar("_End")


class FramedTransport:
    """One rank's ends of a link mesh as a ``cgraph.collective.Transport``.

    Args:
        ends: this rank's ``LinkEnds`` (from the group's store actor).
        group: the group name, for error messages.
        nodes: the node of every rank (``node_of``).
        timeout: seconds any single wait (a free slot, a message) may take.
        remote: the links to the peers without a shared-memory end (``SocketLinks``);
            None when every peer shares this rank's node.
        arena: this rank's mapping of its node's shared workspace (``comm.arena``).
    """

    def __init__(
        self, ends: LinkEnds, group: str, nodes: tuple[Hashable, ...], timeout: float,
        remote: SocketLinks | None = None, arena: ShmArena | None = None,
    ) -> None:
        if len(nodes) != ends.world_size:
            raise ValueError(f"{len(nodes)} node ids for a group of {ends.world_size} ranks")
        self._rank, self._size = ends.rank, ends.world_size
        self._group, self._nodes, self.timeout = group, nodes, timeout
        self._names = [h.name for h in (*ends.out, *ends.inp) if h is not None]
        self._out = cast("list[ChannelWriter | None]",
                         [open_endpoint(h) if h is not None else None for h in ends.out])
        self._inp = cast("list[ChannelReader | None]",
                         [open_endpoint(h) if h is not None else None for h in ends.inp])
        self._remote = remote
        self.arena = arena  # the node's shared workspace ("shared" allreduce), if any
        self._tag: Tag = _IDLE
        self._fingerprint = _fingerprint(_IDLE)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def node_of(self, rank: int) -> Hashable:
        return self._nodes[rank]

    @contextlib.contextmanager
    def calling(self, tag: Tag) -> Iterator[None]:
        """Stamp every message sent (and expect every message received) with ``tag``."""
        previous, self._tag = self._tag, tag
        self._fingerprint = _fingerprint(tag)
        try:
            yield
        finally:
            self._tag, self._fingerprint = previous, _fingerprint(previous)

    # ------------------------------------------------------------------ Transport
    def send(self, buf: np.ndarray, dst: int) -> None:
        writer = self._end(self._out, dst)
        if writer is None:
            with self._mapped("send to", dst):
                self._remote.send(self._fingerprint, buf, dst)  # type: ignore[union-attr]
            return
        # a small message travels as bytes: a plain value, which the channel writes in one C call
        message = (self._tag, buf.dtype.str, buf.tobytes()) if buf.nbytes <= INBAND else (self._tag, buf)
        try:
            writer.write(message, self.timeout)
        except ChannelTimeoutError:
            raise self._timeout("send to", dst) from None
        except ChannelClosedError:
            raise self._closed("send to", dst) from None

    def recv(self, buf: np.ndarray, src: int) -> None:
        reader = self._end(self._inp, src)
        if reader is None:
            with self._mapped("receive from", src):
                matched = self._remote.recv(self._fingerprint, buf, src)  # type: ignore[union-attr]
            if not matched:
                raise self._mismatch(src, "a message of another call, or of another size", "")
            return
        try:
            message = reader.read(self.timeout)
        except ChannelTimeoutError:
            raise self._timeout("receive from", src) from None
        except ChannelClosedError:
            raise self._closed("receive from", src) from None
        try:
            tag, data = message if len(message) == 2 else \
                (message[0], np.frombuffer(message[2], dtype=np.dtype(message[1])))
            self._check(tag, data, buf, src)
            np.copyto(buf.reshape(-1), data.reshape(-1))
        finally:
            reader.release()

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int) -> None:
        remote_dst = self._end(self._out, dst) is None
        remote_src = self._end(self._inp, src) is None
        if not remote_dst:
            self.send(sendbuf, dst)  # buffered: returns before the peer reads
            self.recv(recvbuf, src)
            return
        remote = self._remote
        assert remote is not None
        if remote_src:
            with self._mapped("exchange with", src):
                if not remote.exchange(self._fingerprint, sendbuf, dst, recvbuf, src):
                    raise self._mismatch(src, "a message of another call, or of another size", "")
            return
        with self._mapped("send to", dst):  # the socket's rest leaves while this receives
            remote.post(self._fingerprint, sendbuf, dst)
        self.recv(recvbuf, src)
        with self._mapped("send to", dst):
            remote.wait_sent(dst)

    def node_barrier(self) -> None:
        """Wait for every rank of this node on the workspace's semaphores (``ShmArena.meet``)."""
        assert self.arena is not None
        with self._mapped("meet", NODE):
            self.arena.meet(self.timeout)

    def peer_read(self, peer: int, pid: int, address: int, out: np.ndarray) -> None:
        """Copy from a node peer's buffer into ``out`` (``peer_memory.read``), errors as the group's."""
        try:
            peer_memory.read(pid, address, out)
        except OSError as exc:
            raise CollectiveGroupError(
                f"group {self._group!r}, rank {self._rank}: `{self._tag[1]}` could not read the buffer "
                f"of {_peer(peer)} (pid {pid}) from its memory: {exc} (the peer died, or left the "
                f"collective early after a failure on another rank).{self._layout()}",
                self._group, self._rank) from None

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close every link of this rank: peers blocked on them wake with an error."""
        for end in (*self._out, *self._inp):
            if end is not None:
                end.close()
        if self._remote is not None:
            self._remote.close()
        if self.arena is not None:
            self.arena.close()

    def detach(self) -> None:
        """Drop this process's mappings (the store actor unlinks the segments)."""
        for end in (*self._out, *self._inp):
            if end is not None:
                end.detach()

    def unlink(self) -> None:
        """Remove this rank's links (and the node's workspace) from /dev/shm (the fallback
        when the store is gone)."""
        for name in self._names:
            unlink_channel(name)
        if self.arena is not None:
            self.arena.unlink()

    # ------------------------------------------------------------------ internals
    @contextlib.contextmanager
    def _mapped(self, what: str, peer: int) -> Iterator[None]:
        """The remote links' channel errors as the group's errors (as for a link)."""
        try:
            yield
        except ChannelTimeoutError as exc:
            raise self._timeout(what, peer, f" ({exc})") from None
        except ChannelClosedError as exc:
            raise self._closed(what, peer, f" ({exc})") from None

    def _end(self, ends: list[_End | None], peer: int) -> _End | None:
        if not 0 <= peer < self._size or peer == self._rank:
            raise CollectiveGroupError(
                f"group {self._group!r}, rank {self._rank}: no link to rank {peer}; peers "
                f"are 0..{self._size - 1} other than this rank",
                self._group,
                self._rank,
            )
        return ends[peer]  # None: a peer on another node (``remote``)

    def _check(self, tag: object, data: np.ndarray, buf: np.ndarray, src: int) -> None:
        mine = self._tag
        if tag == mine and data.dtype == buf.dtype and data.size == buf.size:
            return
        context, signature = tag if isinstance(tag, tuple) and len(tag) == 2 else ("?", repr(tag))
        where = "" if context == mine[0] else f" (context {context!r}, this rank is in {mine[0]!r})"
        raise self._mismatch(src, f"a message of `{signature}`", where)

    def _mismatch(self, src: int, what: str, where: str) -> CollectiveMismatchError:
        mine = self._tag
        return CollectiveMismatchError(
            f"group {self._group!r}, rank {self._rank} is in `{mine[1]}` but rank {src} sent "
            f"{what}{where}. Every rank of a group (or team) must make "
            "the same calls in the same order, with tensors of the same dtype and shape "
            "and the same op, root and algorithm. The group is aborted: destroy it and "
            "create it again.",
            self._group,
            self._rank,
        )

    def _timeout(self, what: str, peer: int, detail: str = "") -> CollectiveTimeoutError:
        return CollectiveTimeoutError(
            f"group {self._group!r}, rank {self._rank}: `{self._tag[1]}` waited "
            f"{self.timeout:g} s to {what} {_peer(peer)}, which never arrived (it is "
            f"blocked elsewhere, dead, or issued different calls){detail}. Make every rank call "
            "the same collectives, or raise timeout_s in init_collective_group / "
            f"declare_collective_group. The group is aborted.{self._layout()}",
            self._group,
            self._rank,
        )

    def _closed(self, what: str, peer: int, detail: str = "") -> CollectiveGroupError:
        return CollectiveGroupError(
            f"group {self._group!r}, rank {self._rank}: `{self._tag[1]}` could not {what} "
            f"{_peer(peer)}: the link is closed (the group was aborted by a failure on "
            f"another rank, or destroyed, or the peer died){detail}.{self._layout()}",
            self._group,
            self._rank,
        )

    def _layout(self) -> str:
        """Where the group spans nodes: which rank sits where (``describe_layout``)."""
        if len(set(self._nodes)) < 2:
            return ""
        return f" This is {describe_layout(self._nodes, self._rank)}."


def _peer(peer: int) -> str:
    if peer == NODE:
        return "the other ranks of this node"
    return "a peer" if peer < 0 else f"rank {peer}"


def _fingerprint(tag: Tag) -> bytes:
    """8 bytes naming a call, equal on every rank in it (what crosses nodes instead of the tag)."""
    return hashlib.blake2b(repr(tag).encode(), digest_size=8).digest()
