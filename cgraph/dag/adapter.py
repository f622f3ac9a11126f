"""The one module that reads Ray's DAG node objects (Ray 2.60) into the Graph IR.

    with InputNode() as inp:                  actor a = Worker(gpus=1)
        x = w.f.bind(inp[0])                  n0 = input
        y, z = w.g.options(                   n1 = n0[0]
            num_returns=2).bind(x)    ──►     n2 = a.f(n1)
        dag = MultiOutputNode([y, z])         n3 = a.g(n2) returns=2
                                              n4 = n3[0]
                                              n5 = n3[1]
                                              return [n4, n5]

What Ray 2.60 records, read here and nowhere else:

- A call is a ``ClassMethodNode``; its actor (``_parent_class_node``) is an
  ``ActorHandle`` or a ``ClassNode`` (``Worker.bind()``: no running Ray needed).
- ``num_returns=k`` on a handle: ``bind`` returns k placeholders with
  ``is_class_method_output``, ``class_method_call``, ``output_idx``: ITEM nodes.
  On a ClassNode it returns the call; k is ``.options(num_returns=k)`` or
  ``@ray.method(num_returns=k)``.
- Order: ``bind`` on a handle stamps ``_bind_index`` from a counter kept per
  handle *object*; Ray runs an actor's tasks sorted by it (ties: graph
  position). Two handle objects of one actor count separately and can bind an
  order that never runs (the scheduler reports it). ClassNode calls run in
  creation order.
- GPUs: a ClassNode's ``num_gpus`` option (default 0); a live handle keeps no
  options, so ``required_resources["GPU"]`` from the GCS actor table; 0 when
  Ray is not connected. ``Actor.host`` stays "": the runtime resolves hosts.
- Ids follow creation order where Ray records it: ``_downstream_nodes`` lists
  consumers (a ClassNode's: its calls) in creation order, handle calls carry
  bind indices. Elsewhere, level by level, as list comprehensions build
  (``adapter_order``).
- cgraph's collectives (``cgraph.collective.allreduce.bind([x, y])``) are
  ``collective_node`` objects, made and read by ``adapter_collective``: a
  COLLECTIVE node and one ITEM per member. Ray's own collective nodes are refused.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from ray.dag import ClassMethodNode, ClassNode, DAGNode, FunctionNode, InputAttributeNode
from ray.dag import InputNode as RayInputNode
from ray.dag import MultiOutputNode as RayMultiOutputNode
from ray.dag.collective_node import CollectiveOutputNode

from cgraph._boundary import ActorHandle, RayObject, UserValue
from cgraph._log import logger
from cgraph.dag import adapter_collective, validate
from cgraph.dag.actor_table import actor_entry
from cgraph.dag.adapter_collective import COLLECTIVE_NODES
from cgraph.dag.adapter_order import order_nodes
from cgraph.dag.collective_node import CollectiveNode, CollectiveOutput
from cgraph.dag.describe import contains, describe, holds_node, short
from cgraph.dag.nodes import CommunicatorTable, to_tensor_hint
from cgraph.ir import Actor, ActorId, Arg, Const, Graph, Node, NodeKind, Ref

_RAY_SPECIAL_METHODS = ("__ray_call__", "__ray_ready__", "__ray_terminate__")


@dataclass(frozen=True)
class FrontEnd:
    """What the front end read: the IR and the live objects it stands for."""

    graph: Graph
    handles: Mapping[ActorId, ActorHandle]  # actor id -> ActorHandle (or ClassNode)
    communicators: Mapping[str, UserValue]  # "custom:<name>" -> the user's communicator object
    input_node: RayInputNode | None = None  # the DAG's Ray InputNode


# --------------------------------------------------------------------------- reading
def read_dag(root: RayObject, *, communicators: CommunicatorTable | None = None) -> FrontEnd:
    """Read a Ray DAG into the Graph IR and check it.

    Args:
        root: what was compiled: a ``MultiOutputNode`` or one method-call node.
        communicators: the table communicator objects are named in (compile shares
            it with the default communicator); a new one if omitted.

    Returns:
        The ``FrontEnd``: graph, actor handles, communicators and input node.

    Raises:
        DAGValidationError: or a subclass; the DAG breaks a front-end rule, and the
            message names the node and says how to fix it.
    """
    table = communicators if communicators is not None else CommunicatorTable()
    outputs, multi = _outputs(root)
    nodes = order_nodes(_closure(outputs), _parents)
    _check_leaf_nodes(nodes, outputs)
    builder = _Builder(table)
    graph = builder.build(nodes, outputs, multi)
    inputs = [n for n in nodes if isinstance(n, RayInputNode)]
    used = {n.key for n in nodes if isinstance(n, InputAttributeNode)}
    created = inputs[0].input_attribute_nodes if len(inputs) == 1 else {}
    unused = [k for k in created if k not in used and not str(k).startswith("__")]
    validate.check_graph(graph, methods=builder.methods, unused_input_keys=unused)
    return FrontEnd(
        graph=graph,
        handles=MappingProxyType(dict(builder.handles)),
        communicators=MappingProxyType(dict(table.objects)),
        input_node=inputs[0] if inputs else None,
    )


def _outputs(root: object) -> tuple[list[DAGNode], bool]:
    if not isinstance(root, DAGNode):
        raise validate.not_a_dag(short(root))
    if not isinstance(root, RayMultiOutputNode):
        return [root], False
    for i, value in enumerate(root.get_args()):
        if not isinstance(value, DAGNode):
            what = "a container of nodes" if holds_node(value) else f"the constant {short(value)}"
            raise validate.bad_output(what, i, describe(root))
    return list(root.get_args()), True


def _closure(outputs: list[DAGNode]) -> list[DAGNode]:
    """Every node the outputs depend on, in depth-first post-order."""
    done: dict[int, DAGNode] = {}
    stack: list[tuple[DAGNode, bool]] = [(o, False) for o in reversed(outputs)]
    while stack:
        node, expanded = stack.pop()
        if expanded or id(node) in done:
            done.setdefault(id(node), node)
            continue
        stack.append((node, True))
        stack.extend((p, False) for p in reversed(_parents(node)) if id(p) not in done)
    return list(done.values())


def _parents(node: DAGNode) -> list[DAGNode]:
    """The nodes whose values ``node`` reads, after checking ``node`` is supported."""
    if isinstance(node, COLLECTIVE_NODES):
        return adapter_collective.collective_parents(node)
    if isinstance(node, (CollectiveOutputNode, FunctionNode, RayMultiOutputNode, ClassNode)):
        kind = next(c for c in type(node).__mro__ if c.__name__ in validate.UNSUPPORTED).__name__
        raise validate.unsupported_node(kind, describe(node, 0), describe(node))
    if isinstance(node, RayInputNode):
        return []
    if isinstance(node, InputAttributeNode):
        return [node.get_other_args_to_resolve()["dag_input_node"]]
    if not isinstance(node, ClassMethodNode):
        raise validate.unsupported_node(type(node).__name__, describe(node, 0), describe(node))
    if node.is_class_method_output:
        return [node.class_method_call]  # type: ignore[list-item]  # set for outputs
    _check_not_nested(node)
    values = [*node.get_args(), *node.get_kwargs().values()]
    return list({id(v): v for v in values if isinstance(v, DAGNode)}.values())


def _check_not_nested(call: ClassMethodNode) -> None:
    """A node anywhere inside an argument (a list, a dict, any object) is refused, as in Ray.
    Ray's bind lists every node it found in the arguments among ``_upstream_nodes``: only
    when one is not a direct argument are the arguments scanned, to say which holds it."""
    direct = {id(v) for v in [*call.get_args(), *call.get_kwargs().values()] if isinstance(v, DAGNode)}
    if all(id(u) in direct or isinstance(u, ClassNode) for u in call._upstream_nodes):
        return
    slots = [(f"argument {i}", a) for i, a in enumerate(call.get_args())]
    slots += [(f"keyword argument {k!r}", v) for k, v in call.get_kwargs().items()]
    for slot, value in slots:
        found = _nodes_inside(value)
        if found:
            raise validate.nested_node(describe(found[0], 0), slot, describe(call, 0), describe(call),
                                       count=len(found), arg=short(value, 60))


_PLAIN = (int, float, complex, str, bytes, bool, type(None))
"""Argument types that cannot hold a node (not scanned)."""


def _nodes_inside(value: object) -> list[DAGNode]:
    """The DAG nodes anywhere inside the argument ``value`` (a list, a dict, any object),
    found as Ray's ``bind`` finds them; empty for a node passed directly."""
    if isinstance(value, (DAGNode, *_PLAIN)):
        return []
    from ray.dag.py_obj_scanner import _PyObjScanner

    scanner: _PyObjScanner[DAGNode, object] = _PyObjScanner()
    try:
        return list(scanner.find_nodes([value]))
    finally:
        scanner.clear()  # type: ignore[no-untyped-call]  # unannotated in Ray


def _check_leaf_nodes(nodes: list[DAGNode], outputs: list[DAGNode]) -> None:
    """Refuse leaf nodes as Ray does: a call (or one return value of a call) that reads the
    DAG but that nothing reads and that is no output would run with its result, and its
    errors, dropped. A collective counts when none of its members' results is read; one
    member's unread result is fine (the collective runs on every member anyway)."""
    seen = {id(n): n for n in nodes}
    frontier = collections.deque(nodes)
    while frontier:  # everything bound downstream of what the outputs read, nearest first
        node = frontier.popleft()
        for d in node._downstream_nodes:
            if id(d) not in seen and isinstance(d, _CALLS) and not _only_next(d, node):
                seen[id(d)] = d
                frontier.append(d)
    outs = {id(o) for o in outputs}
    leaves = [n for n in seen.values() if id(n) not in outs and _is_leaf(n, outs)]
    if leaves:
        raise validate.leaf_nodes([_method_name(n) for n in leaves],
                                  [describe(n, 0) for n in leaves], [describe(n) for n in leaves])


_CALLS = (ClassMethodNode, FunctionNode, *COLLECTIVE_NODES)
"""Node kinds that run something, or stand for a value something ran."""


def _is_leaf(node: DAGNode, outs: set[int]) -> bool:
    if isinstance(node, CollectiveOutput) or not isinstance(node, (ClassMethodNode, *COLLECTIVE_NODES)):
        return False
    if isinstance(node, COLLECTIVE_NODES):  # its members' results: read by something, or outputs
        return not any(id(o) in outs or _readers(o) for o in node._downstream_nodes)
    return not _readers(node)


def _readers(node: DAGNode) -> list[DAGNode]:
    return [d for d in node._downstream_nodes if not _only_next(d, node)]


def _method_name(node: DAGNode) -> str:
    """The method a leaf runs, for Ray's sentence (``f[1]``: return value 1 of ``f``)."""
    if isinstance(node, CollectiveNode):
        return str(node.method)
    if isinstance(node, ClassMethodNode) and node.is_class_method_output:
        return f"{_method_name(node.class_method_call)}[{node.output_idx}]"  # type: ignore[arg-type]
    return str(node.get_method_name()) if isinstance(node, ClassMethodNode) else type(node).__name__


def _only_next(call: DAGNode, node: DAGNode) -> bool:
    """``call`` follows ``node`` on a ClassNode actor without reading its value."""
    if getattr(call, "_prev_class_method_call", None) is not node:
        return False
    return not contains([*call.get_args(), *call.get_kwargs().values()], lambda v: v is node)


# --------------------------------------------------------------------------- building
class _Builder:
    """Turns ordered Ray nodes into IR nodes, actors, constants and hints."""

    def __init__(self, table: CommunicatorTable) -> None:
        self.table = table
        self.ids: dict[int, str] = {}
        self.constants: list[object] = []
        self.actor_of: dict[str | int, ActorId] = {}  # actor id (handle) or id(ClassNode) -> "a"
        self.actors: list[Actor] = []
        self.handles: dict[ActorId, ActorHandle] = {}
        self.methods: dict[ActorId, tuple[str, ...]] = {}

    def build(self, nodes: list[DAGNode], outputs: list[DAGNode], multi: bool) -> Graph:
        ir = []
        for i, node in enumerate(nodes):
            self.ids[id(node)] = f"n{i}"
            ir.append(self._node(node, f"n{i}"))
        ir = _with_order(ir, nodes)
        outs = tuple(self.ids[id(o)] for o in outputs)
        return Graph(tuple(self.actors), tuple(ir), outs, multi, tuple(self.constants))

    def _node(self, node: DAGNode, nid: str) -> Node:
        hint = to_tensor_hint(node.type_hint, self.table)
        if isinstance(node, RayInputNode):
            return Node(nid, NodeKind.INPUT, hint=hint)
        if isinstance(node, InputAttributeNode):
            src = Ref(self.ids[id(node.get_other_args_to_resolve()["dag_input_node"])])
            return Node(nid, NodeKind.INPUT_ATTR, args=(src,), key=node.key, hint=hint)
        if isinstance(node, COLLECTIVE_NODES):
            return adapter_collective.to_ir(node, nid, hint, self._arg, self._actor)
        assert isinstance(node, ClassMethodNode), node
        actor = self._actor(node._parent_class_node)
        if node.is_class_method_output:
            call = Ref(self.ids[id(node.class_method_call)])
            return Node(nid, NodeKind.ITEM, actor=actor, args=(call,), key=node.output_idx, hint=hint)
        args = tuple(self._arg(a) for a in node.get_args())
        kwargs = tuple((k, self._arg(v)) for k, v in node.get_kwargs().items())
        return Node(nid, NodeKind.CALL, actor=actor, method=node.get_method_name(), args=args,
                    kwargs=kwargs, num_returns=_num_returns(node), hint=hint)

    def _arg(self, value: object) -> Arg:
        if isinstance(value, DAGNode):
            return Ref(self.ids[id(value)])
        self.constants.append(value)
        return Const(len(self.constants) - 1)

    def _actor(self, parent: ActorHandle) -> ActorId:
        key = adapter_collective.actor_key(parent)
        if key not in self.actor_of:
            aid = _actor_name(len(self.actors))
            cls, gpus, methods = _actor_facts(parent)
            self.actor_of[key] = aid
            self.actors.append(Actor(aid, cls, gpus))
            self.handles[aid] = parent
            self.methods[aid] = methods
        return self.actor_of[key]


def _with_order(ir: list[Node], nodes: list[DAGNode]) -> list[Node]:
    """Set ``order`` so each actor's calls sort as Ray runs them: by (bind index, position)."""
    calls: dict[str, list[int]] = {}
    for i, n in enumerate(ir):
        if n.kind is NodeKind.CALL and n.actor is not None:
            calls.setdefault(n.actor, []).append(i)
    for positions in calls.values():
        ray_order = sorted(positions, key=lambda i: (nodes[i]._get_bind_index() or 0, i))
        for slot, i in zip(positions, ray_order, strict=True):
            ir[i] = replace(ir[i], order=-1 if slot == i else slot)
    return ir


def _actor_name(i: int) -> ActorId:
    """"a" ... "z", "aa", "ab", ...: short ids in first-use order."""
    return chr(97 + i) if i < 26 else _actor_name(i // 26 - 1) + chr(97 + i % 26)


def _num_returns(call: ClassMethodNode) -> int:
    value = call.get_options().get("num_returns")
    if value is None and isinstance(call._parent_class_node, ClassNode):
        method = getattr(call._parent_class_node._body, call.get_method_name(), None)
        value = getattr(method, "__ray_num_returns__", None)
    if value is not None and not isinstance(value, int):
        raise validate.generator_method(describe(call, 0), value, describe(call))
    return 1 if value is None else value


def _actor_facts(parent: ActorHandle) -> tuple[str, float, tuple[str, ...]]:
    """Class name, GPUs and method names of an actor (ClassNode or live handle)."""
    if isinstance(parent, ClassNode):
        cls = parent._body
        methods = tuple(n for n in dir(cls) if callable(getattr(cls, n, None)))
        gpus = float(parent.get_options().get("num_gpus") or 0)
        logger.debug("actor %s: gpus=%g from its ClassNode options", cls.__name__, gpus)
        return cls.__name__, gpus, methods + _RAY_SPECIAL_METHODS
    name = parent._ray_actor_creation_function_descriptor.class_name
    methods = tuple(parent._ray_method_signatures) + _RAY_SPECIAL_METHODS
    return name, _handle_gpus(parent, name), methods


def _handle_gpus(handle: ActorHandle, name: str, wait_s: float = 10.0) -> float:
    """An actor's GPUs from the GCS actor table (``actor_table``); 0 where it cannot say."""
    entry, how = actor_entry(handle, wait_s)
    gpus = float(entry.required_resources.get("GPU", 0.0)) if entry is not None else 0.0
    logger.debug("actor %s: gpus=%g (%s)", name, gpus, how)
    return gpus


def uses_cgraph_input(root: object) -> bool:
    """Whether the DAG under ``root`` reads cgraph's ``InputNode`` (for Ray's compile hook)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or not isinstance(node, DAGNode):
            continue
        seen.add(id(node))
        if getattr(type(node), "_cgraph_input", False):
            return True
        prev = node._prev_class_method_call if isinstance(node, ClassMethodNode) else None
        stack.extend(u for u in node._upstream_nodes if u is not prev and not isinstance(u, ClassNode))
    return False
