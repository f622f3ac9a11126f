"""Pictures of a graph and of its schedules: DOT text builders and a lazy renderer.

``dag_to_dot`` and ``schedule_to_dot`` only read and return DOT text;
``render`` and ``write_*_picture`` call graphviz's ``dot`` when it is installed
and otherwise leave a ``.dot`` file with instructions. Recorded executions
(``cgraph.runtime.recording``): ``trace_of`` (Chrome trace), ``explain``
(summary, critical path, the simulator's prediction), ``draw_timeline`` (Gantt
picture). Only the compiler imports this package; it hands it to the runtime.
"""

from __future__ import annotations

from cgraph.visualize.dag_dot import NODE_STYLE, dag_to_dot, edge_label
from cgraph.visualize.explain import TimelineSummary, durations, explain
from cgraph.visualize.gantt import draw_timeline
from cgraph.visualize.render import render, write_dag_picture, write_schedule_picture
from cgraph.visualize.schedule_dot import DOT_STYLE, moved_ops, moved_positions, schedule_to_dot
from cgraph.visualize.trace import Summary, collective_notes, summarize, trace_of

__all__ = [
    "durations",
    "DOT_STYLE",
    "NODE_STYLE",
    "Summary",
    "TimelineSummary",
    "collective_notes",
    "dag_to_dot",
    "draw_timeline",
    "edge_label",
    "explain",
    "moved_ops",
    "moved_positions",
    "render",
    "schedule_to_dot",
    "summarize",
    "trace_of",
    "write_dag_picture",
    "write_schedule_picture",
]
