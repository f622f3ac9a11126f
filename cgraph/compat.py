"""The Ray compatibility layer: Ray's DAG names, compiled by cgraph (layer 5).

Ray's overlap example runs on cgraph by changing its imports only::

    from ray.dag import InputNode, MultiOutputNode                       # before
    from ray.experimental.channel.torch_tensor_type import TorchTensorType
    from cgraph import InputNode, MultiOutputNode, TorchTensorType      # after

- ``InputNode`` / ``MultiOutputNode`` are Ray's classes, subclassed: the DAG is
  still built with ``actor.method.bind(...)``; ``experimental_compile(...)``
  takes Ray's keyword names (``compile_with_ray_options``) and returns cgraph's
  compiled graph.
- A single-output DAG's root is Ray's own ``ClassMethodNode``; importing this
  module installs a dispatch on Ray's ``experimental_compile`` that sends a DAG
  to cgraph only when its InputNode is cgraph's (``install_ray_hooks``). Plain
  Ray DAGs keep Ray's behaviour.
- ``TorchTensorType`` and ``with_type_hint`` come from ``cgraph.dag``.

This module sits above the compiler, so the compiler and the front end never
import it; ``cgraph/__init__.py`` loads it when a Ray name is first used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ray.dag import DAGNode
from ray.dag import InputNode as _RayInputNode
from ray.dag import MultiOutputNode as _RayMultiOutputNode

from cgraph import compiler
from cgraph.dag import TorchTensorType, with_type_hint
from cgraph.dag.adapter import uses_cgraph_input

if TYPE_CHECKING:
    from cgraph._boundary import RayObject, UserValue
    from cgraph.runtime.compiled_graph import CompiledGraph

__all__ = ["InputNode", "MultiOutputNode", "TorchTensorType", "compile_with_ray_options",
           "install_ray_hooks", "with_type_hint"]


def compile_with_ray_options(
    dag: RayObject,
    _submit_timeout: float | None = None,
    _buffer_size_bytes: int | None = None,
    enable_asyncio: bool = False,
    _max_inflight_executions: int | None = None,
    _max_buffered_results: int | None = None,
    _overlap_gpu_communication: bool | str | None = None,
    _default_communicator: str | UserValue | None = "create",
) -> CompiledGraph:
    """``cgraph.compile`` behind Ray 2.60's ``experimental_compile`` signature.

    As in Ray, an argument left at ``None`` takes its value from Ray's
    ``DAGContext`` (which reads the ``RAY_CGRAPH_*`` environment variables), with
    one exception: Ray's untouched default ``get_timeout`` of 10 s becomes
    cgraph's "no limit" (a first execution whose actors still import torch
    outlasts it); a value the user set (``DAGContext.get_current().get_timeout
    = 30``, or ``RAY_CGRAPH_get_timeout`` in the environment, even at 10) is
    kept. A timeout of -1 (Ray: wait forever) means no limit; the default
    communicator ``"create"`` (Ray: create one per group) maps to cgraph's default.

    Returns:
        What ``cgraph.compile`` returns.
    """
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
    return compiler.compile(dag, **options)


RAY_DEFAULT_GET_TIMEOUT_S = 10
"""Ray's built-in ``DAGContext.get_timeout`` (when ``RAY_CGRAPH_get_timeout`` is unset)."""


def ray_context_options() -> dict[str, UserValue]:
    """cgraph.compile options from Ray's current ``DAGContext`` (see compile_with_ray_options)."""
    from ray.dag.context import DAGContext

    ctx = DAGContext.get_current()
    options: dict[str, UserValue] = {
        "submit_timeout": ctx.submit_timeout,
        "buffer_size_bytes": int(ctx.buffer_size_bytes),
        "max_inflight_executions": ctx.max_inflight_executions,
        "max_buffered_results": ctx.max_buffered_results,
        "overlap_gpu_communication": bool(ctx.overlap_gpu_communication),
        "teardown_timeout": float(ctx.teardown_timeout),
    }
    if ctx.get_timeout != RAY_DEFAULT_GET_TIMEOUT_S or GET_TIMEOUT_ENV in os.environ:
        options["get_timeout"] = ctx.get_timeout
    return options


GET_TIMEOUT_ENV = "RAY_CGRAPH_get_timeout"
"""Set (even to Ray's 10), Ray's get timeout is kept: that is how to ask for Ray's default."""


class _CompiledByCGraph:
    """Mixin: ``experimental_compile`` with Ray's keywords, compiled by cgraph."""

    def experimental_compile(self, *args: UserValue, **kwargs: UserValue) -> CompiledGraph:
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

    def _copy_impl(self, new_args: list[DAGNode], new_kwargs: dict[str, object], new_options: dict[str, object],
                   new_other: dict[str, object]) -> InputNode:
        return InputNode(_other_args_to_resolve=new_other)


class MultiOutputNode(_CompiledByCGraph, _RayMultiOutputNode):
    """Ray's ``MultiOutputNode``; ``experimental_compile`` compiles with cgraph."""

    def _copy_impl(self, new_args: list[DAGNode], new_kwargs: dict[str, object], new_options: dict[str, object],
                   new_other: dict[str, object]) -> MultiOutputNode:
        return MultiOutputNode(new_args, new_other)


def install_ray_hooks() -> None:
    """Two additive, idempotent changes to Ray's ``DAGNode`` class (run on import of cgraph.dag).

    1. ``experimental_compile`` is wrapped: a DAG that reads cgraph's ``InputNode``
       goes to cgraph (``compile_with_ray_options``); any other DAG goes to Ray's
       original method with the same arguments, so plain Ray DAGs are unaffected.
    2. ``with_type_hint(hint)`` is added where Ray lacks it (Ray 2.60 does), so Ray
       examples that call it run; it is ``cgraph.with_type_hint``.
    """
    original = DAGNode.experimental_compile
    if not getattr(original, "_cgraph_dispatch", False):

        def experimental_compile(self: DAGNode, *args: UserValue, **kwargs: UserValue) -> CompiledGraph | RayObject:
            if uses_cgraph_input(self):
                return compile_with_ray_options(self, *args, **kwargs)
            return original(self, *args, **kwargs)

        experimental_compile.__doc__ = original.__doc__
        experimental_compile.__wrapped__ = original  # type: ignore[attr-defined]
        experimental_compile._cgraph_dispatch = True  # type: ignore[attr-defined]
        DAGNode.experimental_compile = experimental_compile  # type: ignore[method-assign]
    if not hasattr(DAGNode, "with_type_hint"):
        DAGNode.with_type_hint = with_type_hint  # type: ignore[attr-defined]


install_ray_hooks()
