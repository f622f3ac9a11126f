"""Pictures of a graph and of its schedules: DOT text builders and a lazy renderer.

``dag_to_dot`` and ``schedule_to_dot`` only read and return DOT text;
``render`` and ``write_*_picture`` call graphviz's ``dot`` when it is installed
and otherwise leave a ``.dot`` file with instructions. ``timeline_to_json``
turns recorded op timings into a Chrome / Perfetto trace. Nothing else in
cgraph imports this package.
"""

from cgraph.visualize.dag_dot import NODE_STYLE, dag_to_dot, edge_label
from cgraph.visualize.render import render, write_dag_picture, write_schedule_picture
from cgraph.visualize.schedule_dot import DOT_STYLE, moved_ops, moved_positions, schedule_to_dot
from cgraph.visualize.timeline import timeline_to_json, timeline_to_trace

__all__ = [
    "DOT_STYLE",
    "NODE_STYLE",
    "dag_to_dot",
    "edge_label",
    "moved_ops",
    "moved_positions",
    "render",
    "schedule_to_dot",
    "timeline_to_json",
    "timeline_to_trace",
    "write_dag_picture",
    "write_schedule_picture",
]
