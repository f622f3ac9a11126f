"""cgraph's authoring names: Ray's DAG API, compiled by cgraph.

Ray's overlap example runs on cgraph by changing its imports only::

    from ray.dag import InputNode, MultiOutputNode                       # before
    from ray.experimental.channel.torch_tensor_type import TorchTensorType
    from cgraph import InputNode, MultiOutputNode, TorchTensorType      # after

- ``InputNode`` / ``MultiOutputNode`` are Ray's classes, subclassed: the DAG is
  still built with ``actor.method.bind(...)``; ``experimental_compile(...)``
  takes Ray's keyword names and returns cgraph's compiled graph.
- A single-output DAG's root is Ray's own ``ClassMethodNode``; importing
  ``cgraph.dag`` installs a dispatch on Ray's ``experimental_compile`` that
  sends a DAG to cgraph only when its InputNode is cgraph's (see
  ``adapter.install_ray_hooks``). Plain Ray DAGs keep Ray's behaviour.
- ``TorchTensorType`` is cgraph's type hint, with Ray's constructor. Unlike
  Ray 2.60's class it accepts ``transport="nccl"`` (as the seed writes it):
  "auto" lets cgraph choose per edge, "shm" is host shared memory, "nccl" (or
  "accelerator") is the GPU communicator, and an object is a communicator.
- ``with_type_hint(node, hint)`` attaches a hint; ``node.with_type_hint(hint)``
  works too (Ray 2.60's nodes lack the method; the hooks add it).
"""

from __future__ import annotations

import itertools
from typing import Any

from ray.dag import DAGNode
from ray.dag import InputNode as _RayInputNode
from ray.dag import MultiOutputNode as _RayMultiOutputNode
from ray.experimental.channel.auto_transport_type import AutoTransportType
from ray.experimental.channel.common import ChannelOutputType
from ray.experimental.channel.communicator import Communicator as RayCommunicator
from ray.experimental.channel.shared_memory_channel import SharedMemoryType
from ray.experimental.channel.torch_tensor_type import TorchTensorType as _RayTorchTensorType

from cgraph.dag.validate import error_message
from cgraph.errors import DAGValidationError
from cgraph.ir import TensorHint

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
        transport: Any = "auto",
        device: Any = "default",
        _static_shape: bool = False,
        _direct_return: bool = False,
    ) -> None:
        device = getattr(device, "value", device)  # Ray's Device enum
        if device not in _DEVICES:
            raise ValueError(f"TorchTensorType: device must be one of {_DEVICES}, got {device!r}")
        self.communicator: Any = None
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

    def _key(self) -> tuple[Any, ...]:
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
        self.objects: dict[str, Any] = {}

    def name(self, obj: Any) -> str:
        """The IR transport name of ``obj``, registering it on first use."""
        if id(obj) not in self._names:
            base = "custom:" + "".join(c if c.isalnum() or c in "_.-" else "_" for c in type(obj).__name__)
            names = (base if i == 0 else f"{base}_{i}" for i in itertools.count())
            name = next(n for n in names if n not in self.objects)
            self._names[id(obj)], self.objects[name] = name, obj
        return self._names[id(obj)]


def to_tensor_hint(hint: Any, table: CommunicatorTable) -> TensorHint | None:
    """The IR's ``TensorHint`` for a node's type hint (cgraph's or Ray's); ``None`` if none.

    Ray's own ``TorchTensorType`` keeps Ray's meaning: its "auto" transport is
    host memory ("shm"), "accelerator" is "nccl"; ``AutoTransportType`` (from
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
        if comm is not None:
            return TensorHint(table.name(comm), device, static, direct)
        if hint.transport in (_RayTorchTensorType.AUTO, _RayTorchTensorType.ACCELERATOR):
            transport = "nccl" if hint.transport == _RayTorchTensorType.ACCELERATOR else "shm"
            return TensorHint(transport, device, static, direct)
    raise DAGValidationError(error_message(
        f"unsupported type hint {hint!r}", repr(hint),
        "cgraph reads tensor-transport hints: a transport name or a communicator object",
        "use node.with_tensor_transport(...) or cgraph.TorchTensorType(transport=...)",
    ))


def with_type_hint(node: Any, hint: Any) -> Any:
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


def compile_with_ray_options(
    dag: Any,
    _submit_timeout: float | None = None,
    _buffer_size_bytes: int | None = None,
    enable_asyncio: bool = False,
    _max_inflight_executions: int | None = None,
    _max_buffered_results: int | None = None,
    _overlap_gpu_communication: bool | None = None,
    _default_communicator: Any = "create",
) -> Any:
    """``cgraph.compile`` behind Ray 2.60's ``experimental_compile`` signature.

    As in Ray, an argument left at ``None`` takes its value from Ray's
    ``DAGContext`` (which reads the ``RAY_CGRAPH_*`` environment variables), with
    one exception: Ray's untouched default ``get_timeout`` of 10 s becomes
    cgraph's "no limit" (a first execution whose actors still import torch
    outlasts it); a value the user set (``DAGContext.get_current().get_timeout
    = 30`` or ``RAY_CGRAPH_get_timeout``) is kept. A timeout of -1 (Ray: wait
    forever) means no limit; the default communicator ``"create"`` (Ray: create
    one per group) maps to cgraph's default.

    Returns:
        What ``cgraph.compile`` returns.
    """
    from cgraph.compiler import compile as cgraph_compile

    options = ray_context_options()
    options["enable_asyncio"] = enable_asyncio
    given = {"submit_timeout": _submit_timeout, "buffer_size_bytes": _buffer_size_bytes,
             "max_inflight_executions": _max_inflight_executions,
             "max_buffered_results": _max_buffered_results,
             "overlap_gpu_communication": _overlap_gpu_communication}
    options.update({name: value for name, value in given.items() if value is not None})
    if options.get("submit_timeout") is not None and options["submit_timeout"] < 0:
        options["submit_timeout"] = None  # Ray's -1: wait forever
    if _default_communicator is not None and not (
        isinstance(_default_communicator, str) and _default_communicator == "create"
    ):
        options["default_communicator"] = _default_communicator
    return cgraph_compile(dag, **options)


RAY_DEFAULT_GET_TIMEOUT_S = 10
"""Ray's built-in ``DAGContext.get_timeout`` (when ``RAY_CGRAPH_get_timeout`` is unset)."""


def ray_context_options() -> dict[str, Any]:
    """cgraph.compile options from Ray's current ``DAGContext`` (see compile_with_ray_options)."""
    from ray.dag.context import DAGContext

    ctx = DAGContext.get_current()
    options: dict[str, Any] = {
        "submit_timeout": ctx.submit_timeout,
        "buffer_size_bytes": int(ctx.buffer_size_bytes),
        "max_inflight_executions": ctx.max_inflight_executions,
        "max_buffered_results": ctx.max_buffered_results,
        "overlap_gpu_communication": bool(ctx.overlap_gpu_communication),
    }
    if ctx.get_timeout != RAY_DEFAULT_GET_TIMEOUT_S:
        options["get_timeout"] = ctx.get_timeout
    return options


class _CompiledByCGraph:
    """Mixin: ``experimental_compile`` with Ray's keywords, compiled by cgraph."""

    def experimental_compile(self, *args: Any, **kwargs: Any) -> Any:
        """Compile this DAG with cgraph; takes Ray's ``experimental_compile`` arguments.

        Returns:
            cgraph's compiled graph (see ``cgraph.compile``).

        Raises:
            cgraph.CompileError: the DAG cannot be compiled (the message says why).
        """
        return compile_with_ray_options(self, *args, **kwargs)


class InputNode(_CompiledByCGraph, _RayInputNode):
    """Ray's ``InputNode``; a DAG built on it compiles with cgraph."""

    _cgraph_input = True  # read by adapter.uses_cgraph_input

    def _copy_impl(self, new_args: Any, new_kwargs: Any, new_options: Any, new_other: Any) -> InputNode:
        return InputNode(_other_args_to_resolve=new_other)


class MultiOutputNode(_CompiledByCGraph, _RayMultiOutputNode):
    """Ray's ``MultiOutputNode``; ``experimental_compile`` compiles with cgraph."""

    def _copy_impl(self, new_args: Any, new_kwargs: Any, new_options: Any, new_other: Any) -> MultiOutputNode:
        return MultiOutputNode(new_args, new_other)


def install_ray_hooks() -> None:
    """Two additive, idempotent changes to Ray's ``DAGNode`` class (run on import of cgraph.dag).

    1. ``experimental_compile`` is wrapped: a DAG that reads cgraph's ``InputNode``
       goes to cgraph (``compile_with_ray_options``); any other DAG goes to Ray's
       original method with the same arguments, so plain Ray DAGs are unaffected.
    2. ``with_type_hint(hint)`` is added where Ray lacks it (Ray 2.60 does), so Ray
       examples that call it run; it is ``cgraph.with_type_hint``.
    """
    from cgraph.dag.adapter import uses_cgraph_input

    original = DAGNode.experimental_compile
    if not getattr(original, "_cgraph_dispatch", False):

        def experimental_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
            if uses_cgraph_input(self):
                return compile_with_ray_options(self, *args, **kwargs)
            return original(self, *args, **kwargs)

        experimental_compile.__doc__ = original.__doc__
        experimental_compile.__wrapped__ = original  # type: ignore[attr-defined]
        experimental_compile._cgraph_dispatch = True  # type: ignore[attr-defined]
        DAGNode.experimental_compile = experimental_compile  # type: ignore[method-assign]
    if not hasattr(DAGNode, "with_type_hint"):
        DAGNode.with_type_hint = with_type_hint  # type: ignore[attr-defined]
