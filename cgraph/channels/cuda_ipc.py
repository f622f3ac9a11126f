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

The sender's CPU waits for the acknowledgement, so ``send`` is a rendezvous as
in NCCL, and the ordering is carried by CUDA events: neither side synchronises
the device. The collectives are the star defaults of ``Communicator`` over
these sends and receives. Needs CUDA: on a CPU machine only ``create_ipc_links``
(the driver side) runs.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from cgraph.channels.communicator import GpuCommunicator
from cgraph.channels.cpu_communicator import LinkEnds, create_links
from cgraph.channels.shm_channel import ShmChannel
from cgraph.errors import ChannelClosedError

if TYPE_CHECKING:
    import torch


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


class CudaIpcCommunicator(GpuCommunicator):
    """One rank of a group of actors on one GPU (see the module docstring).

    Raises:
        RuntimeError: CUDA is not available in this process.
    """

    def __init__(self, ends: tuple[LinkEnds, LinkEnds]) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("the CUDA IPC communicator needs a GPU in every member actor")
        data, acks = ends
        self._rank, self._size = data.rank, data.world_size
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self._device)
        self._out = _attach(data.out)
        self._inp = _attach(data.inp)
        self._ack_out = _attach(acks.out)
        self._ack_inp = _attach(acks.inp)
        self._lock = threading.Lock()
        self._closed = False

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            t = tensor.detach().to(self._device).contiguous()
            _, args = reduce_tensor(t)
            self._link(self._out, dst).write(args)
            handle = _take(self._link(self._ack_inp, dst))
            self._stream.wait_event(torch.cuda.Event.from_ipc_handle(self._device, handle))
            t.record_stream(self._stream)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        import torch
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            args = _take(self._link(self._inp, src))
            remote = rebuild_cuda_tensor(*args)  # self._stream waits for the sender's event
            if remote.numel() != tensor.numel() or remote.dtype != tensor.dtype:
                raise ValueError(
                    f"rank {self._rank} recv from rank {src}: got {tuple(remote.shape)} {remote.dtype}, "
                    f"the buffer is {tuple(tensor.shape)} {tensor.dtype}"
                )
            tensor.copy_(remote.reshape(tensor.shape))
            done = torch.cuda.Event(interprocess=True)
            done.record(self._stream)
            self._link(self._ack_out, src).write(done.ipc_handle())

    def synchronize(self) -> None:
        self._stream.synchronize()

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

    def _link(self, ends: list[Any], peer: int) -> Any:
        if self._closed:
            raise ChannelClosedError("the CUDA IPC communicator was destroyed")
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank}: no peer {peer} in a group of {self._size}")
        return ends[peer]


def _attach(handles: tuple[Any, ...]) -> list[Any]:
    return [h.attach() if h is not None else None for h in handles]


def _take(reader: Any) -> Any:
    """Read one small message, copy it out of the slot, free the slot."""
    try:
        return reader.read()  # plain objects (tuples, bytes) are unpickled: already a copy
    finally:
        reader.release()
