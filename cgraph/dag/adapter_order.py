"""The order the front end numbers nodes in: topological, following Ray's creation order.

Part of the adapter layer (it reads Ray's node objects). Data edges are hard;
where Ray records an order, it is a soft preference, dropped as a whole if it
contradicts the data edges (the scheduler then reports the bind order that
cannot run):

- ``_downstream_nodes``: each node's consumers, in creation order;
- a ``ClassNode`` actor's calls (and cgraph collectives it is a member of),
  in creation order, from its ``_downstream_nodes``;
- a live handle's calls and collectives, by the bind index stamped from a
  counter kept per handle *object* (``collective_node`` stamps one per member).

Ties Ray leaves open go by level (longest data path from a source), then by
depth-first position.

    a.f, b.f bound; allreduce.bind([fa, fb]); a.g bound     n1 = a.f  n2 = b.f
                                                      ──►   n3 = allreduce(n1, n2)
                                                            n4 = n3[0] ... n6 = a.g
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import networkx as nx  # type: ignore[import-untyped]
from ray.dag import ClassMethodNode, ClassNode, DAGNode

from cgraph._boundary import ActorHandle
from cgraph.dag.collective_node import CollectiveNode


def order_nodes(dfs: list[DAGNode], parents: Callable[[DAGNode], list[DAGNode]]) -> list[DAGNode]:
    """``dfs`` (a depth-first post-order) re-ordered as described in the module docstring.

    Args:
        dfs: every node of the DAG, each after the nodes it reads.
        parents: the nodes a node reads (the adapter's ``_parents``).
    """
    rank = {id(n): i for i, n in enumerate(dfs)}
    hard = [(rank[id(p)], rank[id(n)]) for n in dfs for p in parents(n)]
    chains: list[list[DAGNode]] = [list(n._downstream_nodes) for n in dfs]
    by_parent: dict[int, list[tuple[ActorHandle, int | None, DAGNode]]] = {}
    for n in dfs:
        for parent, index in _sites(n):
            by_parent.setdefault(id(parent), []).append((parent, index, n))
    for sites in by_parent.values():
        parent = sites[0][0]
        if isinstance(parent, ClassNode):
            chains.append(list(parent._downstream_nodes))
        else:  # one handle object: its bind indices are its creation order
            chains.append([n for _, _, n in sorted(sites, key=lambda s: (s[1] or 0, rank[id(s[2])]))])
    members = [dict.fromkeys(rank[id(c)] for c in chain if id(c) in rank) for chain in chains]
    soft = [pair for chain in members for pair in itertools.pairwise(chain)]
    depth = [0] * len(dfs)  # longest data path from a source; dfs is topological
    for a, b in sorted(hard, key=lambda e: e[1]):
        depth[b] = max(depth[b], depth[a] + 1)
    key = lambda i: (depth[i], i)  # noqa: E731 - ties Ray leaves open: level, then dfs
    order = _toposort(len(dfs), hard + soft, key) or _toposort(len(dfs), hard, key)
    assert order is not None, "the data edges of a Ray DAG have no cycle"
    return [dfs[i] for i in order]


def _sites(node: DAGNode) -> list[tuple[ActorHandle, int | None]]:
    """Where ``node`` runs as a method: (actor handle or ClassNode, bind index) per actor."""
    if isinstance(node, CollectiveNode):
        return list(zip(node.parents, node.bind_indices, strict=True))
    if isinstance(node, ClassMethodNode) and node.is_class_method_call:
        return [(node._parent_class_node, node._get_bind_index())]
    return []


def _toposort(n: int, edges: list[tuple[int, int]], key: Callable[[int], tuple[int, int]]) -> list[int] | None:
    """Topological order, smallest ``key`` first among ready nodes; ``None`` on a cycle."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((a, b) for a, b in edges if a != b)
    try:
        return list(nx.lexicographical_topological_sort(graph, key=key))
    except nx.NetworkXUnfeasible:
        return None
