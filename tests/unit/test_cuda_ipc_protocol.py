"""The CUDA IPC communicator's protocol on CPU: ``CudaIpcCommunicator`` with a stand-in
for its CUDA calls (``CudaOps``) that maps a "device" tensor by token and keeps CUDA's
rule for IPC events: opening one that its exporting process destroyed is an error here
(undefined behaviour on a GPU). Two ranks are two threads over real shared-memory links.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
import weakref
from typing import Any

import pytest
import torch

from cgraph.comm.cuda_ipc import CudaIpcCommunicator, create_ipc_links
from cgraph.errors import ChannelClosedError


class Event:
    _handles = itertools.count()

    def __init__(self, registry: dict[bytes, Any]) -> None:
        self.handle = f"event-{next(self._handles)}".encode()
        self.records = 0
        registry[self.handle] = weakref.ref(self)


class CpuOps:
    """CudaOps' shape, on CPU: tensors "mapped" by token, events checked for lifetime."""

    device = torch.device("cpu")

    def __init__(self, shared: dict[str, Any]) -> None:
        self.shared = shared  # what both "processes" see: mapped tensors, exported events
        self.opened = 0
        self.calls: list[str] = []  # the stream orderings, in order
        self.caller = object()  # the "current stream" of whoever calls the communicator

    def new_stream(self) -> object:
        return object()

    def enter(self, stream: Any) -> Any:
        self.calls.append("comm waits for caller")
        return self.caller

    def leave(self, stream: Any, caller: Any) -> None:
        assert caller is self.caller
        self.calls.append("caller waits for comm")

    def on(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        self.calls.append("on comm")
        return contextlib.nullcontext()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().contiguous()

    def export(self, tensor: torch.Tensor) -> Any:
        token = uuid.uuid4().hex
        self.shared["tensors"][token] = tensor
        return (token,)

    def import_(self, args: Any) -> torch.Tensor:
        return self.shared["tensors"].pop(args[0])  # type: ignore[no-any-return]

    def new_shared_event(self) -> Event:
        return Event(self.shared["events"])

    def share(self, event: Event) -> bytes:
        return event.handle

    def open_event(self, handle: bytes) -> Event:
        time.sleep(0.005)  # the receiver has returned from recv by now
        ref = self.shared["events"].get(handle)
        event = ref() if ref is not None else None
        if event is None:
            raise AssertionError("opened an IPC event that its exporting process destroyed")
        self.opened += 1
        return event

    def record(self, event: Event, stream: Any) -> None:
        event.records += 1

    def wait(self, stream: Any, event: Event) -> None:
        assert event.records > 0, "waited on an event never recorded"

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:
        pass

    def synchronize(self, stream: Any) -> None:
        pass


@pytest.fixture
def pair():  # type: ignore[no-untyped-def]
    channels, ends = create_ipc_links(uuid.uuid4().hex[:8], "ipc", 2)
    shared: dict[str, Any] = {"tensors": {}, "events": {}}
    comms = [CudaIpcCommunicator(e, ops=CpuOps(shared)) for e in ends]
    yield comms
    for comm in comms:
        comm.destroy()
    for ch in channels:
        ch.close()
        ch.unlink()


def both(first: Any, second: Any) -> list[Any]:
    out: list[Any] = [None, None]
    errors: list[BaseException] = []

    def run(i: int, fn: Any) -> None:
        try:
            out[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return out


def test_the_done_event_outlives_the_senders_use(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    for i in range(5):
        got = torch.zeros(4)
        both(lambda i=i: a.send(torch.full((4,), float(i)), 1), lambda got=got: b.recv(got, 0))
        assert got.tolist() == [float(i)] * 4
    assert a._ops.opened == 1, "a sender opens each peer's event once"
    assert len(b._done) == 1 and b._done[0].records == 5


def test_both_directions_and_a_wrong_buffer(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    got_b, got_a = torch.zeros(3), torch.zeros(3)
    both(lambda: (a.send(torch.ones(3), 1), a.recv(got_a, 1)), lambda: (b.recv(got_b, 0), b.send(got_b * 2, 0)))
    assert got_b.tolist() == [1.0] * 3 and got_a.tolist() == [2.0] * 3


def test_a_wrong_buffer_fails_the_receive_and_abort_frees_the_sender(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    sent: list[BaseException] = []

    def send() -> None:
        try:
            a.send(torch.ones(3), 1)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            sent.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    with pytest.raises(ValueError, match=r"got \(3,\) torch.float32, the buffer is \(2,\)"):
        b.recv(torch.zeros(2), 0)
    a.abort()  # what the graph's watcher does when the driver closes the group
    sender.join(10)
    assert not sender.is_alive() and [type(e).__name__ for e in sent] == ["ChannelClosedError"]


def test_identity_comes_from_the_links_and_the_engine(pair) -> None:  # type: ignore[no-untyped-def]
    assert [(c.rank, c.world_size) for c in pair] == [(0, 2), (1, 2)]
    assert all(c.device == c._ops.device and c.stream is not None for c in pair)
    pair[0].synchronize()  # the engine's; a no-op in the stand-in


def test_a_wrong_peer_is_refused_and_destroy_is_final(pair) -> None:  # type: ignore[no-untyped-def]
    first = pair[0]
    with pytest.raises(ValueError, match="no peer 0 in a group of 2"):
        first.send(torch.ones(2), 0)
    first.destroy()
    first.destroy()  # idempotent
    with pytest.raises(ChannelClosedError, match="CUDA IPC communicator was destroyed"):
        first.send(torch.ones(2), 1)


def test_every_op_is_ordered_after_the_callers_stream_and_before_its_next_work(pair) -> None:  # type: ignore[no-untyped-def]
    """As torch's NCCL process group does: the comm stream waits for the caller's stream
    before touching the tensor, the caller's stream for the comm stream after (the CUDA
    sanitizer caught the missing first wait on a GPU)."""
    a, b = pair
    got = torch.zeros(4)
    both(lambda: a.send(torch.arange(4.0), 1), lambda: b.recv(got, 0))
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    for comm in (a, b):
        assert comm._ops.calls == ["comm waits for caller", "on comm", "caller waits for comm"]
