"""Where a communicator op runs relative to compute: one seam, three engines.

``comm_ops`` moves every communicator op through the engine of its communicator,
picked once per communicator by what its ``stream`` is::

    comm.stream            engine           mark          run(token, body)                join(value, tensors, done)
    None (CPU)             InlineStreams    None          body()                          value
    torch.cuda.Stream      CudaStreams      event on the  on comm.stream, after token;    the compute stream waits
                                            compute       done = event recorded there     for done; tensors
                                            stream                                        record_stream'ed on it
    stream_model.Stream    ModelStreams     (the same, with CUDA's stream semantics modelled on the CPU: see
                                            ``stream_model``)

The code above the seam (the handlers, the comm thread, the fence before user
code, the pending values) is the same for all three; the CUDA calls are the
lines of ``CudaStreams`` and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from cgraph.comm import stream_model

if TYPE_CHECKING:
    import torch

    from cgraph._boundary import TorchObject, UserValue
    from cgraph.comm.communicator import Communicator

Body = Callable[[], "tuple[UserValue, list[torch.Tensor]]"]  # returns (value, tensors received or made)


class InlineStreams:
    """A communicator without a stream (the CPU communicator, most user ones): ops run
    where they are called, and are done when they return."""

    def mark(self) -> None:
        return None

    def run(self, token: object, body: Body) -> tuple[UserValue, list[torch.Tensor], None]:
        return (*body(), None)

    def join(self, value: UserValue, tensors: list[torch.Tensor], done: object) -> UserValue:
        return value

    def keep(self, tensor: torch.Tensor) -> None:
        """``tensor`` must outlive the communicator's queued work (nothing is queued here)."""

    def bind_thread(self) -> None:
        """Run on a comm thread before its first op."""


class CudaStreams:
    """A GPU communicator: its ops are enqueued on ``comm.stream`` (torch.cuda)."""

    def __init__(self, comm: Communicator) -> None:
        self.stream, self.device = comm.stream, comm.device

    def mark(self) -> TorchObject:
        import torch

        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
        event.record(torch.cuda.current_stream(self.device))
        return event

    def run(self, token: TorchObject, body: Body) -> tuple[UserValue, list[torch.Tensor], TorchObject]:
        import torch

        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self.stream.wait_event(token)
            value, tensors = body()
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
            done.record(self.stream)
        return value, tensors, done

    def join(self, value: UserValue, tensors: list[torch.Tensor], done: TorchObject) -> UserValue:
        import torch

        current = torch.cuda.current_stream()
        current.wait_event(done)
        for tensor in tensors:
            tensor.record_stream(current)
        return value

    def keep(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(self.stream)

    def bind_thread(self) -> None:
        import torch

        torch.cuda.set_device(self.device)  # CUDA's current device is per thread


class ModelStreams:
    """A communicator whose stream is a ``stream_model.Stream``: CUDA's semantics on the CPU.

    Compute is synchronous in the model (the CPU runs it), so the compute stream has
    nothing queued: ``mark`` is an event already complete, and the compute stream
    waiting for ``done`` is the CPU waiting for it.
    """

    def __init__(self, comm: Communicator) -> None:
        self.stream: stream_model.Stream = comm.stream

    def mark(self) -> stream_model.Event:
        return stream_model.Event()  # never recorded: complete, as in CUDA

    def run(self, token: object, body: Body) -> tuple[UserValue, list[torch.Tensor], stream_model.Event]:
        self.stream.wait_event(cast(stream_model.Event, token))  # what ``mark`` made
        value, tensors = body()
        done = stream_model.Event()
        done.record(self.stream)
        return value, tensors, done

    def join(self, value: UserValue, tensors: list[torch.Tensor], done: object) -> UserValue:
        cast(stream_model.Event, done).synchronize()  # what ``run`` made
        return value

    def keep(self, tensor: torch.Tensor) -> None:
        self.stream.keep(tensor)

    def bind_thread(self) -> None:
        pass


def streams_of(comm: Communicator) -> InlineStreams | CudaStreams | ModelStreams:
    """The engine for ``comm`` (see the module docstring)."""
    stream = getattr(comm, "stream", None)
    if stream is None:
        return InlineStreams()
    if isinstance(stream, stream_model.Stream):
        return ModelStreams(comm)
    return CudaStreams(comm)
