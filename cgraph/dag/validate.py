"""Checks on a freshly read Graph, with errors that say what, where, why and how to fix.

The adapter reads Ray's objects into a ``Graph`` plus a few plain facts (each
actor's method names, input attributes that were created but never read) and
hands them here; nothing in this module touches Ray. Every message has the
same four parts, the "where" being the node in the IR's text form::

    actor a (Worker) has no method 'fowrard'
      at:  n2 = a.fowrard(n1)
      why: Worker defines: backward, forward
      fix: did you mean 'forward'? Bind an existing method: worker.forward.bind(...)

Checks that need Ray's objects themselves (a node nested in a list, a free
function) run in the adapter, before any IR exists; the functions at the end
word those errors, with the adapter's Ray-side text of the node as "where".
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

from cgraph.errors import (
    DAGValidationError,
    EmptyDAGError,
    FunctionNodeError,
    MultipleInputsError,
    NestedNodeError,
    TransportError,
    UnknownMethodError,
    UnusedInputError,
)
from cgraph.ir import ActorId, Graph, Node, NodeKind, format_node


def error_message(what: str, where: str, why: str, fix: str) -> str:
    """The four-part layout every front-end error uses (``where`` may span lines)."""
    where = where.replace("\n", "\n       ")
    return f"{what}\n  at:  {where}\n  why: {why}\n  fix: {fix}"


def node_text(graph: Graph, node_id: str) -> str:
    """One node of ``graph`` as its line of IR text (``n3 = a.f(n1, $0)``)."""
    return format_node(graph.node(node_id), graph.position(node_id))


def check_graph(
    graph: Graph,
    *,
    methods: Mapping[ActorId, Collection[str]],
    unused_input_keys: Collection[int | str] = (),
) -> None:
    """Run every IR-level front-end check, the most fundamental first.

    Args:
        graph: the graph the adapter just read.
        methods: for each actor id, the method names its class defines.
        unused_input_keys: keys of ``inp[k]`` / ``inp.k`` nodes that were created
            on the DAG's InputNode but that no node of the DAG reads.

    Raises:
        MultipleInputsError: nodes read two different InputNodes.
        EmptyDAGError: no actor method call in the DAG.
        UnusedInputError: the DAG never reads its InputNode, or leaves an input
            attribute unread.
        DAGValidationError: the DAG reads both the whole input and items of it.
        UnknownMethodError: a call names a method its actor's class lacks.
        TransportError: an input edge asks for a communicator transport.
    """
    check_single_input(graph)
    check_not_empty(graph)
    check_input_used(graph, unused_input_keys)
    check_input_style(graph)
    check_methods(graph, methods)
    check_input_hints(graph)


def check_single_input(graph: Graph) -> None:
    """Raise ``MultipleInputsError`` when nodes come from two InputNodes."""
    inputs = [n for n in graph.nodes if n.kind is NodeKind.INPUT]
    if len(inputs) < 2:
        return
    readers = [_first_reader(graph, n) for n in inputs]
    where = "\n".join(node_text(graph, r.id) for r in readers)
    raise MultipleInputsError(
        error_message(
            f"the DAG reads {len(inputs)} different InputNodes "
            f"({', '.join(n.id for n in inputs)})",
            where,
            "a compiled graph has exactly one input: the arguments of execute()",
            "build the whole DAG inside one `with InputNode() as inp:` block and read "
            "several values with inp[0], inp[1] or inp.key",
        )
    )


def check_not_empty(graph: Graph) -> None:
    """Raise ``EmptyDAGError`` when no node is an actor method call."""
    if any(n.kind in (NodeKind.CALL, NodeKind.COLLECTIVE) for n in graph.nodes):
        return
    where = "\n".join(node_text(graph, o) for o in graph.outputs) or "MultiOutputNode([])"
    raise EmptyDAGError(
        error_message(
            "the DAG has no actor method call to run",
            where,
            "a compiled graph runs actor methods; this DAG only returns its input",
            "bind at least one actor method, e.g. `worker.f.bind(inp)`, and compile that "
            "node (or a MultiOutputNode of such nodes)",
        )
    )


def check_input_used(graph: Graph, unused_keys: Collection[int | str] = ()) -> None:
    """Raise ``UnusedInputError`` for an InputNode (or input attribute) nobody reads."""
    if graph.input_node() is None:
        where = "\n".join(node_text(graph, o) for o in graph.outputs)
        raise UnusedInputError(
            error_message(
                "no node of the DAG reads its InputNode",
                where,
                "execute(...) passes its arguments through the InputNode; a DAG that "
                "never reads it has nothing to run on",
                "pass `inp` (or inp[i] / inp.key) to at least one actor method inside "
                "the `with InputNode() as inp:` block",
            )
        )
    if unused_keys:
        shown = ", ".join(_key_text(k) for k in unused_keys)
        raise UnusedInputError(
            error_message(
                f"input attribute(s) {shown} created but never read by the DAG",
                node_text(graph, graph.input_node().id),  # type: ignore[union-attr]
                "every inp[i] / inp.key must reach an output, else execute() would demand "
                "an argument that nothing uses (Ray rejects this too)",
                f"pass {shown} to an actor method of the DAG, or do not create it",
            )
        )


def check_input_style(graph: Graph) -> None:
    """Raise ``DAGValidationError`` when the DAG reads the InputNode itself and also
    ``inp[i]`` / ``inp.key``: execute's arguments would mean two things at once."""
    inp = graph.input_node()
    if inp is None:
        return
    readers = [graph.node(c) for c in graph.consumers()[inp.id]]
    items = [r for r in readers if r.kind is NodeKind.INPUT_ATTR]
    whole = [r for r in readers if r.kind is not NodeKind.INPUT_ATTR]
    if inp.id in graph.outputs:
        whole.append(inp)
    if not (items and whole):
        return
    item_readers = [graph.node(c) for r in items for c in graph.consumers()[r.id]]
    raise DAGValidationError(
        error_message(
            "All tasks must either use InputNode() directly, or they must index to specific "
            "args or kwargs.",
            "\n".join(node_text(graph, n.id) for n in [*whole[:1], *item_readers[:1]]),
            "execute(...)'s arguments are either the one value the InputNode stands for, or "
            "the positional and keyword arguments inp[i] and inp.key read; not both",
            "read every value through inp[i] / inp.key (pass inp[0] where you passed inp), "
            "or pass the whole input everywhere",
        )
    )


def check_methods(graph: Graph, methods: Mapping[ActorId, Collection[str]]) -> None:
    """Raise ``UnknownMethodError`` for a call of a method the actor class lacks."""
    for node in graph.nodes:
        if node.kind is not NodeKind.CALL or node.actor is None or node.actor not in methods:
            continue
        known = methods[node.actor]
        if node.method in known:
            continue
        cls = graph.actor(node.actor).cls
        public = sorted(m for m in known if not m.startswith("_"))
        close = difflib.get_close_matches(node.method or "", public, n=3)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownMethodError(
            error_message(
                f"actor {node.actor} ({cls}) has no method {node.method!r}",
                node_text(graph, node.id),
                f"{cls} defines: {', '.join(public) or '(no public methods)'}",
                f"{hint}bind a method that {cls} defines "
                f"(a plain attribute or property cannot be called)",
            )
        )


def check_input_hints(graph: Graph) -> None:
    """Raise ``TransportError`` when an input edge asks for a communicator."""
    for node in graph.nodes:
        if node.kind not in (NodeKind.INPUT, NodeKind.INPUT_ATTR) or node.hint is None:
            continue
        if node.hint.transport in ("auto", "shm"):
            continue
        raise TransportError(
            error_message(
                f"the input edge {node.id} asks for transport {node.hint.transport!r}",
                node_text(graph, node.id),
                "the driver writes the input and takes part in no communicator group",
                'use transport="shm" (or "auto") on input nodes; put "nccl" on the '
                "outputs of actor methods",
            )
        )


def _first_reader(graph: Graph, inp: Node) -> Node:
    """The first node that reads ``inp``, directly or through ``inp[k]``."""
    consumers = graph.consumers()
    frontier = [inp.id]
    while frontier:
        nid = frontier.pop(0)
        for c in consumers[nid]:
            node = graph.node(c)
            if node.kind is NodeKind.INPUT_ATTR:
                frontier.append(c)
            else:
                return node
    return inp


def _key_text(key: int | str) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"inp.{key}"
    return f"inp[{key!r}]"


# --------------------------------------------------------------------------- read-time errors
UNSUPPORTED: dict[str, tuple[type[DAGValidationError], str, str]] = {
    "FunctionNode": (
        FunctionNodeError,
        "it is a remote function; a compiled graph runs only actor methods, each in its "
        "actor's loop",
        "move the function into an actor class and bind it: worker.method.bind(...)",
    ),
    "CollectiveOutputNode": (
        DAGValidationError,
        "Ray's collective nodes are not read by cgraph",
        "use cgraph.collective, e.g. cgraph.collective.allreduce.bind([x, y])",
    ),
    "MultiOutputNode": (
        DAGValidationError,
        "a MultiOutputNode can only be the root you compile",
        "pass the nodes themselves as arguments",
    ),
    "ClassNode": (
        DAGValidationError,
        "an actor (ClassNode) is not a value that flows between methods",
        "bind a method of the actor instead: worker.method.bind(...)",
    ),
}
"""Node kinds a Ray DAG may hold but a compiled graph may not: (error, why, fix)."""


def unsupported_node(kind: str, node: str, where: str) -> DAGValidationError:
    """The error for a node of a kind cgraph does not compile (``UNSUPPORTED``)."""
    error, why, fix = UNSUPPORTED.get(kind, (
        DAGValidationError,
        f"{kind} is not a node cgraph compiles",
        "build the DAG from InputNode, actor.method.bind(...) and MultiOutputNode",
    ))
    return error(error_message(f"cannot compile {node}", where, why, fix))


def generator_method(node: str, num_returns: object, where: str) -> DAGValidationError:
    """A call with ``num_returns="streaming"`` (a generator method)."""
    return DAGValidationError(error_message(
        f"cannot compile {node}: num_returns={num_returns!r}", where,
        "generator methods stream their results; a compiled graph moves one value per call",
        "return a value, or a fixed number of values with .options(num_returns=k)",
    ))


def nested_node(inner: str, slot: str, call: str, where: str, *, count: int = 1,
                arg: str = "") -> NestedNodeError:
    """A DAG node inside a list, tuple, dict or other object passed as an argument of a call
    (Ray's sentence first: ``count`` nodes found in the argument ``arg``)."""
    return NestedNodeError(error_message(
        f"Found {count} DAGNodes from the arg {arg} in {call}. Please ensure that the argument "
        "is a single DAGNode and that a DAGNode is not allowed to be placed inside any type of "
        f"container. (DAG node {inner} is nested inside {slot} of {call}.)", where,
        "a compiled graph passes node values only as direct arguments; inside a list, "
        "tuple, dict or object the node object itself would be sent, not its value",
        "pass it as a direct argument (f.bind(x, y), not f.bind([x, y])); to return "
        "several nodes, use MultiOutputNode([x, y])",
    ))


def bad_output(what: str, position: int, where: str) -> NestedNodeError:
    """A MultiOutputNode entry that is not a DAG node (a nested list, a constant)."""
    return NestedNodeError(error_message(
        f"MultiOutputNode holds {what} at position {position}", where,
        "the outputs of a compiled graph are DAG nodes, listed flat",
        "list the nodes themselves: MultiOutputNode([x, y]), not [[x, y]] or constants",
    ))


def not_a_dag(value: str) -> DAGValidationError:
    """``compile`` was given something that is not a Ray DAG node."""
    return DAGValidationError(error_message(
        f"cannot compile {value}: it is not a Ray DAG node", value,
        "compile takes the root of a DAG built with actor.method.bind(...)",
        "pass the last bound node, or a MultiOutputNode of several",
    ))


def leaf_nodes(methods: list[str], nodes: list[str], wheres: list[str]) -> DAGValidationError:
    """Calls (or return values of calls) that nothing reads and that are no output (Ray's
    sentence first, with the count and the methods as Ray gives them)."""
    more = f" (and {len(nodes) - 1} more)" if len(nodes) > 1 else ""
    return DAGValidationError(error_message(
        "Compiled DAG doesn't support leaf nodes, i.e., nodes that don't have downstream nodes "
        f"and are not output nodes. There are {len(nodes)} leaf nodes in the DAG. Please add the "
        f"outputs of {methods} to the MultiOutputNode.",
        "\n".join(wheres),
        f"{nodes[0]} reads from the DAG but its result reaches no output{more}; a compiled "
        "graph would run it and drop its result, and its errors with it",
        "add it to the MultiOutputNode you compile (MultiOutputNode([..., node])), or do not "
        "bind it; of a call with num_returns=k, every return value must be read or an output",
    ))
