"""cgraph collectives in the front end: made at bind time, read into the Graph IR.

    x = a.f.bind(inp)                                    n1 = a.f(n0)
    y = b.f.bind(inp)                                    n2 = b.f(n0)
    rx, ry = allreduce.bind([x, y], op=ReduceOp.MAX) ──► n3 = allreduce(n1, n2, op=$0, algorithm=$1)
                                                         n4 = n3[0]        $0 = "max", $1 = "auto"
                                                         n5 = n3[1]        (n4 on a, n5 on b)

``bind_collective`` checks the members (a non-empty list; each the result of
an actor method: a call, one return of a multi-return call, or a member's
result of another collective; no two on one actor), stamps each member's bind
index on its handle as Ray's ``bind`` does, and returns one
``CollectiveOutput`` per member. ``to_ir`` reads them as a COLLECTIVE node
(its options as constants) and ITEM nodes on the members' actors. Part of the
adapter layer: it reads Ray's node objects (``adapter`` calls it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ray.actor import ActorHandle
from ray.dag import ClassMethodNode, DAGNode
from ray.dag.collective_node import CollectiveOutputNode as RayCollectiveOutputNode

from cgraph import _boundary
from cgraph.dag.collective_node import (
    BIND_INDEX_KEY,
    INDEX_KEY,
    METHOD_KEY,
    OPTIONS_KEY,
    PARENTS_KEY,
    CollectiveNode,
    CollectiveOutput,
)
from cgraph.dag.describe import describe, short
from cgraph.dag.validate import error_message
from cgraph.errors import DAGValidationError
from cgraph.ir import Arg, Node, NodeKind, TensorHint

COLLECTIVE_NODES = (CollectiveNode, CollectiveOutput)
"""cgraph's own DAG node classes for collectives (the adapter dispatches on them)."""


# --------------------------------------------------------------------------- binding
def bind_collective(method: str, nodes: Sequence[DAGNode], options: Mapping[str, object]) -> list[CollectiveOutput]:
    """Make a collective over ``nodes`` (one per member actor, in rank order).

    Args:
        method: "allreduce", "allgather" or "reducescatter".
        nodes: the members' inputs, each the result of an actor method.
        options: the collective's checked options (``op``, ``algorithm``), constants.

    Returns:
        One output node per member: member i's result, held by member i's actor.

    Raises:
        DAGValidationError: not a list, an empty list, a member that is no actor
            method's result, or two members on one actor.
    """
    parents = _check_members(method, nodes)
    indices = tuple(_stamp(p) for p in parents)
    coll = CollectiveNode(tuple(nodes), {
        METHOD_KEY: method, OPTIONS_KEY: dict(options), PARENTS_KEY: tuple(parents), BIND_INDEX_KEY: indices,
    })
    return [CollectiveOutput(coll, {INDEX_KEY: i}) for i in range(len(parents))]


def member_actor(node: object) -> _boundary.ActorHandle | None:
    """The actor (ActorHandle or ClassNode) holding ``node``'s value, or None if no actor method made it."""
    if isinstance(node, CollectiveOutput):
        return node.collective.parents[node.index]
    if isinstance(node, ClassMethodNode) and not isinstance(node, RayCollectiveOutputNode):
        call = node.class_method_call if node.is_class_method_output else node
        return call._parent_class_node  # type: ignore[union-attr]  # set on outputs
    return None


def actor_key(parent: _boundary.ActorHandle) -> str | int:
    """One key per actor, whichever handle object names it."""
    return parent._actor_id.hex() if isinstance(parent, ActorHandle) else id(parent)


def _class_name(parent: _boundary.ActorHandle) -> str:
    if isinstance(parent, ActorHandle):
        return str(parent._ray_actor_creation_function_descriptor.class_name)
    return str(getattr(parent._body, "__name__", "actor"))


def _stamp(parent: _boundary.ActorHandle) -> int | None:
    """The next bind index of a handle object (Ray's counter, as ``bind`` uses it); None on a ClassNode."""
    if not isinstance(parent, ActorHandle):
        return None
    index = int(parent._ray_dag_bind_index)
    parent._ray_dag_bind_index += 1
    return index


def _check_members(method: str, nodes: Sequence[DAGNode]) -> list[_boundary.ActorHandle]:
    if not isinstance(nodes, (list, tuple)) or not nodes:
        got = "an empty list" if isinstance(nodes, (list, tuple)) else f"{type(nodes).__name__} {short(nodes)}"
        raise DAGValidationError(error_message(
            f"{method}.bind got {got}", f"{method}.bind({short(nodes)})",
            "a collective takes a list of DAG nodes, one tensor per member actor",
            f"pass the members' nodes: {method}.bind([a.f.bind(inp), b.f.bind(inp)])",
        ))
    where = f"{method}.bind([{', '.join(describe(n, 0) if isinstance(n, DAGNode) else short(n) for n in nodes)}])"
    parents: list[_boundary.ActorHandle] = []
    seen: dict[str | int, int] = {}
    for i, node in enumerate(nodes):
        parent = member_actor(node)
        if parent is None:
            raise _not_an_actor_result(method, i, node, where)
        first = seen.setdefault(actor_key(parent), i)
        if first != i:
            raise DAGValidationError(error_message(
                f"{method}.bind got two nodes of one {_class_name(parent)} actor: members {first} and {i}", where,
                "a collective takes one tensor per member actor, and each actor joins it once",
                "pass one node per actor; to combine two tensors of one actor, add them in a "
                "method first, or bind one collective for each",
            ))
        parents.append(parent)
    return parents


def _not_an_actor_result(method: str, i: int, node: object, where: str) -> DAGValidationError:
    what = describe(node, 0) if isinstance(node, DAGNode) else f"the constant {short(node)}"
    why = "a collective runs on the actors holding its inputs, so each input is an actor method's result"
    fix = f"pass actor.method.bind(...) results, one per actor (compute {what} in an actor method first)"
    if isinstance(node, RayCollectiveOutputNode):
        why, fix = "Ray's collective nodes are not read by cgraph", "use cgraph.collective's collectives throughout"
    return DAGValidationError(error_message(f"{method}.bind: member {i} is {what}", where, why, fix))


# --------------------------------------------------------------------------- reading
def collective_parents(node: DAGNode) -> list[DAGNode]:
    """The nodes a collective node reads: its members' inputs, or the collective of an output."""
    if isinstance(node, CollectiveOutput):
        return [node.collective]
    return list({id(v): v for v in node.get_args()}.values())


def to_ir(
    node: DAGNode, nid: str, hint: TensorHint | None,
    arg: Callable[[object], Arg], actor: Callable[[_boundary.ActorHandle], str],
) -> Node:
    """The IR node of a collective node: COLLECTIVE (options as constants) or ITEM.

    Args:
        arg: the builder's argument reader (a node -> ``Ref``, a value -> ``Const``).
        actor: the builder's actor id of an ActorHandle or ClassNode.
    """
    if isinstance(node, CollectiveOutput):
        owner = actor(node.collective.parents[node.index])
        return Node(nid, NodeKind.ITEM, actor=owner, args=(arg(node.collective),), key=node.index, hint=hint)
    assert isinstance(node, CollectiveNode), node
    args = tuple(arg(v) for v in node.get_args())
    kwargs = tuple((k, arg(v)) for k, v in node.options.items())
    return Node(nid, NodeKind.COLLECTIVE, method=node.method, args=args, kwargs=kwargs, hint=hint)


