"""The communicator channel: one edge whose tensors travel through a ``Communicator``.

Each COMM channel (``n3>b.comm``) has a writer end on the producing actor, a
reader end on the consuming one, a communicator both belong to, and a
shared-memory *side channel* for everything that is not tensor data::

    writer (a)                                          reader (b)
    value ─ encode: pickle with every torch.Tensor
            replaced by its index (nested in lists,
            dicts, tuples, dataclasses, any object)
        side item  ──────── side channel (shm) ───────►  side item
        tensors    ──────── communicator ─────────────►  recv into fresh buffers, or the
                                                          last one a view (recv_view, below)
                                                          (shape, dtype from the item)
                                                          decode: tensors back in place,
                                                          moved to hint.device

The side item of execution ``seq`` (``seq`` counts values on this edge):

    edge hint                       value ok                          tensors sent
    -                               Meta(seq, structure, specs)       all
    _static_shape                   Meta(seq, structure, specs once)  all
    _direct_return                  Meta(seq, -, specs)               the one tensor
    _static_shape + _direct_return  Meta(seq, -, specs) once, then    the one tensor
                                    nothing at all
    the method raised (ErrorValue)  Failed(seq, error)                none; zero fillers of
                                                                      the static shapes when
                                                                      no side item is read

With both flags and the shapes known, nothing but the tensor crosses per
execution; an error then goes as ``Failed`` on the side channel *before*
fillers through the communicator (so both ends stay matched), and the reader,
once its receive is complete (``synchronize``), polls the side channel
without blocking: an item for this ``seq`` turns the value into the error, an
item for a later ``seq`` waits in ``stash`` for its execution.

Where the communicator offers ``recv_view`` (the CPU communicator) and this
RECV is the actor's last read of that peer's link in the execution
(``view_last``, decided from the schedule by ``comm_ops.last_link_reads``), the edge's last
tensor is a view of the link's slot instead of a copy, valid for the
execution like a shared-memory channel read; ``release()`` frees the slot at
the execution's end. Earlier tensors on the link are copies, since the link
holds one viewed message at a time.

After a fault of the group's communicator (``comm_faults``) no tensor crosses
again: the writer writes ``Failed(seq, error, failure)`` for each value
(``skip``; ``retract`` for the value whose send raised, before the group's
control closes), and the reader reads side items up to its value's ``Failed``
(``skip``, ``settle``), dropping Meta items, waiting a bounded time since a
writer whose send went through before it saw the fault writes none; ``failure``
says why the group failed, so every member's later errors say the same.

Errors of the protocol itself become ``ErrorValue`` s that flow like user
errors (the graph stays usable): a ``_direct_return`` method that returns
anything but one tensor, a ``_static_shape`` edge whose tensors change after
the first execution (both name the node and the shapes), a value that cannot
be pickled.
"""

from __future__ import annotations

import io
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from cgraph._boundary import UserValue
from cgraph.channels.serialization import PicklerMixin, has_cuda, on_base, pickler_base
from cgraph.comm.communicator import view_receiver
from cgraph.comm.streams import streams_of
from cgraph.errors import RuntimeGraphError
from cgraph.runtime.error_value import ErrorValue

if TYPE_CHECKING:
    from types import ModuleType

    import torch

    from cgraph.channels.base import ChannelReader, ChannelWriter
    from cgraph.comm.communicator import Communicator
    from cgraph.ir import TensorHint
    from cgraph.runtime.comm_faults import GroupFailure

Spec = tuple[tuple[int, ...], "torch.dtype"]  # (shape, torch dtype) of one tensor
Origin = Callable[[Exception], ErrorValue]  # wraps a protocol error as the producer's error


@dataclass(frozen=True, slots=True)
class Meta:
    seq: int
    structure: bytes | None  # the value pickled around its tensors; None: the value is tensor 0
    specs: tuple[Spec, ...] | None  # None: the static specs sent before


@dataclass(frozen=True, slots=True)
class Failed:
    seq: int
    error: ErrorValue
    failure: GroupFailure | None = None  # the writer's group failed: why


@dataclass(frozen=True, slots=True)
class Encoded:
    """A value taken apart once per execution, shared by every SEND of its node."""

    structure: bytes | None
    tensors: tuple[torch.Tensor, ...]
    specs: tuple[Spec, ...]


# --------------------------------------------------------------------------- encoding
class _Extractor(PicklerMixin):
    """Pickles a value's structure, taking its tensors out (a mixin over ``pickler_base()``)."""

    def __init__(self, file: io.BytesIO, tensor_type: type[torch.Tensor]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensor_type = tensor_type
        self.tensors: list[torch.Tensor] = []
        self.index: dict[int, int] = {}  # id(tensor) -> its index: one tensor twice stays one

    def persistent_id(self, obj: object) -> int | None:
        if not isinstance(obj, self.tensor_type):
            return None
        if id(obj) not in self.index:
            self.index[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return self.index[id(obj)]


class _Restorer(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid: int) -> torch.Tensor:
        return self.tensors[pid]


def encode(value: UserValue, *, node: str, direct_return: bool, origin: Origin) -> Encoded | ErrorValue:
    """Take ``value`` apart into its structure and its tensors (or an error to send)."""
    import torch

    if isinstance(value, ErrorValue):
        return value
    if isinstance(value, torch.Tensor):
        tensors: list[torch.Tensor] = [value]
        structure = None
    elif direct_return:
        return origin(TypeError(
            f"node {node} was declared _direct_return=True, so its method must return exactly "
            f"one torch.Tensor, but it returned {type(value).__name__}; return the tensor alone, "
            "or drop _direct_return to send tensors nested in other values"
        ))
    else:
        file = io.BytesIO()
        pickler = cast(_Extractor, on_base(_Extractor, pickler_base())(file, torch.Tensor))
        try:
            pickler.dump(value)
        except Exception as exc:  # noqa: BLE001 - the user's value; reported downstream
            return origin(TypeError(
                f"the value of node {node} cannot be sent: pickling it failed with "
                f"{type(exc).__name__}: {exc}"
            ))
        structure, tensors = file.getvalue(), pickler.tensors
    for t in tensors:
        kind = _unsendable_kind(t, torch)
        if kind:
            return origin(TypeError(
                f"the value of node {node} holds a {kind} tensor {tuple(t.shape)}, which a "
                "communicator cannot send as it sends bytes: send a dense, strided tensor "
                "(t.to_dense(), t.dequantize(), torch.nested's unbind()) or use the shm transport"
            ))
    # a conjugate or negative view sends the values it shows, not its storage's bytes
    ready = tuple(t.detach().resolve_conj().resolve_neg() for t in tensors)
    return Encoded(structure, ready, tuple((tuple(t.shape), t.dtype) for t in ready))


def _unsendable_kind(t: torch.Tensor, torch: ModuleType) -> str:
    """What keeps ``t`` from crossing as raw bytes ("" when nothing does)."""
    if getattr(t, "is_nested", False):
        return "nested"
    if t.is_quantized:
        return "quantized"
    if t.is_meta:
        return "meta"
    if t.layout is not torch.strided:
        return str(t.layout).removeprefix("torch.")
    return ""


def decode(structure: bytes | None, tensors: list[torch.Tensor]) -> UserValue:
    """Inverse of ``encode``: the value with the received tensors in place."""
    if structure is None:
        return tensors[0]
    return _Restorer(io.BytesIO(structure), tensors).load()


def format_specs(specs: tuple[Spec, ...] | None) -> str:
    if not specs:
        return "no tensors"
    return ", ".join(f"{tuple(shape)} {str(dtype).replace('torch.', '')}" for shape, dtype in specs)


# --------------------------------------------------------------------------- the two ends
class _Lease(Protocol):
    """What a received view holds (``Communicator.recv_view``'s lease)."""

    def release(self) -> None: ...


class _End:
    side: ChannelWriter | ChannelReader  # the side channel's end (EdgeWriter: a writer; EdgeReader: a reader)

    def __init__(self, comm: Communicator, peer: int, side: ChannelWriter | ChannelReader, hint: TensorHint | None,
                 node: str) -> None:
        self.comm, self.peer, self.side, self.node = comm, peer, side, node
        self.streams = streams_of(comm)
        self.static = bool(hint is not None and hint.static_shape)
        self.direct = bool(hint is not None and hint.direct_return)
        self.device = hint.device if hint is not None else "default"
        self.specs: tuple[Spec, ...] | None = None  # static specs, once known to both ends
        self.seq = 0

    @property
    def side_is_read(self) -> bool:
        """Does the reader read a side item for the current value? (both ends agree)"""
        return not (self.static and self.direct and self.specs is not None)

    def detach(self) -> None:
        self.side.detach()


class EdgeWriter(_End):
    """The producing end of one communicator channel."""

    side: ChannelWriter

    def send(self, item: Encoded | ErrorValue, origin: Origin) -> None:
        seq, self.seq = self.seq, self.seq + 1
        if isinstance(item, ErrorValue):
            return self._fail(seq, item)
        if self.static and self.specs is not None and item.specs != self.specs:
            return self._fail(seq, origin(ValueError(
                f"node {self.node} was declared _static_shape=True, but its tensors changed: the "
                f"first execution sent [{format_specs(self.specs)}], execution {seq} sent "
                f"[{format_specs(item.specs)}]; keep shapes and dtypes fixed or drop _static_shape"
            )))
        if self.side_is_read:
            first = not self.static or self.specs is None
            self.side.write(Meta(seq, None if self.direct else item.structure, item.specs if first else None))
        if self.static and self.specs is None:
            self.specs = item.specs
        for tensor in item.tensors:
            self._send(tensor)

    def skip(self, error: ErrorValue, failure: GroupFailure | None) -> None:
        """The next value is ``error``, on the side channel alone: the group failed and
        carries no data (``comm_faults``)."""
        seq, self.seq = self.seq, self.seq + 1
        self.side.write(Failed(seq, error, failure))

    def retract(self, error: ErrorValue, failure: GroupFailure | None) -> None:
        """The value whose ``send`` just raised (sent in part or not at all) is ``error``
        for the reader, which finds it after the group's abort woke it (``settle``)."""
        self.side.write(Failed(self.seq - 1, error, failure))

    def _fail(self, seq: int, error: ErrorValue) -> None:
        import torch

        self.side.write(Failed(seq, error))
        if not self.side_is_read:  # the reader only polls: keep the communicator matched
            for shape, dtype in self.specs or ():
                self._send(torch.zeros(shape, dtype=dtype, device=self.comm.device))

    def _send(self, tensor: torch.Tensor) -> None:
        device = self.comm.device
        t = tensor if tensor.device == device else tensor.to(device)
        self.comm.send(t.contiguous(), self.peer)
        self.streams.keep(t)  # the caching allocator must not reuse it too early


class EdgeReader(_End):
    """The consuming end of one communicator channel.

    ``view_last``: this edge's last tensor of an execution is the last message
    the actor receives from ``peer`` in it, so, where the communicator can
    (``recv_view``), it arrives as a view of the communicator's memory, valid
    until ``release()`` at the execution's end; the other tensors are copies.
    """

    side: ChannelReader

    def __init__(self, comm: Communicator, peer: int, side: ChannelWriter | ChannelReader, hint: TensorHint | None,
                 node: str, *, view_last: bool = False) -> None:
        super().__init__(comm, peer, side, hint, node)
        self.stash: dict[int, Failed] = {}  # Failed items read ahead of their value, by seq
        self.failure: GroupFailure | None = None  # the writer's group failure, from the last Failed that had one
        self.viewer = view_receiver(comm) if view_last else None
        self.leases: list[_Lease] = []  # what the views handed out in this execution hold

    def recv(self) -> tuple[UserValue, list[torch.Tensor]]:
        """The next value and the tensors received for it (the value may be an ErrorValue)."""
        seq, self.seq = self.seq, self.seq + 1
        if not self.side_is_read:
            tensors = self._recv_all(self.specs)
            self.comm.synchronize()  # the poll must come after the data (and any Failed) arrived
            failed = self._poll(seq)
            return (failed.error, []) if failed else (self._place(tensors)[0], tensors)
        item = self._take()
        if item.seq != seq:
            raise RuntimeGraphError(
                f"communicator channel of node {self.node}: side item {item.seq} arrived for "
                f"value {seq}; the two ends disagree (a cgraph bug)"
            )
        if isinstance(item, Failed):
            self.failure = item.failure or self.failure
            return item.error, []
        specs = item.specs if item.specs is not None else self.specs
        if self.static and self.specs is None:
            self.specs = item.specs
        tensors = self._recv_all(specs)
        return decode(item.structure, self._place(tensors)), tensors

    def release(self) -> None:
        """Free what the views of this execution hold (at its end; idempotent)."""
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()

    def _recv_all(self, specs: tuple[Spec, ...] | None) -> list[torch.Tensor]:
        if not specs or self.viewer is None:
            return [self._recv(spec) for spec in specs or ()]
        tensors = [self._recv(spec) for spec in specs[:-1]]  # copies: the link is read again
        tensor, lease = self.viewer(*specs[-1], self.peer)
        self.leases.append(lease)
        tensors.append(tensor)
        return tensors

    def _recv(self, spec: Spec) -> torch.Tensor:
        import torch

        buf = torch.empty(spec[0], dtype=spec[1], device=self.comm.device)
        self.comm.recv(buf, self.peer)
        return buf

    def _take(self) -> Meta | Failed:
        try:
            return cast("Meta | Failed", self.side.read())  # small plain objects: unpickled copies, safe after release
        finally:
            self.side.release()

    def skip(self, wait: float) -> Failed | None:
        """The next value of a failed group, without a communicator call: its ``Failed``
        item, waited for up to ``wait`` seconds (``_drain``), or None."""
        seq, self.seq = self.seq, self.seq + 1
        return self._drain(seq, wait)

    def settle(self, wait: float) -> Failed | None:
        """After ``recv`` raised: the ``Failed`` item the writer wrote for that value (its
        own fault, written before it closed the group's control), or None."""
        return self._drain(self.seq - 1, wait)

    def _drain(self, seq: int, wait: float) -> Failed | None:
        """Side items up to the ``Failed`` of value ``seq``: Meta items (data nobody will
        receive) and earlier values' items are dropped, later values' Failed kept. Waits
        up to ``wait`` s, less once an item of a later value shows that none will come
        (a writer whose send went through before it saw the group fail writes none)."""
        deadline = time.monotonic() + wait
        while seq not in self.stash and not any(s > seq for s in self.stash):
            item = self._poll_one(max(0.0, deadline - time.monotonic()))
            if item is None:
                break
            if isinstance(item, Failed) and item.seq >= seq:
                self.stash[item.seq] = item
            if item.seq > seq:
                break
        for old in [s for s in self.stash if s < seq]:
            del self.stash[old]
        return self.stash.pop(seq, None)

    def _poll(self, seq: int) -> Failed | None:
        if not self.stash:
            item = self._poll_one(0)
            if item is not None:
                self.stash[item.seq] = cast(Failed, item)  # only Failed items when polling (no Meta is written)
        return self.stash.pop(seq, None)

    def _poll_one(self, timeout: float) -> Meta | Failed | None:
        try:
            return self.side.read(timeout=timeout)  # type: ignore[no-any-return]
        except TimeoutError:  # ChannelTimeoutError: nothing there
            return None
        finally:
            self.side.release()

    def _place(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The received tensors on the device the hint asks for ("default": as received)."""
        if self.device == "default" or not tensors:
            return tensors
        target = "cpu" if self.device == "cpu" else "cuda"
        if target == "cuda" and not has_cuda():
            raise RuntimeGraphError(
                f"node {self.node} asks for device={self.device!r}, but this actor has no GPU; "
                'use device="cpu" or "default", or give the reading actor num_gpus'
            )
        return [t.to(target) for t in tensors]
