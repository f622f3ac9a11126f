"""DOT text of a schedule: one lane per actor, communicator pairs linked, moves in red.

Each actor is a lane (a cluster) whose ops run left to right, linked by ordering
edges; step ``i`` of every lane sits in column ``i``, as in ``format_grid``. A
SEND and its RECV are linked by a dashed edge across lanes labelled with the node;
the COLLECTIVE ops of one node are chained across their members. Ops on the
communication stream are drawn with a double border and a "comm stream" line (a RECV
issued one execution ahead: "comm stream: the next execution's").

Given ``before`` (the schedule a pass started from), the ops whose position
changed are outlined red. "Changed" is the minimal set: per actor, the ops of the
new lane outside a longest common subsequence with the old lane, comparing ops by
(kind, node, peers) and ignoring the stream. Hoisting one RECV above three ops
marks that RECV only, not the three it passed::

    before  r: RECV1<s1  C4  W4  RECV2<s2  C5  W5  RECV3<s3  C6  W6
    after   r: RECV1<s1  RECV2<s2  RECV3<s3  C4  W4  C5  W5  C6  W6
    LCS        RECV1<s1                      C4  W4  C5  W5  C6  W6
    moved                RECV2<s2  RECV3<s3                            (red)

Among several longest common subsequences the one that keeps later ops is
taken, so an op that moved earlier is the one marked (passes hoist, they do
not sink).

This module only reads and returns text; ``cgraph.visualize.render`` draws it.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from cgraph.scheduler.ops import Op, OpKind, Schedule, Stream
from cgraph.visualize.dag_dot import FONT, attrs, quote

MOVED_COLOR = "#d62728"
LINK_COLOR = "#7b3fa0"


@dataclass(frozen=True)
class OpStyle:
    """How one OpKind is drawn, and how the legend names it."""

    fill: str
    shape: str
    legend: str


DOT_STYLE: dict[OpKind, OpStyle] = {
    OpKind.READ: OpStyle("#d6e6f5", "box", "READ: read a channel"),
    OpKind.COMPUTE: OpStyle("#fde2b0", "box", "COMPUTE: run the method"),
    OpKind.WRITE: OpStyle("#d3edcc", "box", "WRITE: write channels"),
    OpKind.SEND: OpStyle("#e2d2f4", "cds", "SEND: communicator send"),
    OpKind.RECV: OpStyle("#c9c3f0", "box", "RECV: communicator recv"),
    OpKind.COLLECTIVE: OpStyle("#f7cfe2", "hexagon", "COLL: collective"),
}
"""Per-OpKind fill, shape and legend line; a test checks every OpKind has a row."""


# --------------------------------------------------------------------------- moved ops
def _key(op: Op) -> tuple[OpKind, str, tuple[str, ...]]:
    return (op.kind, op.node, op.peers)


def _unmatched(old: Sequence[Op], new: Sequence[Op]) -> list[int]:
    """Positions in ``new`` outside a longest common subsequence with ``old`` (by ``_key``)."""
    a, b = [_key(op) for op in old], [_key(op) for op in new]
    n, m = len(a), len(b)
    # lcs[i][j] = LCS length of a[:i] and b[:j]
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            lcs[i][j] = lcs[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(lcs[i - 1][j], lcs[i][j - 1])
    unmatched: list[int] = []
    i, j = n, m
    while j > 0:
        if i > 0 and a[i - 1] == b[j - 1]:
            i, j = i - 1, j - 1
        elif i > 0 and lcs[i - 1][j] >= lcs[i][j - 1]:
            i -= 1  # on a tie drop the old op: keeps the later new op matched
        else:
            j -= 1
            unmatched.append(j)
    return unmatched[::-1]


def moved_positions(before: Schedule, after: Schedule) -> dict[str, frozenset[int]]:
    """Per actor of ``after``, the steps holding a moved op (see ``moved_ops``)."""
    return {actor: frozenset(_unmatched(before.get(actor, ()), ops)) for actor, ops in after.items()}


def moved_ops(before: Schedule, after: Schedule) -> frozenset[Op]:
    """The ops of ``after`` whose position changed relative to ``before``.

    Per actor: the ops of the new lane that are not in a longest common
    subsequence with the old lane (ops compared by kind, node and peers; the
    stream is ignored). An op new to a lane, or a lane new to the schedule,
    counts as moved.

    Returns:
        A frozenset of ``after``'s ``Op`` records (with their new stream).
    """
    steps = moved_positions(before, after)
    return frozenset(after[actor][i] for actor, moved in steps.items() for i in moved)


# --------------------------------------------------------------------------- DOT text
def _op_ids(schedule: Schedule) -> dict[str, list[str]]:
    """A unique DOT id per op slot: its text, with ``#k`` on a repeat."""
    seen: dict[str, int] = defaultdict(int)
    ids: dict[str, list[str]] = {}
    for actor, ops in schedule.items():
        lane = []
        for op in ops:
            text = str(op)
            seen[text] += 1
            lane.append(text if seen[text] == 1 else f"{text}#{seen[text]}")
        ids[actor] = lane
    return ids


def _op_line(op: Op, op_id: str, moved: bool) -> str:
    style = DOT_STYLE[op.kind]
    text = str(op).removesuffix("@comm").removesuffix("@comm+1")
    comm = op.stream is Stream.COMM
    stream = "\ncomm stream: the next execution's" if op.ahead else "\ncomm stream" if comm else ""
    label = text + stream + ("\nmoved" if moved else "")
    return "    " + quote(op_id) + attrs(
        label=label,
        shape=style.shape,
        fillcolor=style.fill,
        style="filled,bold" if moved else "filled",
        peripheries="2" if comm else None,
        color=MOVED_COLOR if moved else "#555555",
        penwidth="3" if moved else None,
        fontcolor=MOVED_COLOR if moved else None,
    ) + ";"


def _lane(actor: str, ops: Sequence[Op], ids: Sequence[str], moved: frozenset[int]) -> list[str]:
    label = f"actor {actor}" + (f"  ({len(moved)} moved)" if moved else "")
    look = attrs(label=label, labeljust="l", style="rounded,filled", fillcolor="#f7f9fc", color="#9e9e9e")
    lines = [f"  subgraph {quote('cluster_lane_' + actor)} {{", f"    graph{look};"]
    if not ops:
        lines.append(f"    {quote('empty:' + actor)}{attrs(label='(no ops)', shape='plaintext')};")
    lines += [_op_line(op, op_id, i in moved) for i, (op, op_id) in enumerate(zip(ops, ids, strict=True))]
    for left, right in pairwise(ids):
        lines.append(f"    {quote(left)} -> {quote(right)}{attrs(weight='10', color='#555555')};")
    lines.append("  }")
    return lines


def _lane_order(ids: dict[str, list[str]]) -> list[str]:
    """Invisible edges from the legend to each lane's first op, in the schedule's
    actor order; with ``ordering=out`` on the legend, dot keeps the lanes in that
    order instead of shuffling them to shorten the SEND -> RECV links."""
    firsts = [lane[0] if lane else "empty:" + actor for actor, lane in ids.items()]
    return [f"  legend -> {quote(first)} [style=invis];" for first in firsts]


def _link_edges(schedule: Schedule, ids: dict[str, list[str]]) -> list[str]:
    """SEND -> RECV edges, and chains joining the COLLECTIVE ops of one node."""
    where: dict[tuple[str, OpKind, str, tuple[str, ...]], str] = {}
    collectives: dict[str, list[str]] = defaultdict(list)
    for actor, ops in schedule.items():
        for op, op_id in zip(ops, ids[actor], strict=True):
            where.setdefault((op.actor, *_key(op)), op_id)
            if op.kind is OpKind.COLLECTIVE:
                collectives[op.node].append(op_id)
    lines = []
    link = dict(style="dashed", color=LINK_COLOR, fontcolor=LINK_COLOR, constraint="false")
    for actor, ops in schedule.items():
        for op, op_id in zip(ops, ids[actor], strict=True):
            if op.kind is not OpKind.SEND:
                continue
            recv = where.get((op.peer, OpKind.RECV, op.node, (op.actor,)))
            if recv is not None:
                lines.append(f"  {quote(op_id)} -> {quote(recv)}{attrs(label=op.node, **link)};")
    for node, members in collectives.items():
        for left, right in pairwise(members):
            lines.append(f"  {quote(left)} -> {quote(right)}{attrs(label=node, dir='none', **link)};")
    return lines


def _legend(with_moves: bool) -> list[str]:
    """A plaintext node holding an HTML table: kinds and colours, streams, links, red."""
    rows = [
        f'<tr><td bgcolor="{s.fill}" width="18"></td><td align="left">{html.escape(s.legend)}</td></tr>'
        for s in DOT_STYLE.values()
    ]
    rows.append('<tr><td border="3" style="rounded" width="18"></td>'
                '<td align="left">double border: comm stream</td></tr>')
    rows.append(f'<tr><td></td><td align="left"><font color="{LINK_COLOR}">- - &gt; SEND to RECV, '
                "collective members</font></td></tr>")
    if with_moves:
        rows.append(f'<tr><td border="3" color="{MOVED_COLOR}" width="18"></td>'
                    f'<td align="left"><font color="{MOVED_COLOR}">red: position changed</font></td></tr>')
    table = ('<<table border="1" cellborder="0" cellspacing="4" cellpadding="2" color="#9e9e9e">'
             '<tr><td colspan="2"><b>legend</b></td></tr>' + "".join(rows) + "</table>>")
    return [f"  legend [shape=plaintext, margin=0, ordering=out, label={table}];"]


def schedule_to_dot(schedule: Schedule, before: Schedule | None = None, title: str | None = None) -> str:
    """DOT text of ``schedule``: a lane per actor, steps left to right.

    Args:
        schedule: the schedule to draw.
        before: the schedule a pass started from; ops of ``schedule`` whose
            position changed (``moved_ops``) are outlined red.
        title: a caption at the top (e.g. the pass name).

    Returns:
        DOT source text (``digraph``); render it with ``cgraph.visualize.render``.
    """
    moved = moved_positions(before, schedule) if before is not None else {}
    ids = _op_ids(schedule)
    lines = [
        "digraph cgraph_schedule {",
        f"  graph{attrs(rankdir='LR', fontname=FONT, fontsize='16', label=title, labelloc='t')};",
        f"  graph{attrs(nodesep='0.25', ranksep='0.35')};",
        f"  node{attrs(fontname=FONT, fontsize='11', margin='0.12,0.05', height='0.45')};",
        f"  edge{attrs(fontname=FONT, fontsize='9', arrowsize='0.7')};",
    ]
    for actor, ops in schedule.items():
        lines += _lane(actor, ops, ids[actor], moved.get(actor, frozenset()))
    lines += _link_edges(schedule, ids)
    lines += _legend(before is not None)
    lines += _lane_order(ids)
    lines.append("}")
    return "\n".join(lines) + "\n"
