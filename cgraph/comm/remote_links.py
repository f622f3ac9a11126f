"""Links to ranks on other nodes for the "cpu" backend: tagged messages over a gloo process group.

Inside a node the "cpu" backend's ranks talk through shared-memory links; a
pair of ranks on two nodes has no memory in common, so its messages cross
through a ``ProcessGroupGloo`` (TCP) of the whole group. ``FramedTransport``
routes every peer without a shared-memory end here and keeps its semantics:

    send(fingerprint, buf, dst)     a 64-byte header message      [fingerprint | nbytes | inline bytes]
                                    then, if it did not fit, the payload itself
    recv(fingerprint, buf, src)     the header first: a different call or size is
                                    refused before any payload is posted

* **Buffered like a link.** ``send`` copies ``buf`` (the caller may reuse it at
  once) and posts the send without waiting, keeping at most ``SLOTS`` messages
  per peer in flight; so ``sendrecv`` may be a send then a receive, as on the
  shared-memory links. ``flush`` waits for them at the end of a call.
* **A header first, always.** gloo kills the receiving process when a message
  is longer than the buffer posted for it ("Received data size doesn't match
  expected size"); a fixed-size header that names the call (a fingerprint of its
  tag) and the payload's length lets the receiver refuse a mismatch instead.
  Payloads up to ``INLINE`` bytes ride in the header: one message each.
* **Errors are the channel's.** A peer that never sends makes the wait fail
  after the process group's timeout with ``ChannelTimeoutError``; a peer that
  died or closed gives ``ChannelClosedError``. ``close`` drops the process
  group, which closes its connections and wakes the peers blocked on them
  (gloo's ``abort``/``shutdown`` leave a blocked receive waiting).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from cgraph.errors import ChannelClosedError, ChannelTimeoutError

TAG = 23
"""The process-group tag of these messages."""
HEADER = 64
"""Bytes of every header message."""
INLINE = HEADER - 16
"""Payloads this small travel inside their header."""
SLOTS = 2
"""Messages per peer in flight before ``send`` waits for the oldest (the links' ``LINK_SLOTS``)."""


class RemoteLinks:
    """One rank's links to every other rank of a gloo process group (see the module docstring).

    Args:
        pg: this rank's ``ProcessGroupGloo`` over the whole group.
        keep: what must live as long as ``pg`` (its store: C++ holds only a reference).
    """

    def __init__(self, pg: Any, keep: Any = None) -> None:
        self._pg, self._keep = pg, keep
        self._sending: dict[int, deque[tuple[Any, ...]]] = {}

    def send(self, fingerprint: bytes, buf: np.ndarray, dst: int) -> None:
        raw = _raw(buf)
        header = np.zeros(HEADER, dtype=np.uint8)
        header[:8] = np.frombuffer(fingerprint, dtype=np.uint8)
        header[8:16] = np.array([raw.size], dtype=np.int64).view(np.uint8)
        inline = raw.size <= INLINE
        if inline:
            header[16 : 16 + raw.size] = raw
        queue = self._sending.setdefault(dst, deque())
        while len(queue) >= SLOTS:
            self._finish(queue.popleft(), "send to", dst)
        kept: tuple[Any, ...] = (self._post_send(header, dst), header)
        if not inline:
            payload = raw.copy()  # the caller may reuse buf as soon as send returns
            kept += (self._post_send(payload, dst), payload)
        queue.append(kept)

    def recv(self, fingerprint: bytes, buf: np.ndarray, src: int) -> bool:
        """Receive the next message from ``src`` into ``buf``.

        Returns:
            False, with nothing received beyond the header, when the message belongs
            to another call or has another length (the caller raises the mismatch).
        """
        raw = _raw(buf)
        header = np.empty(HEADER, dtype=np.uint8)
        self._receive(header, src)
        nbytes = int(header[8:16].view(np.int64)[0])
        if header[:8].tobytes() != fingerprint or nbytes != raw.size:
            return False
        if nbytes <= INLINE:
            raw[:] = header[16 : 16 + nbytes]
        else:
            self._receive(raw, src)  # lands in place
        return True

    def flush(self) -> None:
        """Wait until every message sent so far has left (the end of a call)."""
        for dst, queue in self._sending.items():
            while queue:
                self._finish(queue.popleft(), "send to", dst)

    def close(self) -> None:
        """Drop the process group: its connections close and blocked peers wake."""
        pg, self._pg = self._pg, None
        self._sending.clear()
        del pg  # the last reference: gloo closes its connections

    # ------------------------------------------------------------------ internals
    def _post_send(self, arr: np.ndarray, dst: int) -> Any:
        import torch

        return self._run(lambda pg: pg.send([torch.from_numpy(arr)], dst, TAG), "send to", dst)

    def _receive(self, arr: np.ndarray, src: int) -> None:
        import torch

        work = self._run(lambda pg: pg.recv([torch.from_numpy(arr)], src, TAG), "receive from", src)
        self._finish((work,), "receive from", src)

    def _finish(self, kept: tuple[Any, ...], what: str, peer: int) -> None:
        for work in kept[::2]:
            self._run(lambda _pg, w=work: w.wait(), what, peer)

    def _run(self, call: Any, what: str, peer: int) -> Any:
        pg = self._pg
        if pg is None:
            raise ChannelClosedError(f"the links were closed before this {what} rank {peer}")
        try:
            return call(pg)
        except RuntimeError as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise ChannelTimeoutError(f"{what} rank {peer}: {text}") from exc
            raise ChannelClosedError(f"{what} rank {peer}: {text}") from exc


def _raw(buf: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view."""
    return buf.reshape(-1).view(np.uint8)
