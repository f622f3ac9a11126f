"""An execution timeline as Chrome-trace / Perfetto JSON.

Input: ``(actor, op_text, start_s, end_s)`` events, e.g. recorded by a wrapper
around the actor loop's handler call. Output: the Trace Event Format that
``chrome://tracing`` and https://ui.perfetto.dev open. Each actor is a process
row; its compute and communication streams are two threads, so an overlapped
RECV (``r.RECV1<s1@comm``) is seen running under the COMPUTE next to it::

    actor r   compute |      [r.C4 ][r.W4][r.C5 ][r.W5]
              comm    |[RECV1][RECV2][RECV3]

Times are shifted so the earliest event starts at 0 and written in microseconds.
This module only returns data and text; writing the file is the caller's choice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from cgraph.errors import GraphSyntaxError
from cgraph.scheduler.ops import Stream, parse_op

TimelineEvent = tuple[str, str, float, float]
"""(actor, op_text, start_s, end_s); times in seconds from any common clock."""

_TID = {Stream.COMPUTE: 0, Stream.COMM: 1}


def _kind_and_stream(op_text: str) -> tuple[str, Stream]:
    try:
        op = parse_op(op_text)
    except GraphSyntaxError:
        comm = op_text.endswith("@comm")
        return "op", Stream.COMM if comm else Stream.COMPUTE
    return op.kind.name, op.stream


def _process_rows(actor: str, pid: int) -> list[dict[str, Any]]:
    """Metadata naming an actor's process row and its two stream threads."""
    def meta(what: str, tid: int, **args: object) -> dict[str, Any]:
        return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}

    rows = [meta("process_name", 0, name=f"actor {actor}"), meta("process_sort_index", 0, sort_index=pid)]
    rows += [meta("thread_name", tid, name=f"{stream.value} stream") for stream, tid in _TID.items()]
    return rows


def timeline_to_trace(events: Iterable[TimelineEvent]) -> dict[str, Any]:
    """Chrome trace (``{"traceEvents": [...]}``) of the events.

    Raises:
        ValueError: if an event ends before it starts.
    """
    rows = list(events)
    origin = min((start for _, _, start, _ in rows), default=0.0)
    pids: dict[str, int] = {}
    trace: list[dict[str, Any]] = []
    for actor, text, start, end in rows:
        if end < start:
            raise ValueError(f"event {actor}: {text} ends ({end}) before it starts ({start})")
        if actor not in pids:
            pids[actor] = len(pids) + 1
            trace += _process_rows(actor, pids[actor])
        kind, stream = _kind_and_stream(text)
        trace.append({
            "ph": "X",
            "name": text.removesuffix("@comm"),
            "cat": kind,
            "pid": pids[actor],
            "tid": _TID[stream],
            "ts": round((start - origin) * 1e6, 3),
            "dur": round((end - start) * 1e6, 3),
            "args": {"op": text},
        })
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def timeline_to_json(events: Iterable[TimelineEvent], indent: int | None = None) -> str:
    """``timeline_to_trace`` as JSON text, ready for ui.perfetto.dev or chrome://tracing."""
    return json.dumps(timeline_to_trace(events), indent=indent)
