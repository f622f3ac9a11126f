"""CUDA IPC communicator: actors sharing one GPU move tensors device to device.

NCCL refuses two ranks on one GPU, and a host round trip would waste the copy
engine, so actors placed on the same GPU (fractional ``num_gpus``) exchange
CUDA IPC handles instead, over the same shared-memory links as the CPU
communicator, plus an acknowledgement link back::

    sender (rank s)                              receiver (rank r)
    self.stream waits for the tensor's producer
    args = reduce_tensor(t)                       (torch.multiprocessing: the
      cudaIpcGetMemHandle + an IPC event           storage's IPC handle and an
      recorded on self.stream                      event; ref-counted by torch)
    data link s>r: args  ───────────────────────► remote = rebuild_cuda_tensor(*args)
                                                    (self.stream waits for that event)
                                                  buf.copy_(remote) on self.stream
                                                  done = Event(interprocess=True)
    ack link r>s: done.ipc_handle()  ◄──────────  done.record(self.stream)
    self.stream waits for done
    (work queued after the send may reuse t)

Both ops first make self.stream wait for the caller's current stream (the
tensor as the caller's work left it, its memory as the allocator handed it out)
and end by making the caller's stream wait for self.stream (the received values
are ready for it; it may overwrite a sent tensor), as torch's NCCL process group
does around each collective. Inside a compiled graph the caller's stream is
self.stream itself (``streams.CudaStreams``), and both waits cost nothing.
torch's CUDA sanitizer (``TORCH_CUDA_SANITIZER=1``) caught the missing first
wait on an H200: a receive buffer allocated on the default stream was written
on self.stream.

The sender's CPU waits for the acknowledgement, so ``send`` is a rendezvous as
in NCCL, and the ordering is carried by CUDA events: neither side synchronises
the device. The collectives are the star defaults of ``Communicator`` over
these sends and receives.

The "done" event a receiver shares must outlive the sender's use of it (CUDA
leaves an IPC event destroyed by its exporter undefined), so each receiver keeps
one interprocess event per peer for the communicator's life and records it again
on every receive; a sender opens each peer's event once. Recording it again is
safe: the next receive from that peer needs the peer's next send, which starts
only after its stream began waiting on the previous record.

Every CUDA call sits in ``CudaOps``; the protocol above it is the same with any
object of that shape (the unit tests run it with a CPU stand-in that checks
event lifetimes). On a CPU machine only ``create_ipc_links`` (the driver side)
runs for real.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, cast

from cgraph.channels.opener import open_endpoint
from cgraph.channels.shm_channel import ShmChannel
from cgraph.comm.communicator import Communicator
from cgraph.comm.cpu.mesh import LinkEnds, create_links
from cgraph.errors import ChannelClosedError

if TYPE_CHECKING:
    from typing import TypeVar

    import torch

    from cgraph._boundary import TorchObject
    from cgraph.channels.base import ChannelReader, ChannelWriter
    from cgraph.channels.shm_channel import ShmHandle

    End = TypeVar("End", ChannelWriter, ChannelReader)  # a link's end: writer or reader


def create_ipc_links(tag: str, name: str, world_size: int) -> tuple[list[ShmChannel], list[tuple[LinkEnds, LinkEnds]]]:
    """The data and acknowledgement links of a group (on the driver); per rank ``(data, acks)``."""
    data_channels, data = create_links(tag, f"{name}.data", world_size)
    try:
        ack_channels, acks = create_links(tag, f"{name}.ack", world_size)
    except BaseException:
        for ch in data_channels:
            ch.unlink()
        raise
    return data_channels + ack_channels, list(zip(data, acks, strict=True))


class CudaOps:
    """The CUDA calls of the CUDA IPC communicator, and nothing else (torch.cuda)."""

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("the CUDA IPC communicator needs a GPU in every member actor")
        self.device = torch.device("cuda", torch.cuda.current_device())

    def new_stream(self) -> TorchObject:
        import torch

        return torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # unannotated in torch

    def enter(self, stream: TorchObject) -> TorchObject:
        """The caller's current stream, after making ``stream`` wait for the work queued
        on it so far: the caller's writes to (and allocations of) the tensors of the op."""
        import torch

        caller = torch.cuda.current_stream(self.device)
        stream.wait_stream(caller)
        return caller

    def leave(self, stream: TorchObject, caller: TorchObject) -> None:
        """The caller's stream waits for ``stream``'s queued work: what the op wrote is
        ready for it, and it may overwrite what the op still read."""
        caller.wait_stream(stream)

    def on(self, stream: TorchObject) -> contextlib.AbstractContextManager[object]:
        """Work queued in the block runs on ``stream``, on this communicator's device."""
        import torch

        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(stream))
        return stack

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(self.device).contiguous()

    def export(self, tensor: torch.Tensor) -> TorchObject:
        """What another process needs to map ``tensor`` (handle and producer event)."""
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(tensor)[1]  # type: ignore[no-untyped-call]  # unannotated in torch

    def import_(self, args: TorchObject) -> torch.Tensor:
        """The sender's tensor, mapped; the current stream waits for its producer event."""
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        return rebuild_cuda_tensor(*args)  # type: ignore[no-untyped-call, no-any-return]  # unannotated in torch

    def new_shared_event(self) -> TorchObject:
        import torch

        return torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]  # unannotated in torch

    def share(self, event: TorchObject) -> bytes:
        return event.ipc_handle()  # type: ignore[no-any-return]

    def open_event(self, handle: bytes) -> TorchObject:
        import torch

        return torch.cuda.Event.from_ipc_handle(self.device, handle)  # type: ignore[no-untyped-call]  # unannotated in torch

    def record(self, event: TorchObject, stream: TorchObject) -> None:
        event.record(stream)

    def wait(self, stream: TorchObject, event: TorchObject) -> None:
        stream.wait_event(event)

    def keep_for(self, tensor: torch.Tensor, stream: TorchObject) -> None:
        """``tensor``'s memory is not reused before ``stream``'s queued work is done."""
        tensor.record_stream(stream)

    def synchronize(self, stream: TorchObject) -> None:
        stream.synchronize()


class CudaIpcCommunicator(Communicator):
    """One rank of a group of actors on one GPU (see the module docstring).

    Raises:
        RuntimeError: CUDA is not available in this process.
    """

    def __init__(self, ends: tuple[LinkEnds, LinkEnds], ops: CudaOps | None = None) -> None:
        self._ops = ops if ops is not None else CudaOps()
        data, acks = ends
        self._rank, self._size = data.rank, data.world_size
        self._device = self._ops.device
        self._stream = self._ops.new_stream()
        self._done: dict[int, TorchObject] = {}  # per sending peer: the event we record, kept for our life
        self._opened: dict[int, tuple[bytes, TorchObject]] = {}  # per receiving peer: its done event, opened
        self._out = cast("list[ChannelWriter | None]", _attach(data.out))
        self._inp = cast("list[ChannelReader | None]", _attach(data.inp))
        self._ack_out = cast("list[ChannelWriter | None]", _attach(acks.out))
        self._ack_inp = cast("list[ChannelReader | None]", _attach(acks.inp))
        self._lock = threading.Lock()
        self._closed = False

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def stream(self) -> TorchObject:
        return self._stream

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        ops = self._ops
        caller = ops.enter(self._stream)  # the tensor as the caller's stream left it
        with ops.on(self._stream):
            t = ops.to_device(tensor)
            self._link(self._out, dst).write(ops.export(t))
            handle = cast(bytes, _take(self._link(self._ack_inp, dst)))  # an event's IPC handle
            ops.wait(self._stream, self._peer_event(dst, handle))
            ops.keep_for(t, self._stream)
        ops.leave(self._stream, caller)  # the caller may overwrite it once the peer has copied

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        ops = self._ops
        caller = ops.enter(self._stream)  # the buffer's last use and allocation on the caller's stream
        try:
            self._recv(tensor, src)
        finally:
            ops.leave(self._stream, caller)  # the received values, ready for the caller's stream
            ops.keep_for(tensor, self._stream)

    def _recv(self, tensor: torch.Tensor, src: int) -> None:
        ops = self._ops
        with ops.on(self._stream):
            args = _take(self._link(self._inp, src))
            remote = ops.import_(args)  # self._stream waits for the sender's event
            if remote.numel() != tensor.numel() or remote.dtype != tensor.dtype:
                raise ValueError(
                    f"rank {self._rank} recv from rank {src}: got {tuple(remote.shape)} {remote.dtype}, "
                    f"the buffer is {tuple(tensor.shape)} {tensor.dtype}"
                )
            tensor.copy_(remote.reshape(tensor.shape))
            done = self._done.get(src)
            if done is None:
                done = self._done[src] = ops.new_shared_event()
            ops.record(done, self._stream)
            self._link(self._ack_out, src).write(ops.share(done))

    def _peer_event(self, peer: int, handle: bytes) -> TorchObject:
        """``peer``'s done event for us, opened once (it keeps one per sender)."""
        opened = self._opened.get(peer)
        if opened is None or opened[0] != handle:
            opened = self._opened[peer] = (handle, self._ops.open_event(handle))
        return opened[1]

    def synchronize(self) -> None:
        self._ops.synchronize(self._stream)

    def abort(self) -> None:
        for end in (*self._out, *self._inp, *self._ack_out, *self._ack_inp):
            if end is not None:
                end.close()

    def destroy(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for end in (*self._out, *self._inp, *self._ack_out, *self._ack_inp):
            if end is not None:
                end.detach()

    def _link(self, ends: list[End | None], peer: int) -> End:
        if self._closed:
            raise ChannelClosedError("the CUDA IPC communicator was destroyed")
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no peer {peer} in a group of {self._size}")
        return cast("End", ends[peer])  # not this rank's: a link


def _attach(handles: tuple[ShmHandle | None, ...]) -> list[ChannelWriter | ChannelReader | None]:
    return [open_endpoint(h) if h is not None else None for h in handles]


def _take(reader: ChannelReader) -> object:
    """Read one small message, copy it out of the slot, free the slot."""
    try:
        return reader.read()  # plain objects (tuples, bytes) are unpickled: already a copy
    finally:
        reader.release()
