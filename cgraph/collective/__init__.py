"""Collectives for Ray actors: allreduce and friends, in the shape of ``ray.util.collective``.

Inside actors, join a group (``init_collective_group`` in each member, or
``declare_collective_group`` from the driver), then call ``allreduce``,
``broadcast``, ... on torch tensors, numpy or cupy arrays; every member makes the
same calls in the same order. Backends: "cpu" (shared memory between the actors of
one node, cgraph's algorithms, ``algorithm="auto"`` fitted per group), "gloo" (any
nodes), "nccl" (CUDA tensors). ``split_strided`` and ``split_2d`` make teams;
``tune``, ``choose_algorithm`` and ``explain`` show the cost model behind "auto".

In a compiled graph, ``allreduce.bind([n1, n2], op=ReduceOp.SUM)`` (and
``allgather``, ``reducescatter``) returns one node per member.

The names load on first use (from ``api`` and ``dag_ops``), so this
module loads without Ray; the algorithms live in ``cgraph.comm``. The guide is
docs/collective.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from cgraph.comm.types import ReduceOp

if TYPE_CHECKING:
    from cgraph.collective.dag_ops import AllGather, AllReduce, ReduceScatter

_API = (
    "init_collective_group", "declare_collective_group", "create_collective_group",
    "is_group_initialized", "get_rank",
    "get_collective_group_size", "destroy_collective_group", "nccl_available", "gloo_available",
    "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "send", "recv", "barrier",
    "split_strided", "split_2d", "node_team", "world_team",
)
_TUNING = ("explain", "choose_algorithm", "get_cost_params", "set_cost_params", "tune")
_DAG_OPS = ("allreduce", "allgather", "reducescatter")  # callable and .bind-able
_ELSEWHERE = {"CostParams": "cgraph.comm.tuning.cost_model", "Team": "cgraph.comm.teams"}

__all__ = ["ReduceOp", *_API, *_TUNING, *_ELSEWHERE]

# The three collectives that are also DAG builders are objects, loaded on first
# use like the rest; these declarations carry their reference documentation.
allreduce: AllReduce
"""Reduce a tensor over a group: called inside an actor, or bound as DAG nodes.

``allreduce(tensor, group_name="default", op=ReduceOp.SUM, algorithm="auto")``
inside each member actor reduces ``tensor`` in place on every rank.
``allreduce.bind(nodes, op=ReduceOp.SUM, algorithm="auto")`` in a DAG gives
every member the reduction of all members' tensors.

Args:
    tensor: a torch tensor, numpy or cupy array (same dtype and shape on every rank).
    group_name: the group (``init_collective_group`` / ``declare_collective_group``).
    op: ``ReduceOp.SUM``, ``PRODUCT``, ``MIN`` or ``MAX`` (or its name).
    algorithm: "auto" (the cost model fitted to this group chooses; on "gloo"
        and "nccl" the backend's own allreduce, named "native", is a candidate), "native", or one of cgraph's:
        "ring", "tree", "butterfly", "star", "chain", "reduction_server", "shared".
    nodes: (``bind``) one DAG node per member actor, each a method's result
        holding a torch tensor.

Returns:
    The call: None (``tensor`` holds the result). ``bind``: one node per member,
    in the order of ``nodes``, usable as arguments of later ``.bind`` calls.

Raises:
    CollectiveGroupError: an unknown or destroyed group (the call).
    CollectiveMismatchError: ranks called with different dtypes, shapes or ops.
    CollectiveTimeoutError: a peer did not arrive within the group's timeout.
    ValueError: a dtype or op that does not reduce, checked before anything is sent.
    DAGValidationError: (``bind``) an empty list, a node that is no actor
        method's result, two members on one actor, an unknown op or algorithm.
"""

allgather: AllGather
"""Gather every rank's tensor: called inside an actor, or bound as DAG nodes.

``allgather(tensor_list, tensor, group_name="default")`` inside each member
fills ``tensor_list[r]`` with rank r's ``tensor``. ``allgather.bind(nodes)`` in a
DAG gives every member all members' tensors concatenated along dim 0 (0-d
tensors stacked), in member order.

Args:
    tensor_list: ``world_size`` tensors shaped and typed like ``tensor``.
    tensor: this rank's contribution.
    group_name: the group.
    nodes: (``bind``) one DAG node per member actor.

Returns:
    The call: None. ``bind``: one node per member, in the order of ``nodes``.

Raises:
    CollectiveGroupError, CollectiveMismatchError, CollectiveTimeoutError: as
        for ``allreduce``.
    ValueError: ``tensor_list`` of the wrong length, shape or dtype.
    DAGValidationError: (``bind``) an empty list, a node that is no actor
        method's result, or two members on one actor.
"""

reducescatter: ReduceScatter
"""Reduce, then scatter the slices: called inside an actor, or bound as DAG nodes.

``reducescatter(tensor, tensor_list, group_name="default", op=ReduceOp.SUM)``
inside each member sets ``tensor`` to the reduction over ranks of their
``tensor_list[rank]``. ``reducescatter.bind(nodes, op=ReduceOp.SUM)`` in a DAG
gives member i slice i (dim 0, equal parts) of the reduction of all members' tensors.

Args:
    tensor: this rank's output.
    tensor_list: ``world_size`` tensors shaped and typed like ``tensor``.
    group_name: the group.
    op: ``ReduceOp.SUM``, ``PRODUCT``, ``MIN`` or ``MAX`` (or its name).
    nodes: (``bind``) one DAG node per member actor; dim 0 a multiple of the
        member count.

Returns:
    The call: None. ``bind``: one node per member, in the order of ``nodes``.

Raises:
    CollectiveGroupError, CollectiveMismatchError, CollectiveTimeoutError: as
        for ``allreduce``.
    ValueError: ``tensor_list`` of the wrong length, shape or dtype, or a dtype
        that does not reduce.
    DAGValidationError: (``bind``) as for ``allgather``, or an unknown op.
"""


def __getattr__(name: str) -> object:
    if name in _DAG_OPS:
        value = getattr(importlib.import_module("cgraph.collective.dag_ops"), name)
    elif name in _API or name in _TUNING:
        value = getattr(importlib.import_module("cgraph.collective.api"), name)
    elif name in _ELSEWHERE:
        value = getattr(importlib.import_module(_ELSEWHERE[name]), name)
    else:
        raise AttributeError(f"module 'cgraph.collective' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
