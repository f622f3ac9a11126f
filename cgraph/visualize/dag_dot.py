"""DOT text of a Graph IR: one cluster per actor, edges labelled with their transport.

    actor a = Worker(gpus=1)            [n0 = input]            (driver)
    actor b = Worker(gpus=1)                 | shm
    n0 = input                        +- a = Worker(gpus=1) -+
    n1 = a.send(n0) :nccl      -->    |  [n1 = a.send(n0)]   |
    n2 = b.recv(n1)                   +----------|-----------+
    return n2                                    | nccl
                                      +- b = Worker(gpus=1) -+
                                      |  [n2 = b.recv(n1)]   |
                                      +----------|-----------+
                                                 | shm
                                            [output]            (driver)

Node labels are the IR's text form (``format_node``), so the picture, the logs and
the errors speak one language. An edge's label is its transport: from the channel
plan when one is given (``plan.for_node(node)``), else from the producing node's
``TensorHint``, else
``intra`` inside one actor and ``shm`` between processes.

This module only reads and returns text; ``cgraph.visualize.render`` draws it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cgraph.ir.graph import DRIVER, Actor, ActorId, Graph, Node, NodeKind, Ref, format_node
from cgraph.scheduler.channels import ChannelKind, ChannelPlan, ChannelSpec

OUTPUT_ID = "driver.output"
"""DOT id of the driver's output node (graph node ids are identifiers: no dot)."""

FONT = "Helvetica"


def quote(text: object) -> str:
    """``text`` as a DOT double-quoted string: safe as an id or a plain label.

    Backslashes are doubled (so ``\\N``, ``\\l`` in user text stay literal),
    quotes escaped, and line breaks become DOT's ``\\n``.
    """
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    s = s.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")
    return f'"{s}"'


def attrs(**kwargs: object) -> str:
    """``[k="v", ...]`` with every value quoted; ``None`` values are left out."""
    items = [f"{k}={quote(v)}" for k, v in kwargs.items() if v is not None]
    return f" [{', '.join(items)}]" if items else ""


@dataclass(frozen=True)
class NodeStyle:
    """How one NodeKind is drawn."""

    shape: str
    fill: str
    style: str = "filled"


NODE_STYLE: dict[NodeKind, NodeStyle] = {
    NodeKind.INPUT: NodeStyle("invhouse", "#e8e8e8"),
    NodeKind.INPUT_ATTR: NodeStyle("box", "#f2f2f2", "filled,rounded"),
    NodeKind.CALL: NodeStyle("box", "#fde9c4", "filled,rounded"),
    NodeKind.ITEM: NodeStyle("box", "#fff6e0", "filled,rounded,dashed"),
    NodeKind.COLLECTIVE: NodeStyle("hexagon", "#f6d5e5"),
}
"""Per-NodeKind shape and fill; a test checks every NodeKind has a row."""

OUTPUT_STYLE = NodeStyle("house", "#e8e8e8")

# ChannelKind name -> edge label; COMM channels are labelled with their transport.
_CHANNEL_LABEL = {"INTRA": "intra", "SHM": "shm", "CROSS_NODE": "cross-node"}


# --------------------------------------------------------------------------- transports
def _actor_of(node: Node) -> ActorId | None:
    """The process holding a node's value: the driver for inputs, None for collectives."""
    if node.kind in (NodeKind.INPUT, NodeKind.INPUT_ATTR):
        return DRIVER
    return node.actor


def _channel_label(spec: ChannelSpec) -> str:
    if spec.kind is ChannelKind.COMM:
        return str(spec.transport) if spec.transport else "comm"
    return _CHANNEL_LABEL.get(spec.kind.name, str(spec.transport or spec.kind.name.lower()))


def _plan_label(graph: Graph, plan: ChannelPlan, src: Node, reader: ActorId | None) -> str | None:
    """The transport the plan chose for ``src``'s value read by ``reader``."""
    node: Node | None = src
    while node is not None:
        specs = plan.for_node(node.id)
        for spec in specs:
            if reader is None or reader in spec.readers:
                return _channel_label(spec)
        # An attribute of the input / an item of a call rides on its parent's channel.
        parent = node.args[0] if node.kind in (NodeKind.INPUT_ATTR, NodeKind.ITEM) else None
        node = graph.node(parent.node) if isinstance(parent, Ref) else None
    return None


def _hint_of(graph: Graph, node: Node) -> str | None:
    """The producing node's transport hint (an ITEM inherits its call's)."""
    hint = node.hint
    if hint is None and node.kind is NodeKind.ITEM and node.args:
        parent = node.args[0]
        if isinstance(parent, Ref) and graph.has_node(parent.node):
            hint = graph.node(parent.node).hint
    return hint.transport if hint is not None else None


def _find_actor(graph: Graph, actor_id: ActorId | None) -> Actor | None:
    return next((a for a in graph.actors if a.id == actor_id), None)


def _default_label(graph: Graph, src: Node, reader: ActorId | None) -> str:
    writer = _actor_of(src)
    if writer == reader:
        return "intra"
    hint = _hint_of(graph, src)
    a, b = _find_actor(graph, writer), _find_actor(graph, reader)
    if reader != DRIVER and writer != DRIVER:
        if hint not in (None, "auto", "shm"):
            return str(hint)
        if hint == "auto" and a is not None and b is not None and a.gpus > 0 and b.gpus > 0:
            return "nccl"  # Ray's "auto" between two GPU actors
    # host "" means the driver's node (or unknown), so it only differs from a named one.
    if (a.host if a else "") != (b.host if b else ""):
        return "cross-node"
    return "shm"


def _collective_label(graph: Graph, plan: ChannelPlan | None, coll: Node) -> str:
    if plan is not None:
        for spec in plan.for_node(coll.id):
            return _channel_label(spec)
    hint = _hint_of(graph, coll)
    return hint if hint not in (None, "auto") else "collective"


def edge_label(graph: Graph, src: Node, dst: Node | None, plan: ChannelPlan | None = None) -> str:
    """The transport of the edge ``src -> dst`` (``dst=None``: the driver's output)."""
    if src.kind is NodeKind.COLLECTIVE:
        return _collective_label(graph, plan, src)
    if dst is not None and dst.kind is NodeKind.COLLECTIVE:
        return _collective_label(graph, plan, dst)
    reader = DRIVER if dst is None else _actor_of(dst)
    if plan is not None:
        label = _plan_label(graph, plan, src, reader)
        if label is not None:
            return label
    return _default_label(graph, src, reader)


# --------------------------------------------------------------------------- DOT text
def _styled(node_id: str, label: str, style: NodeStyle, indent: str = "  ") -> str:
    look = attrs(label=label, shape=style.shape, style=style.style, fillcolor=style.fill)
    return f"{indent}{quote(node_id)}{look};"


def _node_line(node: Node, indent: str = "  ") -> str:
    label = f"{node.id} = input\n(driver)" if node.kind is NodeKind.INPUT else format_node(node)
    return _styled(node.id, label, NODE_STYLE[node.kind], indent)


def _cluster(actor_id: str, label: str, nodes: Iterable[Node], color: str) -> list[str]:
    lines = [
        f"  subgraph {quote('cluster_' + actor_id)} {{",
        f"    graph{attrs(label=label, style='rounded,filled', fillcolor=color, color='#9e9e9e')};",
    ]
    lines += [_node_line(n, "    ") for n in nodes]
    lines.append("  }")
    return lines


def _edges(graph: Graph, plan: ChannelPlan | None) -> list[str]:
    lines = []
    for node in graph.nodes:
        for src_id in node.inputs():
            label = edge_label(graph, graph.node(src_id), node, plan)
            lines.append(f"  {quote(src_id)} -> {quote(node.id)}{attrs(label=label)};")
    for out in dict.fromkeys(graph.outputs):
        label = edge_label(graph, graph.node(out), None, plan)
        lines.append(f"  {quote(out)} -> {quote(OUTPUT_ID)}{attrs(label=label)};")
    return lines


def dag_to_dot(graph: Graph, plan: ChannelPlan | None = None) -> str:
    """DOT text of ``graph``: a cluster per actor, the driver's input and output as nodes.

    Args:
        graph: the Graph IR.
        plan: optional channel plan; its ``for_node(node_id)`` decides edge labels
            ("shm", "intra", "nccl", "cpu", "custom:x", "cross-node").

    Returns:
        DOT source text (``digraph``); render it with ``cgraph.visualize.render``.
    """
    lines = [
        "digraph cgraph_dag {",
        f"  graph{attrs(rankdir='TB', fontname=FONT, labelloc='t', nodesep='0.3')};",
        f"  node{attrs(fontname=FONT, fontsize='11', margin='0.15,0.06')};",
        f"  edge{attrs(fontname=FONT, fontsize='9', color='#555555', fontcolor='#333333')};",
    ]
    lines += [_node_line(n) for n in graph.nodes if _actor_of(n) == DRIVER]
    for actor in graph.actors:
        members = [n for n in graph.nodes if n.actor == actor.id and n.kind is not NodeKind.COLLECTIVE]
        lines += _cluster(actor.id, str(actor).removeprefix("actor "), members, "#f7f9fc")
    # Collectives span actors; a call on an undeclared actor still gets drawn.
    known = {a.id for a in graph.actors}
    lines += [_node_line(n) for n in graph.nodes if _actor_of(n) not in known | {DRIVER}]
    outs = ", ".join(graph.outputs)
    ret = f"return [{outs}]" if graph.multi_output else f"return {outs}"
    lines.append(_styled(OUTPUT_ID, "output (driver)\n" + ret, OUTPUT_STYLE))
    lines += _edges(graph, plan)
    lines.append("}")
    return "\n".join(lines) + "\n"
