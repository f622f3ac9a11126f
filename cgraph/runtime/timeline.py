"""The driver's side of recording: whether a graph records, and gathering every actor's events.

``collect`` asks each actor for its events (``recording.fetch`` through
``__ray_call__``, which runs beside the graph's loop) and places its clock on
the driver's: an actor on the driver's node shares its CLOCK_MONOTONIC (offset
0); elsewhere the offset is the actor's clock minus the midpoint of the call,
give or take half the call's round trip. The result is the tracks that
``cgraph.visualize.trace`` turns into a Chrome trace and a summary.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from cgraph._boundary import ActorHandle
from cgraph.runtime.options import CompileOptions
from cgraph.runtime.recording import Event, fetch

TIMELINE_ENV = "CGRAPH_TIMELINE"
"""A file to write each compiled graph's timeline to at teardown (recording turns on)."""

Track = tuple[str, str, list[Event], int, int]
"""(actor, label, events, offset_ns, uncertainty_ns), as ``visualize.trace`` takes them."""


def records(options: CompileOptions) -> bool:
    """Whether a graph compiled with ``options`` records its timeline: ``timeline=``, else
    ``CGRAPH_TIMELINE`` or Ray's event profiling switch (``ray_profiling``)."""
    if options.timeline is not None:
        return options.timeline
    return bool(os.environ.get(TIMELINE_ENV)) or ray_profiling()


TORCH_PROFILES_DIR = "compiled_graph_torch_profiles"
"""Where Ray's ``RAY_CGRAPH_ENABLE_TORCH_PROFILING`` puts each actor's torch trace (in the
driver's working directory, as Ray's documentation says)."""


def torch_profiles() -> str | None:
    """The directory for each actor's torch profiler trace when Ray's
    ``RAY_CGRAPH_ENABLE_TORCH_PROFILING`` switch is on (``recording.torch_profiling``), else None."""
    from ray.dag import constants

    if not getattr(constants, "RAY_CGRAPH_ENABLE_TORCH_PROFILING", False):
        return None
    return os.path.abspath(TORCH_PROFILES_DIR)


def ray_profiling() -> bool:
    """Ray's ``RAY_CGRAPH_ENABLE_PROFILING`` switch, read as Ray's compile reads it (the
    constant in ``ray.dag.constants``, set from the environment when Ray loads): each actor
    then also keeps Ray's task events (``recording.ray_task_events``)."""
    from ray.dag import constants

    return bool(getattr(constants, "RAY_CGRAPH_ENABLE_PROFILING", False))


def collect(handles: Mapping[str, ActorHandle], labels: Mapping[str, str], tag: str,
            driver_events: list[Event], timeout: float = 30.0) -> list[Track]:
    """Every actor's recorded events of graph ``tag``, on the driver's clock, after the driver's."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    tracks: list[Track] = [("driver", "driver", driver_events, 0, 0)]
    for actor, handle in handles.items():
        sent = time.perf_counter_ns()
        got = ray.get(handle.__ray_call__.remote(fetch, tag), timeout=timeout)
        back = time.perf_counter_ns()
        if got.node == here:
            offset, uncertainty = 0, 0
        else:
            offset, uncertainty = got.clock_ns - (sent + back) // 2, (back - sent) // 2
        tracks.append((actor, labels.get(actor, actor), got.events, offset, uncertainty))
    return tracks
