"""The Graph IR: plain frozen records, a text form that round-trips."""

from __future__ import annotations

from cgraph.ir.graph import (
    DRIVER,
    Actor,
    ActorId,
    Arg,
    Const,
    Graph,
    Node,
    NodeId,
    NodeKind,
    Ref,
    TensorHint,
    format_graph,
    format_node,
)
from cgraph.ir.text import parse_graph

__all__ = [
    "DRIVER",
    "Actor",
    "ActorId",
    "Arg",
    "Const",
    "Graph",
    "Node",
    "NodeId",
    "NodeKind",
    "Ref",
    "TensorHint",
    "format_graph",
    "format_node",
    "parse_graph",
]
