"""How errors name a node of a Ray DAG: Ray's side of it, as the user wrote it.

    Worker.h(inp, list(...nodes...))      a call, its arguments ``depth`` levels deep
    Worker.split(inp)[1]                  one return value of a num_returns=2 call
    allreduce(W.f(inp), W.f(inp), op='sum')[0]    a member's result of a collective
    inp[1], inp.key                       items of the input

The adapter (reading) and the collectives' bind (checking members) both word their
errors with it; it reads Ray's node objects and cgraph's collective nodes, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from ray.dag import ClassMethodNode, ClassNode, DAGNode, FunctionNode, InputAttributeNode
from ray.dag import InputNode as RayInputNode
from ray.dag import MultiOutputNode as RayMultiOutputNode

from cgraph._boundary import ActorHandle, UserValue
from cgraph.dag.collective_node import CollectiveNode, CollectiveOutput


def describe(node: object, depth: int = 1) -> str:
    """A short Ray-side text of a node (argument nodes ``depth`` levels deep), for errors."""
    if isinstance(node, RayInputNode):
        return "inp"
    if isinstance(node, InputAttributeNode):
        key = node.key
        return f"inp.{key}" if isinstance(key, str) and key.isidentifier() else f"inp[{key!r}]"
    if isinstance(node, ClassMethodNode) and node.is_class_method_output:
        return f"{describe(node.class_method_call, depth)}[{node.output_idx}]"
    if isinstance(node, (CollectiveNode, CollectiveOutput)):
        return _collective(node, depth)
    if isinstance(node, ClassMethodNode):
        parent: ActorHandle = node._parent_class_node
        cls = (parent._body.__name__ if isinstance(parent, ClassNode)
               else parent._ray_actor_creation_function_descriptor.class_name)
        name = f"{cls}.{node.get_method_name()}"
    elif isinstance(node, (FunctionNode, ClassNode)):
        name = getattr(node._body, "__name__", "function") + (".bind" if isinstance(node, ClassNode) else "")
    elif isinstance(node, RayMultiOutputNode):
        name = "MultiOutputNode"
    else:
        return type(node).__name__
    if depth < 0:
        return f"{name}(...)"
    args = [_arg_text(a, depth) for a in node.get_args()]
    text = ", ".join(args + [f"{k}={_arg_text(v, depth)}" for k, v in node.get_kwargs().items()])
    return f"{name}([{text}])" if isinstance(node, RayMultiOutputNode) else f"{name}({text})"


def _arg_text(value: object, depth: int) -> str:
    if isinstance(value, DAGNode):
        return describe(value, depth - 1)
    return f"{type(value).__name__}(...nodes...)" if holds_node(value) else short(value)


def short(value: object, limit: int = 30) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _collective(node: DAGNode, depth: int) -> str:
    """``allreduce(Worker.f(inp), Worker.f(inp), op='sum')[0]``: a collective node, for errors."""
    if isinstance(node, CollectiveOutput):
        return f"{_collective(node.collective, depth)}[{node.index}]"
    assert isinstance(node, CollectiveNode), node
    if depth < 0:
        return f"{node.method}(...)"
    parts = [describe(v, depth - 1) for v in node.get_args()]
    parts += [f"{k}={v!r}" for k, v in node.options.items()]
    return f"{node.method}({', '.join(parts)})"


def holds_node(value: object) -> bool:
    """A DAG node sits somewhere inside the container ``value``."""
    return not isinstance(value, DAGNode) and contains(value, lambda v: isinstance(v, DAGNode))


def contains(value: UserValue, match: Callable[[object], bool]) -> bool:
    if match(value):
        return True
    items = (*value.keys(), *value.values()) if isinstance(value, dict) else value
    return isinstance(value, (dict, list, tuple, set, frozenset)) and any(contains(v, match) for v in items)
