"""Recorded executions as a Chrome trace, and what they say: busy, idle, overlap.

Input: one track per process, ``(actor, label, events, offset_ns, uncertainty_ns)``,
each event ``(op text, thread, execution, start_ns, end_ns[, nbytes])`` (``runtime.recording``)
with ``offset_ns`` the process clock minus the driver's. Output of ``trace_of``:
the Trace Event Format that https://ui.perfetto.dev and chrome://tracing open::

    driver         driver |[execute 0]                 [get 0 ..........]
    a (Worker)     loop   |  [a.R0][a.C1  ]
                   comm   |               [a.SEND1>d]──┐ flow arrow
    d (Worker)     comm   |                [d.RECV1<a ]◄┘
                   loop   |                            [d.C4   ][d.W4]

``summarize`` measures each process: its span (first start to last end), busy
time (the union of its events but the waits of a COMPUTE for values in flight), compute (COMPUTE events) and comm (SEND, RECV and
COLLECTIVE events) time, and the overlap fraction: the time during which a comm
op on the comm thread and a COMPUTE on the loop ran at once, over comm time.
Pure functions on plain data: no Ray, no clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cgraph.errors import GraphSyntaxError
from cgraph.ir.graph import Const, Graph, NodeKind
from cgraph.scheduler.ops import COMM_KINDS, Op, OpKind, parse_op

Track = tuple[str, str, Sequence[tuple[str, str, int, int, int] | tuple[str, str, int, int, int, int | None]], int, int]
"""(actor, label, events, offset_ns, uncertainty_ns); ``actor`` "driver" for the driver; each event
``(op text, thread, execution, start_ns, end_ns[, nbytes])``."""

THREADS = {"driver": 0, "loop": 1, "comm": 2, "collective": 3}
"""Tracks, in drawing order: "collective" holds the collective library's calls made inside methods."""


def recorded_op(text: str) -> Op | None:
    """The op a recorded event's text names (None: the driver's and a compute's wait events)."""
    try:
        return parse_op(text)
    except GraphSyntaxError:
        return None  # the driver's "execute" and "get", a compute's "wait a.C3"


def trace_of(tracks: Iterable[Track], notes: Mapping[str, str] | None = None) -> dict[str, object]:
    """The Chrome trace (``{"traceEvents": [...]}``) of recorded tracks (see the module docstring).

    ``notes``: per graph node, a text its ops' events carry as ``args["what"]`` (a
    collective's method, op and algorithm); each event's bytes are ``args["bytes"]``.
    """
    notes = notes or {}
    rows = list(tracks)
    starts = [start - offset for _, _, events, offset, _ in rows for _, _, _, start, _, *_ in events]
    origin = min(starts, default=0)
    out: list[dict[str, object]] = []
    sends: dict[tuple[str, str, str, int], tuple[int, int, float]] = {}
    recvs: list[tuple[tuple[str, str, str, int], int, int, float]] = []
    end: float  # an event's end (ns), then a flow's (us)
    clocks = {}
    for pid, (_, label, events, offset, uncertainty) in enumerate(rows):
        clocks[label] = {"offset_us": offset / 1e3, "uncertainty_us": uncertainty / 1e3}
        out.append(_meta("process_name", pid, 0, name=label))
        out.append(_meta("process_sort_index", pid, 0, sort_index=pid))
        for thread in sorted({event[1] for event in events}, key=THREADS.__getitem__):
            out.append(_meta("thread_name", pid, THREADS[thread], name=thread))
        for text, thread, execution, start, end, *more in events:
            ts, dur = (start - offset - origin) / 1e3, (end - start) / 1e3
            op = recorded_op(text)
            args: dict[str, object] = {"op": text, "execution": execution}
            if more and more[0] is not None:
                args["bytes"] = more[0]
            if op is not None and op.node in notes:
                args["what"] = notes[op.node]
            out.append({"ph": "X", "name": text.removesuffix("@comm"), "cat": op.kind.name if op else thread,
                        "pid": pid, "tid": THREADS[thread], "ts": round(ts, 3), "dur": round(dur, 3),
                        "args": args})
            if op is not None and op.kind is OpKind.SEND:
                sends[(op.node, op.actor, op.peer, execution)] = (pid, THREADS[thread], ts)
            elif op is not None and op.kind is OpKind.RECV:
                recvs.append(((op.node, op.peer, op.actor, execution), pid, THREADS[thread], ts + dur))
    for flow_id, (key, pid, tid, end) in enumerate(recvs):
        if key in sends:
            s_pid, s_tid, s_ts = sends[key]
            out.append({"ph": "s", "name": "send", "cat": "comm", "id": flow_id, "pid": s_pid, "tid": s_tid,
                        "ts": round(s_ts, 3)})
            out.append({"ph": "f", "bp": "e", "name": "send", "cat": "comm", "id": flow_id, "pid": pid,
                        "tid": tid, "ts": round(end, 3)})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"clocks": clocks, "note": "times in us on the driver's clock; a process on "
                          "another node is placed by an offset measured once, +- its uncertainty"}}


def collective_notes(graph: Graph) -> dict[str, str]:
    """For ``trace_of``'s ``notes``: each collective node's call, e.g. ``allreduce(op='sum',
    algorithm='ring')`` (its options as bound)."""
    out = {}
    for node in graph.nodes:
        if node.kind is NodeKind.COLLECTIVE:
            options = ", ".join(f"{name}={graph.constants[arg.index]!r}" for name, arg in node.kwargs
                                if isinstance(arg, Const) and arg.index < len(graph.constants))
            out[node.id] = f"{node.method}({options})"
    return out


def _meta(what: str, pid: int, tid: int, **args: object) -> dict[str, object]:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}


@dataclass(frozen=True)
class Summary:
    """One process's recorded time, in seconds (see the module docstring)."""

    executions: int
    span: float
    busy: float
    compute: float
    comm: float
    overlapped: float

    @property
    def idle(self) -> float:
        return self.span - self.busy

    @property
    def overlap_fraction(self) -> float:
        """Overlapped time over comm time (0 when there is no comm)."""
        return self.overlapped / self.comm if self.comm > 0 else 0.0

    def __str__(self) -> str:
        return (f"{self.executions} executions: busy {self.busy * 1e3:.1f} ms of {self.span * 1e3:.1f}, "
                f"compute {self.compute * 1e3:.1f} ms, comm {self.comm * 1e3:.1f} ms, overlapped "
                f"{self.overlap_fraction:.0%} of comm")


def summarize(tracks: Iterable[Track]) -> dict[str, Summary]:
    """Per process label, its ``Summary``."""
    out = {}
    for _, label, events, _, _ in tracks:
        if not events:
            continue
        ops = [(recorded_op(text), thread, start, end) for text, thread, _, start, end, *_ in events]
        compute = [(s, e) for op, thread, s, e in ops if op is not None and op.kind is OpKind.COMPUTE]
        comm = [(s, e) for op, _, s, e in ops if op is not None and op.kind in COMM_KINDS]
        on_comm_thread = [(s, e) for op, thread, s, e in ops if thread == "comm"]
        span = max(event[4] for event in events) - min(event[3] for event in events)
        out[label] = Summary(
            executions=len({event[2] for event in events}),
            span=span / 1e9,
            busy=_length(_union([(s, e) for text, _, _, s, e, *_ in events if not text.startswith("wait ")])) / 1e9,
            compute=sum(e - s for s, e in compute) / 1e9,
            comm=sum(e - s for s, e in comm) / 1e9,
            overlapped=_length(_intersect(_union(on_comm_thread), _union(compute))) / 1e9,
        )
    return out


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(spans: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in spans)
