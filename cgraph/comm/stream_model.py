"""CUDA's stream semantics, modelled on the CPU, so the GPU path's logic runs in CI.

The rules this model keeps, as CUDA states them for streams and events:

- **A stream runs its work in order, later than it was queued.** ``Stream`` is a
  worker thread with a FIFO queue; ``enqueue`` returns at once. A communicator
  written for the model queues its copies there, so ``send`` and ``recv``
  return *before the data moves*, as NCCL's do; ``delay_s`` holds every item
  back that long, to widen the window in which a missing wait shows.
- **An event completes when its stream reaches the point where it was
  recorded.** ``Event.record(stream)`` queues a marker; ``synchronize`` waits
  for it. An event never recorded is complete.
- **A stream can wait for an event** (``wait_event``): the work queued after it
  starts only once the event completed. The CPU is not blocked.
- **Errors are asynchronous.** Work that fails on the stream makes its later
  events fail when synchronized, with that error.
- **A closed stream** (its communicator destroyed) runs nothing more; whoever
  waits for one of its events raises ``ChannelClosedError``, as a GPU rank
  whose communicator was aborted does.
- **Memory queued for a stream must outlive the work** (``keep`` is
  ``record_stream``): the model counts what it was given, tests may look.

What it does not model: the compute stream (compute runs synchronously on the
CPU here, so "the compute stream waits for an event" is the CPU waiting for it),
several devices, and the caching allocator's reuse.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from cgraph import _threads
from cgraph.errors import ChannelClosedError


class Stream:
    """A CUDA stream, modelled: a worker thread running queued work in order."""

    def __init__(self, name: str = "model-stream", delay_s: float = 0.0) -> None:
        self.name = name
        self.delay_s = delay_s
        self.error: BaseException | None = None
        self.kept = 0
        self.closed = False  # closed: its queued work never runs (the communicator was destroyed)
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = _threads.start(self._run, name)

    def enqueue(self, work: Callable[[], None]) -> None:
        """Run ``work`` after everything queued before it; returns at once."""
        self._queue.put(work)

    def wait_event(self, event: Event) -> None:
        """Work queued after this starts once ``event`` completed (the caller goes on)."""
        self.enqueue(event.wait_done)

    def synchronize(self) -> None:
        """Block until everything queued so far ran; raise the stream's error, if any."""
        event = Event()
        event.record(self)
        event.synchronize()

    def keep(self, tensor: object) -> None:
        """``record_stream``: ``tensor`` stays allocated until the queued work ran."""
        self.kept += 1

    def close(self) -> None:
        """Stop running work; waiters on this stream's events stop waiting and raise."""
        self.closed = True
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None or self.closed:
                return
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.closed:
                return
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - asynchronous: the next sync raises it
                if self.error is None:
                    self.error = exc


class Event:
    """A CUDA event, modelled: complete once its stream ran up to where it was recorded."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._done.set()  # never recorded: complete
        self._stream: Stream | None = None

    def record(self, stream: Stream) -> None:
        done = self._done = threading.Event()
        self._stream = stream
        stream.enqueue(done.set)

    def query(self) -> bool:
        return self._done.is_set()

    def wait_done(self) -> None:
        """Block until complete, or until its stream was closed (its work will never run)."""
        while not self._done.wait(0.05):
            if self._stream is not None and self._stream.closed:
                return

    def synchronize(self) -> None:
        """Block until complete; the stream's error, if its work failed before (or the stream
        was closed first: ``ChannelClosedError``)."""
        self.wait_done()
        stream = self._stream
        if stream is not None and stream.error is not None:
            raise stream.error
        if stream is not None and not self._done.is_set():
            raise ChannelClosedError(f"{stream.name} was closed before this event completed")
