"""The reading end of a socket channel: a listener that admits only its writer, and a
receiving thread that takes every value in whole.

At attach the reader listens on the address it reaches the control server from
(the node's own, never all interfaces), tells the server where (``LISTEN``), and
starts its receiving thread, which first admits the writer::

    listener ──accept──▶ CHALLENGE ──▶ stranger: no proof in HANDSHAKE_S, wrong proof,
       ▲                                 or bytes past its response: closed, counted
       │ keeps accepting                 writer: proves ``data <name> w`` ─▶ PROOF back
       └─────────────────────────────── listener closed: one writer per channel

A stranger that connects first steals nothing: every pending connection runs
its own handshake (at most ``MAX_PENDING`` at once; a newer one evicts the
oldest), and only the one that proves itself becomes the data connection. No
frame byte is read before that.

Frames. A frame is the value's size (u64) then exactly the slot layout of
``serialization``. A size above the handle's ``max_value_bytes`` ends the
stream before anything is allocated; a value's memory is reserved lazily (an
anonymous mapping for large values), so it grows only with bytes that really
arrive; a value that stops arriving half-way for ``LOST_PEER_S`` ends the
stream. One credit byte goes back per value read, so the thread holds at most
``max_inflight`` values.

Receive buffers. Values land in the reader's own buffers, kept and reused from
value to value: an anonymous mapping per buffer, its pages committed as bytes
first arrive and then mapped for good. A fresh mapping per value cost a page
fault per 4 KiB received: a raw loopback stream into fresh mappings moved 0.55
GB/s here, into a reused buffer 1.7 GB/s (docs/design-notes.md, "Cross-node
receive buffers"). ``read()`` returns a zero-copy value (numpy arrays
read-only, as on shared memory) valid until ``release()``, which gives its
buffer back; ``read(copy=True)`` hands the buffer itself to the caller (no copy:
the value outlives ``release()``) and the next value gets a new one; a value
under 256 KiB is copied out instead (a small copy costs less than a new mapping). At most
``max_inflight`` values wait unread and one is read and not released, so
``max_inflight + 1`` buffers are kept; the receiving thread never waits for a
buffer (it takes a new one if none is free): a writer in the middle of a value
larger than the socket buffers never waits for the reader's *user*, so a cycle
of such edges cannot deadlock.

Who receives. A ``read()`` that finds no value queued receives the next frame
itself, under a frame lock that keeps whole frames in stream order; meanwhile the
receiving thread waits on the reader's condition instead of on the socket (two
threads woken by one frame cost the reader a wake-up), and looks again each
``POLL_S``, so a value that arrives while the user computes is drained all the
same (docs/design-notes.md).
"""

from __future__ import annotations

import collections
import functools
import itertools
import mmap
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cgraph import _threads
from cgraph.channels.base import ChannelReader
from cgraph.channels.handshake import (
    HANDSHAKE_S,
    LOST_PEER_S,
    Admission,
    AuthError,
    RefusalLog,
    tune,
)
from cgraph.channels.serialization import loads
from cgraph.channels.shm_channel import ShmWriter
from cgraph.channels.socket_endpoint import POLL_S, Endpoint, SocketHandle
from cgraph.channels.tls import WOULD_BLOCK, half_close, send_flags
from cgraph.errors import ChannelClosedError

if TYPE_CHECKING:
    from cgraph._boundary import UserValue

FRAME = struct.Struct("<Q")  # value size in bytes, then that many bytes of slot layout
MAX_PENDING = 16  # handshakes in progress on one listener
_MIN_BUFFER = 1 << 20  # a receive buffer's least size: only the pages a value touches are committed
_HAND_OVER = 256 << 10  # read(copy=True) of a value this large hands its buffer over; smaller: copied


class _EndOfStream(Exception):
    """The data connection ended, broke, stalled or sent a frame out of bounds."""


class SocketReader(Endpoint, ChannelReader):
    """The reading end; one per channel, used by one thread at a time."""

    _what = "read from"

    def __init__(self, handle: SocketHandle, sink: ShmWriter | None = None) -> None:
        super().__init__(handle)
        self._sink = sink  # relay: values land in this shared-memory channel's slots
        self._held = 0  # relay: a slot reserved for the next value
        self.refusals = RefusalLog(f"socket channel {handle.name}")
        self._arrived: collections.deque[tuple[mmap.mmap, int]] = collections.deque()  # buffer, size
        self._arrival = threading.Condition()  # also guards the two below
        self._free: list[mmap.mmap] = []  # receive buffers to reuse, the most recent last
        self._lent: mmap.mmap | None = None  # the buffer of the value read, until release()
        self._frame = threading.Lock()  # held by the thread receiving a frame (either one)
        self._reading = False  # the reader's thread waits in read() to receive a frame itself
        self._ended: BaseException | None = None  # how the writer's stream ended
        host = self._ctl.getsockname()[0]  # the address this host reaches the owner from
        try:
            self._listener = listener = socket.socket(self._ctl.family, socket.SOCK_STREAM)
            listener.bind((host, 0))
            listener.listen(MAX_PENDING)
            listener.setblocking(False)
        except BaseException:
            self._forget()
            raise
        try:
            self._ctl.sendall(f"LISTEN {host} {listener.getsockname()[1]}\n".encode())
        except OSError:
            pass  # refused or gone: the receiving thread finds the channel closed
        self._pump = _threads.start(self._receive, f"cgraph-recv-{handle.name}")

    def read(self, timeout: float | None = None, copy: bool = False) -> UserValue:
        """The next value (releasing the last): zero-copy views of this end's receive buffer,
        valid until ``release()``; with ``copy=True`` the buffer is the caller's (no copy)."""
        self.release()
        deadline = None if timeout is None else time.monotonic() + timeout
        body, size = self._next(deadline, timeout)
        self._credit()
        if copy and size >= _HAND_OVER:  # the buffer itself becomes the value's memory
            return loads(memoryview(body)[:size], writable=True)
        if copy:  # a small value: one small copy, cheaper than mapping a new buffer
            private = bytearray(memoryview(body)[:size])
            self._give_back(body)
            return loads(memoryview(private), writable=True)
        self._lent = body
        return loads(memoryview(body)[:size])

    def _next(self, deadline: float | None, timeout: float | None) -> tuple[mmap.mmap, int]:
        """The next value's buffer and size: one the receiving thread took in, or, when none
        waits and no frame is being received, the next frame received here (one wake-up, in
        the thread that wants the value, instead of two)."""
        while True:
            with self._arrival:
                if self._closed or self._detached:
                    raise self._closed_error()
                if self._arrived:  # values that came before the stream ended are read first
                    return self._arrived.popleft()
                if self._ended is not None:
                    raise self._closed_error(self._ended)
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                why = "no value has arrived" if self._data else "its writer has not written yet"
                raise self._timeout(timeout, why)
            direct = self._sink is None and self._data is not None and self._frame.acquire(blocking=False)
            if not direct:  # before the writer connected, or the receiving thread is mid-frame
                with self._arrival:
                    if not self._arrived:
                        self._arrival.wait(wait)
                continue
            try:
                with self._arrival:
                    if self._arrived:  # the receiving thread took it in first
                        return self._arrived.popleft()
                # only while waiting here (not for a read with no time to wait: values read
                # that way are the receiving thread's to take in) it stays out of the way
                self._reading = True
                if self._wait(self._data, select.POLLIN, time.monotonic() + wait):
                    got = self._take_frame()
                    if got is not None:
                        return got
            except _EndOfStream as exc:
                self._ended = exc
                raise self._closed_error(exc) from None
            finally:
                self._reading = False
                self._frame.release()

    def _credit(self) -> None:
        """One credit byte back to the writer (under ``_io``: the receiving thread may be
        reading the same TLS connection)."""
        sock = self._data
        assert sock is not None
        try:
            with self._io:
                sock.send(b"\x01", send_flags(sock))
        except OSError:
            pass  # the writer is gone: the next read finds the end of the stream

    def release(self) -> None:
        """The last value's buffer back to the receiving thread (the credit went back when
        the value was read); idempotent."""
        lent, self._lent = self._lent, None
        if lent is not None:
            self._give_back(lent)

    def _give_back(self, body: mmap.mmap) -> None:
        with self._arrival:
            if len(self._free) < self._handle.max_inflight + 1:
                self._free.append(body)

    def detach(self) -> None:
        """Stop the receiving thread, then close this end's sockets."""
        self._detached = True
        with self._arrival:
            self._arrival.notify_all()  # a receiving thread that stayed out of the way ends now
        for sock in (self._ctl, self._data):
            try:
                if sock is not None:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # wakes the thread's poll
            except OSError:
                pass
        if self._pump is not threading.current_thread():
            self._pump.join(timeout=2 * POLL_S)
        super().detach()

    # ----------------------------------------------------------------- the receiving thread
    def _receive(self) -> None:
        try:
            self._data = self._admit_writer()
            with self._arrival:
                self._arrival.notify_all()  # a reader waiting for the writer receives now
            for count in itertools.count():
                if self._sink is None:
                    self._take_in()
                    continue
                self._reserve(count)
                header = bytearray(FRAME.size)
                self._recv_into(memoryview(header), idle_ok=True)
                size = self._size(header)
                self._sink.fill(size, functools.partial(self._recv_value, size))
                self._held = 0
                self._midframe = False
        except ChannelClosedError:
            pass  # CLOSED, or detached: the flags say so
        except Exception as exc:  # noqa: BLE001 - _EndOfStream and the rest: the reader reports it
            self._ended = exc
        finally:
            self._end_stream()

    def _take_in(self) -> None:
        """Wait for the next frame's first bytes, then take the frame in, unless the reader
        took it first (``_next``): the frame lock keeps whole frames in stream order, and a
        frame this thread takes is queued before the lock is let go."""
        assert self._data is not None
        with self._arrival:  # the reader waits in read(): it takes the frame itself, and two
            # threads woken by one frame cost the reader a wake-up's worth of latency
            while self._reading and not (self._closed or self._detached):
                self._arrival.wait(POLL_S)
        self._wait(self._data, select.POLLIN, None)
        with self._frame:
            got = self._take_frame()
            if got is not None:
                with self._arrival:
                    self._arrived.append(got)
                    self._arrival.notify()

    def _take_frame(self) -> tuple[mmap.mmap, int] | None:
        """The next frame (under the frame lock), or None if no byte of it is here yet."""
        sock, header = self._data, bytearray(FRAME.size)
        assert sock is not None
        try:
            with self._io:
                got = sock.recv_into(header)
        except WOULD_BLOCK:
            return None
        except OSError as exc:
            raise _EndOfStream(exc) from None
        if got == 0:
            raise _EndOfStream("end of stream")
        self._midframe = True
        self._recv_into(memoryview(header)[got:], idle_ok=False)
        size = self._size(header)
        body = self._buffer(size)
        self._recv_into(memoryview(body)[:size], idle_ok=False)
        self._midframe = False
        return body, size

    def _size(self, header: bytearray) -> int:
        size: int = FRAME.unpack(header)[0]
        if size > self._handle.max_value_bytes:
            raise _EndOfStream(f"it announced a value of {size} bytes, over this "
                               f"channel's max_value_bytes={self._handle.max_value_bytes}")
        return size

    def _buffer(self, size: int) -> mmap.mmap:
        """A receive buffer of at least ``size`` bytes: the most recently freed one, or a new
        anonymous mapping (a quarter larger than asked, so a value that grows a little
        still fits; pages never touched are never committed)."""
        with self._arrival:
            while self._free:
                body = self._free.pop()
                if len(body) >= size:
                    return body
        return mmap.mmap(-1, max(_MIN_BUFFER, size + size // 4))

    def _recv_value(self, size: int, slot: memoryview) -> None:
        self._recv_into(slot[:size], idle_ok=False)

    def _reserve(self, count: int) -> None:
        """Relay: a free slot before the next value, and only then its credit, so the writer
        never starts a value that could not land (it waits before it, as on shared memory)."""
        assert self._sink is not None and self._data is not None
        self._sink.reserve()
        self._held = 1
        if count >= self._handle.max_inflight:  # the first values came on its initial credits
            with self._io:
                self._data.send(b"\x01", send_flags(self._data))

    def _end_stream(self) -> None:
        """Tell the writer everything sent was taken in (it waits for that before closing),
        and wake this end's reader. A relay closes its channel, so that its readers
        wake too, once they have read and released every value it landed."""
        if self._data is not None:
            try:
                half_close(self._data)
            except OSError:
                pass
        with self._arrival:
            self._arrival.notify_all()
        if self._sink is None or self._detached:
            return
        try:
            for _ in range(self._handle.max_inflight - self._held):  # every slot free again
                self._sink.reserve()
        except ChannelClosedError:
            pass
        finally:
            self._sink.close()

    def _admit_writer(self) -> socket.socket:
        """Accept connections until one proves it is this channel's writer; returns it.

        Raises:
            ChannelClosedError: the channel closed (or this end detached) first.
        """
        listener = self._listener
        assert listener is not None
        claim, secret = f"data {self._handle.name} w".encode(), self._handle.secret
        pending: dict[int, Admission] = {}
        why = "the channel closed first"
        try:
            while True:
                self._expire(pending)
                for fd in self._poll_pending(listener, pending):
                    if fd == listener.fileno():
                        self._accept_all(listener, pending, lambda c: secret if c == claim else None)
                    elif fd in pending and self._step(pending, fd):
                        why = "the writer proved itself first"
                        return pending.pop(fd).sock
        finally:
            for fd in list(pending):
                self._refuse(pending, fd, why)
            listener.close()  # one writer per channel: nobody else can connect any more
            self._listener = None

    def _poll_pending(self, listener: socket.socket, pending: dict[int, Admission]) -> list[int]:
        if self._poll_control():
            raise self._closed_error()
        poller = select.poll()
        poller.register(self._ctl, select.POLLIN)
        poller.register(listener, select.POLLIN)
        for admission in pending.values():
            poller.register(admission.sock, admission.want)
        soonest = min((a.deadline for a in pending.values()), default=time.monotonic() + POLL_S)
        wait = max(0.0, min(POLL_S, soonest - time.monotonic()))
        return [fd for fd, _ in poller.poll(int(wait * 1000) + 1) if fd != self._ctl.fileno()]

    def _accept_all(self, listener: socket.socket, pending: dict[int, Admission],
                    lookup: Callable[[bytes], bytes | None]) -> None:
        while True:
            try:
                sock, peer = listener.accept()
            except WOULD_BLOCK:
                return
            except OSError as exc:  # out of fds: refuse nothing, try again on the next wake
                self.refusals.refuse("?", f"accept failed ({exc})")
                return
            try:
                sock.setblocking(False)
                tune(sock)
                admission = Admission(sock, lookup, self._handle.tls)
                if len(pending) >= MAX_PENDING:  # evict the oldest: a flood cannot hold the door
                    oldest = min(pending, key=lambda fd: pending[fd].deadline)
                    self._refuse(pending, oldest, "too many connections at once")
                pending[admission.sock.fileno()] = admission  # the poll loop drives it
            except (OSError, ValueError) as exc:  # ValueError: no TLS certificate here
                self.refusals.refuse(peer, exc)
                sock.close()

    def _step(self, pending: dict[int, Admission], fd: int) -> bool:
        """Take what connection ``fd`` sent; True once it proved it is the writer."""
        try:
            return pending[fd].advance()
        except (AuthError, OSError) as exc:
            self._refuse(pending, fd, exc)
            return False

    def _expire(self, pending: dict[int, Admission]) -> None:
        now = time.monotonic()
        for fd in [fd for fd, admission in pending.items() if admission.deadline <= now]:
            self._refuse(pending, fd, f"no proof within {HANDSHAKE_S:g} s")

    def _refuse(self, pending: dict[int, Admission], fd: int, why: object) -> None:
        sock = pending.pop(fd).sock
        try:
            peer: object = sock.getpeername()
        except OSError:
            peer = "?"
        self.refusals.refuse(peer, why)
        sock.close()

    def _recv_into(self, view: memoryview, idle_ok: bool) -> None:
        """Fill ``view``. Waits without limit for the first byte when ``idle_ok`` (between
        values); once a value began, a silence of ``LOST_PEER_S`` ends the stream.

        Raises:
            _EndOfStream: the connection ended, broke or stalled. ChannelClosedError: closed.
        """
        sock, got = self._data, 0
        assert sock is not None
        while got < view.nbytes:
            try:
                with self._io:
                    n = sock.recv_into(view[got:])
            except WOULD_BLOCK:
                stall = None if idle_ok and got == 0 else time.monotonic() + LOST_PEER_S
                if not self._wait(sock, select.POLLIN, stall):
                    raise _EndOfStream(f"no byte of a value for {LOST_PEER_S} s") from None
                continue
            except OSError as exc:
                raise _EndOfStream(exc) from None
            if n == 0:
                raise _EndOfStream("end of stream")
            got += n
            self._midframe = True
