"""The schedule: per-actor tuples of frozen ``Op`` records, and their text form.

``Schedule = dict[ActorId, tuple[Op, ...]]``. One op is one step of an actor's
loop for one execution. Ops name the graph node they serve by number:

    a.R0          READ    actor a reads n0's value from a channel (shm / intra / cross-node)
    a.C3          COMPUTE actor a runs node n3's method
    a.W3          WRITE   actor a writes n3's value to its non-communicator channels
    a.SEND3>b     SEND    actor a sends n3's tensors to b through a communicator
    b.RECV3<a     RECV    actor b receives n3's tensors from a
    a.COLL7[a,b]  COLLECTIVE  actor a joins collective n7 with members a and b

A ``@comm`` suffix marks an op on the communication stream (``b.RECV3<a@comm``);
``@comm+1`` a RECV that the lane issues one execution ahead (``ahead.py``): where it
stands in execution i, it starts receiving execution i+1's value.
A schedule prints as actors separated by `` | `` and parses back::

    a.R0 a.C1 a.SEND1>b | b.RECV1<a b.C2 b.W2
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from cgraph.errors import GraphSyntaxError

ActorId = str
NodeId = str


class OpKind(enum.Enum):
    READ = "R"
    COMPUTE = "C"
    WRITE = "W"
    SEND = "SEND"
    RECV = "RECV"
    COLLECTIVE = "COLL"


class Stream(enum.Enum):
    COMPUTE = "compute"
    COMM = "comm"


COMM_KINDS = frozenset({OpKind.SEND, OpKind.RECV, OpKind.COLLECTIVE})
"""Ops that go through a communicator and must match across participants."""


@dataclass(frozen=True, slots=True)
class Op:
    """One step of one actor's schedule.

    ``peers``: for SEND the receiver, for RECV the sender, for COLLECTIVE every
    member (in rank order); empty otherwise.
    """

    actor: ActorId
    kind: OpKind
    node: NodeId
    peers: tuple[ActorId, ...] = ()
    stream: Stream = Stream.COMPUTE
    ahead: bool = False  # a RECV@comm for the next execution (``ahead.py``)

    @property
    def peer(self) -> ActorId:
        """The single peer of a SEND or RECV."""
        assert len(self.peers) == 1, self
        return self.peers[0]

    def __str__(self) -> str:
        num = self.node[1:] if self.node.startswith("n") and self.node[1:].isdigit() else f"{{{self.node}}}"
        text = f"{self.actor}.{self.kind.value}{num}"
        if self.kind is OpKind.SEND:
            text += f">{self.peer}"
        elif self.kind is OpKind.RECV:
            text += f"<{self.peer}"
        elif self.kind is OpKind.COLLECTIVE:
            text += f"[{','.join(self.peers)}]"
        if self.stream is Stream.COMM:
            text += "@comm"
        if self.ahead:
            text += "+1"
        return text


Schedule = dict[ActorId, tuple[Op, ...]]

_OP = re.compile(
    r"(?P<actor>\w+)\.(?P<kind>SEND|RECV|COLL|R|C|W)(?P<node>\d+|\{[^}]+\})"
    r"(?:>(?P<to>\w+)|<(?P<frm>\w+)|\[(?P<members>[\w,]*)\])?(?P<comm>@comm)?(?P<ahead>\+1)?\Z"
)
_KINDS = {k.value: k for k in OpKind}


def parse_op(text: str) -> Op:
    """Inverse of ``str(op)``.

    Raises:
        GraphSyntaxError: if ``text`` is not one op.
    """
    m = _OP.match(text.strip())
    if m is None:
        raise GraphSyntaxError(f"not an op: {text!r} (expected e.g. 'a.C3', 'b.RECV3<a')")
    kind = _KINDS[m["kind"]]
    node = m["node"]
    node = node[1:-1] if node.startswith("{") else f"n{node}"
    if m["to"]:
        peers: tuple[str, ...] = (m["to"],)
    elif m["frm"]:
        peers = (m["frm"],)
    elif m["members"] is not None:
        peers = tuple(p for p in m["members"].split(",") if p)
    else:
        peers = ()
    need = {OpKind.SEND: "to", OpKind.RECV: "frm", OpKind.COLLECTIVE: "members"}.get(kind)
    if (need is None) != (not peers and m["members"] is None) or (need and m[need] is None):
        raise GraphSyntaxError(f"op {text!r}: {kind.name} {'needs' if need else 'takes no'} peer")
    stream = Stream.COMM if m["comm"] else Stream.COMPUTE
    if m["ahead"] and (kind is not OpKind.RECV or stream is not Stream.COMM):
        raise GraphSyntaxError(f"op {text!r}: only a RECV on the comm stream runs ahead (RECV..@comm+1)")
    return Op(m["actor"], kind, node, peers, stream, ahead=bool(m["ahead"]))


def format_schedule(schedule: Schedule) -> str:
    """``a.R0 a.C1 | b.R1 b.C2``: actors in key order separated by `` | ``."""
    return " | ".join(" ".join(str(op) for op in ops) for ops in schedule.values())


def parse_schedule(text: str) -> Schedule:
    """Inverse of ``format_schedule``. Every op in a lane must name that lane's actor.

    Raises:
        GraphSyntaxError: on a malformed op or a lane mixing actors.
    """
    schedule: Schedule = {}
    for lane in text.split("|"):
        ops = tuple(parse_op(tok) for tok in lane.split())
        if not ops:
            continue
        actor = ops[0].actor
        if any(op.actor != actor for op in ops):
            raise GraphSyntaxError(f"lane {lane.strip()!r} mixes actors")
        if actor in schedule:
            raise GraphSyntaxError(f"actor {actor!r} has two lanes")
        schedule[actor] = ops
    return schedule


def format_grid(
    schedule: Schedule,
    marks: dict[ActorId, int] | None = None,
    note: str = "<-- here",
) -> str:
    """An actor-by-step grid; ``marks[actor] = step`` flags that step with ``note``.

        step | 0      | 1      | 2
        a    | a.R0   | a.C1   | a.SEND1>b  <-- here
        b    | b.RECV1<a ...
    """
    marks = marks or {}
    width = max((len(str(op)) for ops in schedule.values() for op in ops), default=4) + 3
    name_w = max([4, *(len(a) for a in schedule)])
    steps = max((len(ops) for ops in schedule.values()), default=0)
    head = f"{'step':<{name_w}} |" + "|".join(f" {i:<{width - 1}}" for i in range(steps))
    lines = [head.rstrip()]
    for actor, ops in schedule.items():
        cells = []
        for i, op in enumerate(ops):
            text = str(op)
            if marks.get(actor) == i:
                text = f"[{text}]"
            cells.append(f" {text:<{width - 1}}")
        line = f"{actor:<{name_w}} |" + "|".join(cells)
        if actor in marks:
            step = marks[actor]
            where = str(ops[step]) if 0 <= step < len(ops) else "end"
            line = line.rstrip() + f"   {note} (step {step}: {where})"
        lines.append(line.rstrip())
    return "\n".join(lines)
