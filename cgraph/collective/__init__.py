"""cgraph's collective library: allreduce and friends over point-to-point transports.

The algorithm core lives in ``types`` (reduce ops), ``transport`` (the
point-to-point protocol and an in-memory implementation), ``algorithms``
(one module per algorithm, selected by name through ``ALGORITHMS``),
``cost_model`` (alpha-beta-gamma predictions and fitting) and ``teams``
(sub-teams of a transport, as in NVSHMEM). The imperative API for Ray actors
(``api``: ``init_collective_group``, ``allreduce``, ...) is re-exported here;
it is imported on first use, so the algorithm core loads without Ray.

``allreduce``, ``allgather`` and ``reducescatter`` are also DAG builders:
``allreduce.bind([n1, n2], op=ReduceOp.SUM)`` returns one output node per
member (``dag_ops``); called directly inside an actor they run the imperative
collective.
"""

from __future__ import annotations

import importlib
from typing import Any

from cgraph.comm.types import ReduceOp

_API = (
    "init_collective_group", "declare_collective_group", "create_collective_group",
    "is_group_initialized", "get_rank",
    "get_collective_group_size", "destroy_collective_group", "nccl_available", "gloo_available",
    "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "send", "recv", "barrier",
    "split_strided", "split_2d", "node_team", "world_team",
    "explain", "choose_algorithm", "get_cost_params", "set_cost_params", "tune",
)
_DAG_OPS = ("allreduce", "allgather", "reducescatter")  # callable and .bind-able
_ELSEWHERE = {"CostParams": "cgraph.comm.cost_model", "Team": "cgraph.comm.teams"}

__all__ = ["ReduceOp", *_API, *_ELSEWHERE]


def __getattr__(name: str) -> Any:
    if name in _DAG_OPS:
        value = getattr(importlib.import_module("cgraph.collective.dag_ops"), name)
    elif name in _API:
        value = getattr(importlib.import_module("cgraph.collective.api"), name)
    elif name in _ELSEWHERE:
        value = getattr(importlib.import_module(_ELSEWHERE[name]), name)
    else:
        raise AttributeError(f"module 'cgraph.collective' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
