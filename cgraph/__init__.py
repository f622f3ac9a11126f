"""cgraph: a compiled dataflow-graph executor for Ray actors.

    import ray
    from cgraph import InputNode, MultiOutputNode, TorchTensorType

    with InputNode() as inp:
        dag = MultiOutputNode([worker.f.bind(inp)])
    compiled = dag.experimental_compile()      # or cgraph.compile(dag)

``import cgraph`` stays light: the errors load at once; ``compile`` and the DAG
names (which import Ray) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from cgraph.errors import (
    ActorDiedError,
    CapacityError,
    CGraphError,
    ChannelClosedError,
    ChannelTimeoutError,
    CommunicatorError,
    CompileError,
    DAGValidationError,
    DeadlockError,
    EmptyDAGError,
    ExecuteArgumentError,
    FunctionNodeError,
    GraphSyntaxError,
    GraphTornDownError,
    MultipleInputsError,
    NestedNodeError,
    NodeDiedError,
    RefConsumedError,
    RuntimeGraphError,
    ScheduleInvariantError,
    TaskError,
    TimeoutError,
    TransportError,
    UnknownMethodError,
    UnusedInputError,
)

if TYPE_CHECKING:
    from cgraph.comm import Communicator
    from cgraph.compat import InputNode, MultiOutputNode, TorchTensorType, with_type_hint
    from cgraph.compiler import compile, plan
    from cgraph.runtime import CompiledGraph, CompiledRef, wait

_LAZY = {
    "Communicator": "cgraph.comm",
    "compile": "cgraph.compiler",
    "plan": "cgraph.compiler",
    "InputNode": "cgraph.compat",
    "MultiOutputNode": "cgraph.compat",
    "TorchTensorType": "cgraph.compat",
    "with_type_hint": "cgraph.compat",
    "CompiledGraph": "cgraph.runtime",
    "CompiledRef": "cgraph.runtime",
    "wait": "cgraph.runtime",
}


def __getattr__(name: str) -> object:
    """Load the Ray-dependent public names on first use (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cgraph' has no attribute {name!r}")


__all__ = [
    "ActorDiedError",
    "CGraphError",
    "CapacityError",
    "ChannelClosedError",
    "ChannelTimeoutError",
    "CommunicatorError",
    "CompileError",
    "Communicator",
    "CompiledGraph",
    "CompiledRef",
    "DAGValidationError",
    "DeadlockError",
    "EmptyDAGError",
    "ExecuteArgumentError",
    "FunctionNodeError",
    "GraphSyntaxError",
    "GraphTornDownError",
    "InputNode",
    "MultiOutputNode",
    "MultipleInputsError",
    "NestedNodeError",
    "NodeDiedError",
    "RefConsumedError",
    "RuntimeGraphError",
    "ScheduleInvariantError",
    "TaskError",
    "TimeoutError",
    "TorchTensorType",
    "TransportError",
    "UnknownMethodError",
    "UnusedInputError",
    "compile",
    "plan",
    "wait",
    "with_type_hint",
]
