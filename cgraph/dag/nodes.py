"""cgraph's type hints on Ray DAG nodes: ``TorchTensorType`` and ``with_type_hint``.

- ``TorchTensorType`` is cgraph's type hint, with Ray's constructor. Unlike
  Ray 2.60's class it accepts ``transport="nccl"`` (as the seed writes it):
  "auto" lets cgraph choose per edge, "shm" is host shared memory, "nccl" (or
  "accelerator") is the GPU communicator, and an object is a communicator.
- ``with_type_hint(node, hint)`` attaches a hint; ``node.with_type_hint(hint)``
  works too (Ray 2.60's nodes lack the method; ``cgraph.compat`` adds it).
- ``to_tensor_hint`` turns either kind of hint into the IR's ``TensorHint``,
  naming communicator objects through a ``CommunicatorTable``.

cgraph's ``InputNode`` and ``MultiOutputNode`` (whose ``experimental_compile``
calls the compiler) live in ``cgraph.compat``, above the compiler.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ray.dag import DAGNode
from ray.experimental.channel.auto_transport_type import AutoTransportType
from ray.experimental.channel.common import ChannelOutputType
from ray.experimental.channel.communicator import Communicator as RayCommunicator
from ray.experimental.channel.shared_memory_channel import SharedMemoryType
from ray.experimental.channel.torch_tensor_type import TorchTensorType as _RayTorchTensorType

from cgraph._boundary import RayObject, UserValue
from cgraph.dag.validate import error_message
from cgraph.errors import DAGValidationError
from cgraph.ir import TensorHint

if TYPE_CHECKING:
    from ray.experimental.util.types import Device

_DEVICES = ("default", "cpu", "gpu", "cuda")
_TRANSPORTS = {"auto": "auto", "shm": "shm", "nccl": "nccl", "accelerator": "nccl"}


class TorchTensorType:
    """A type hint for a node whose value is (or holds) torch tensors.

    Args:
        transport: "auto" (cgraph picks per edge: a communicator between GPU
            actors, shared memory otherwise), "shm", "nccl" (alias
            "accelerator"), or a communicator object used for this edge.
        device: where the reader wants the tensors: "default" (as sent),
            "cpu", "gpu" or "cuda".
        _static_shape: shapes and dtypes never change between executions, so
            they are sent once.
        _direct_return: the value is a tensor itself, not a structure holding
            tensors, so no side channel is needed.

    Raises:
        ValueError: an unknown transport or device, or "nccl" with device "cpu".
    """

    def __init__(
        self,
        transport: str | UserValue | None = "auto",
        device: str | Device = "default",
        _static_shape: bool = False,
        _direct_return: bool = False,
    ) -> None:
        device = getattr(device, "value", device)  # Ray's Device enum
        if device not in _DEVICES:
            raise ValueError(f"TorchTensorType: device must be one of {_DEVICES}, got {device!r}")
        self.communicator: UserValue | None = None
        transport = "auto" if transport is None else transport
        if isinstance(transport, str):
            if transport not in _TRANSPORTS:
                raise ValueError(
                    f"TorchTensorType: transport must be one of {sorted(_TRANSPORTS)} or a "
                    f"communicator object, got {transport!r}"
                )
            transport = _TRANSPORTS[transport]
        else:
            self.communicator, transport = transport, "custom"
        if transport == "nccl" and device == "cpu":
            raise ValueError(
                'TorchTensorType: transport "nccl" delivers on the GPU; with device="cpu" '
                'use transport="shm"'
            )
        self.transport: str = transport
        self.device: str = device
        self.static_shape = bool(_static_shape)
        self.direct_return = bool(_direct_return)

    def _key(self) -> tuple[object, ...]:
        return (self.transport, id(self.communicator), self.device, self.static_shape, self.direct_return)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TorchTensorType) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        transport = repr(self.communicator) if self.communicator is not None else repr(self.transport)
        return (
            f"TorchTensorType(transport={transport}, device={self.device!r}, "
            f"_static_shape={self.static_shape}, _direct_return={self.direct_return})"
        )


class CommunicatorTable:
    """Names user communicator objects "custom:<Class>" (by identity, first use first)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self.objects: dict[str, UserValue] = {}

    def name(self, obj: object) -> str:
        """The IR transport name of ``obj``, registering it on first use."""
        if id(obj) not in self._names:
            base = "custom:" + "".join(c if c.isalnum() or c in "_.-" else "_" for c in type(obj).__name__)
            names = (base if i == 0 else f"{base}_{i}" for i in itertools.count())
            name = next(n for n in names if n not in self.objects)
            self._names[id(obj)], self.objects[name] = name, obj
        return self._names[id(obj)]


def to_tensor_hint(hint: object, table: CommunicatorTable) -> TensorHint | None:
    """The IR's ``TensorHint`` for a node's type hint (cgraph's or Ray's); ``None`` if none.

    Ray's own ``TorchTensorType`` keeps Ray's meaning: its "auto" transport is
    host memory ("shm"), "accelerator" is "nccl", a communicator whose transport is
    "cpu" (Ray's ``CPUCommunicator``) is host memory too; ``AutoTransportType`` (from
    ``with_tensor_transport("auto")``) is "auto".

    Raises:
        DAGValidationError: a hint cgraph cannot read.
    """
    if isinstance(hint, TorchTensorType):
        transport = table.name(hint.communicator) if hint.communicator is not None else hint.transport
        return TensorHint(transport, hint.device, hint.static_shape, hint.direct_return)
    if type(hint) in (ChannelOutputType, SharedMemoryType):  # Ray's "no hint" and its default
        return None
    static, direct = bool(getattr(hint, "_static_shape", False)), bool(getattr(hint, "_direct_return", False))
    device = str(getattr(getattr(hint, "device", None), "value", "default"))
    if isinstance(hint, AutoTransportType):
        return TensorHint("auto", device, static, direct)
    if isinstance(hint, _RayTorchTensorType):
        comm = hint.get_custom_communicator()
        if comm is not None and hint.transport != _RayTorchTensorType.CPU:
            return TensorHint(table.name(comm), device, static, direct)
        if comm is not None:  # a "cpu" communicator (Ray's CPUCommunicator): host memory, as in Ray
            return TensorHint("shm", device, static, direct)
        if hint.transport in (_RayTorchTensorType.AUTO, _RayTorchTensorType.ACCELERATOR):
            transport = "nccl" if hint.transport == _RayTorchTensorType.ACCELERATOR else "shm"
            return TensorHint(transport, device, static, direct)
    raise DAGValidationError(error_message(
        f"unsupported type hint {hint!r}", repr(hint),
        "cgraph reads tensor-transport hints: a transport name or a communicator object",
        "use node.with_tensor_transport(...) or cgraph.TorchTensorType(transport=...)",
    ))


def with_type_hint(node: object, hint: TorchTensorType | ChannelOutputType) -> RayObject:
    """Attach a tensor type hint to a DAG node's output (also ``node.with_type_hint(hint)``).

    A cgraph hint goes through Ray's public ``with_tensor_transport`` (so Ray
    reads it too) unless its communicator is not one of Ray's; then it is kept
    as is, and only cgraph reads it.

    Args:
        node: a Ray DAG node (``actor.method.bind(...)``, ``inp[0]``, ...).
        hint: cgraph's ``TorchTensorType``, or one of Ray's type hints.

    Returns:
        ``node`` itself, so calls chain as in Ray's examples.

    Raises:
        TypeError: ``node`` is not a DAG node or ``hint`` not a type hint.
    """
    if not isinstance(node, DAGNode):
        raise TypeError(f"with_type_hint: expected a Ray DAG node, got {type(node).__name__}")
    if isinstance(hint, TorchTensorType):
        comm = hint.communicator
        if comm is not None and not isinstance(comm, RayCommunicator):
            node.type_hint = hint  # type: ignore[assignment]  # a communicator Ray does not know
            return node
        return node.with_tensor_transport(
            transport=comm if comm is not None else hint.transport, device=hint.device,  # type: ignore[arg-type]
            _static_shape=hint.static_shape, _direct_return=hint.direct_return,
        )
    if isinstance(hint, ChannelOutputType):
        node.type_hint = hint
        return node
    raise TypeError(f"with_type_hint: expected cgraph.TorchTensorType or a Ray type hint, got {hint!r}")
