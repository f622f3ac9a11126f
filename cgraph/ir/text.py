"""Text form of the Graph IR: ``str(graph)`` (``graph.format_graph``) prints, ``parse_graph`` inverts.

    actor a = Worker(gpus=1)
    actor b = Worker(gpus=1, host=3f2a, devices=0)
    n0 = input
    n1 = a.send($0, $1, n0) :nccl[static_shape,direct_return]
    n2 = b.recv_and_matmul(n1)
    n3 = a.split(n0) returns=2
    n4 = n3[0]
    n5 = n0.key
    n6 = b.g(n4, k=n5) order=1
    return [n2, n6]

One line per actor and per node, in the graph's order; ``#`` starts a comment.
An actor's ``host`` (its Ray node, unless it is the driver's) and ``devices``
(the GPU ids Ray assigned it, ``-`` for none) appear once compile has asked the
live actor where it is.
Constants print as ``$k``. ``order=`` appears only where a node's execution
order differs from its position; ``returns=`` only where it is not 1.
"""

from __future__ import annotations

import ast
import re

from cgraph.errors import GraphSyntaxError
from cgraph.ir.graph import _IDENT, Actor, Arg, Const, Graph, Node, NodeKind, Ref, TensorHint

_ACTOR = re.compile(r"actor\s+(\w+)\s*=\s*([\w.]+)\s*\((.*)\)\s*\Z")
_ASSIGN = re.compile(r"(\w+)\s*=\s*(.+)\Z")
_ATTR = re.compile(r"(\w+)\s*(?:\.(\w+)|\[(.+)\])\Z")
_CALL = re.compile(r"(?:(\w+)\.)?(\w+)\((.*)\)\Z")
_SUFFIX = re.compile(r"\s+(returns=\d+|order=\d+|:[\w:.\-]+(?:\[[^\]]*\])?)\s*\Z")


# --------------------------------------------------------------------------- parsing
def _fail(lineno: int, line: str, why: str) -> GraphSyntaxError:
    return GraphSyntaxError(f"line {lineno}: {why}\n    {line}")


def _split_args(text: str) -> list[str]:
    """Split on top-level commas (constants like ``[1, 2]`` never appear: ``$k``)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


def _parse_arg(text: str, known: dict[str, Node]) -> Arg:
    if text.startswith("$") and text[1:].isdigit():
        return Const(int(text[1:]))
    if text in known:
        return Ref(text)
    raise ValueError(f"unknown argument {text!r} (a node id defined above, or $k)")


def _parse_hint(text: str) -> TensorHint:
    m = re.fullmatch(r"([\w:.\-]+)(?:\[([^\]]*)\])?", text)
    if m is None:
        raise ValueError(f"bad type hint {text!r}")
    fields: dict[str, object] = {"transport": m.group(1)}
    for flag in filter(None, (f.strip() for f in (m.group(2) or "").split(","))):
        if flag in ("static_shape", "direct_return"):
            fields[flag] = True
        elif flag.startswith("device="):
            fields["device"] = flag.split("=", 1)[1]
        else:
            raise ValueError(f"unknown hint flag {flag!r}")
    return TensorHint(**fields)  # type: ignore[arg-type]


def _parse_actor(m: re.Match[str]) -> Actor:
    fields: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in m.group(3).split(","))):
        k, _, v = item.partition("=")
        fields[k.strip()] = v.strip()
    unknown = set(fields) - {"gpus", "host", "devices"}
    if unknown:
        raise ValueError(f"unknown actor field(s) {sorted(unknown)}")
    devices = fields.get("devices")
    return Actor(m.group(1), m.group(2), float(fields.get("gpus", 0)), fields.get("host", ""),
                 None if devices is None else tuple(d for d in devices.split("+") if d not in ("", "-")))


def _parse_rhs(node_id: str, rhs: str, known: dict[str, Node], actors: set[str]) -> Node:
    fields: dict[str, object] = {}
    while (m := _SUFFIX.search(rhs)) is not None:
        suffix = m.group(1)
        if suffix.startswith(":"):
            fields["hint"] = _parse_hint(suffix[1:])
        else:
            k, _, v = suffix.partition("=")
            fields["num_returns" if k == "returns" else k] = int(v)
        rhs = rhs[: m.start()]
    rhs = rhs.strip()
    if rhs == "input":
        return Node(node_id, NodeKind.INPUT, **fields)  # type: ignore[arg-type]
    if (m := _ATTR.fullmatch(rhs)) is not None and m.group(1) in known:
        src = known[m.group(1)]
        key: int | str = m.group(2) if m.group(2) else ast.literal_eval(m.group(3))
        if src.kind is NodeKind.INPUT:
            return Node(node_id, NodeKind.INPUT_ATTR, args=(Ref(src.id),), key=key, **fields)  # type: ignore[arg-type]
        if src.kind in (NodeKind.CALL, NodeKind.COLLECTIVE) and isinstance(key, int):
            actor = src.actor
            if src.kind is NodeKind.COLLECTIVE:
                member = src.args[key]
                actor = known[member.node].actor if isinstance(member, Ref) else None
            return Node(node_id, NodeKind.ITEM, actor=actor, args=(Ref(src.id),), key=key, **fields)  # type: ignore[arg-type]
        raise ValueError(f"cannot index {src.id} ({src.kind.value}) with {key!r}")
    if (m := _CALL.fullmatch(rhs)) is not None:
        args: list[Arg] = []
        kwargs: list[tuple[str, Arg]] = []
        for part in _split_args(m.group(3)):
            k, eq, v = part.partition("=")
            if eq and _IDENT.match(k.strip()):
                kwargs.append((k.strip(), _parse_arg(v.strip(), known)))
            elif kwargs:
                raise ValueError("positional argument after keyword argument")
            else:
                args.append(_parse_arg(part, known))
        if m.group(1) is None:
            return Node(node_id, NodeKind.COLLECTIVE, method=m.group(2), args=tuple(args), kwargs=tuple(kwargs), **fields)  # type: ignore[arg-type]
        if m.group(1) not in actors:
            raise ValueError(f"unknown actor {m.group(1)!r}: declare it with 'actor {m.group(1)} = Cls(gpus=0)'")
        return Node(node_id, NodeKind.CALL, actor=m.group(1), method=m.group(2), args=tuple(args), kwargs=tuple(kwargs), **fields)  # type: ignore[arg-type]
    raise ValueError("expected 'input', 'nK[i]', 'nK.key', 'actor.method(args)' or 'collective(args)'")


def parse_graph(text: str, constants: tuple[object, ...] = ()) -> Graph:
    """Parse the text form back into a ``Graph``.

    Raises:
        GraphSyntaxError: naming the line that does not parse and why.
    """
    actors: list[Actor] = []
    nodes: dict[str, Node] = {}
    outputs: tuple[str, ...] | None = None
    multi = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            if line.startswith("actor "):
                m = _ACTOR.match(line)
                if m is None:
                    raise ValueError("expected 'actor a = Cls(gpus=N)'")
                actors.append(_parse_actor(m))
            elif line.startswith("return"):
                body = line[len("return"):].strip()
                multi = body.startswith("[")
                names = _split_args(body.strip("[]")) if multi else [body]
                for name in names:
                    if name not in nodes:
                        raise ValueError(f"unknown output node {name!r}")
                outputs = tuple(names)
            elif (m := _ASSIGN.match(line)) is not None:
                node_id = m.group(1)
                if node_id in nodes:
                    raise ValueError(f"node {node_id} defined twice")
                node = _parse_rhs(node_id, m.group(2), nodes, {a.id for a in actors})
                if node.order == len(nodes):
                    node = _replace_order(node, -1)
                nodes[node_id] = node
            else:
                raise ValueError("expected 'actor ...', 'nK = ...' or 'return ...'")
        except GraphSyntaxError:
            raise
        except (ValueError, SyntaxError) as e:
            raise _fail(lineno, raw, str(e)) from None
    if outputs is None:
        raise GraphSyntaxError("missing 'return ...' line")
    return Graph(tuple(actors), tuple(nodes.values()), outputs, multi, constants)


def _replace_order(node: Node, order: int) -> Node:
    from dataclasses import replace

    return replace(node, order=order)
