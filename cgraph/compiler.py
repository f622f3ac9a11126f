"""``cgraph.compile``: read a Ray DAG, check it, plan its channels and per-actor schedule.

    dag ──read_dag──► FrontEnd(graph, handles, communicators)
                          │ plan_schedule(graph, overlap=..., default_communicator=...)
                          ▼
                      Planned(graph, plan, schedule, before_overlap, passes)
                          │ (the runtime launches it: channels, actor loops)
                          ▼
                      CompiledPlan: graph, plan, schedule, text(), visualize()

``plan`` is the seam the runtime builds on: it returns the front end (live
handles, communicator objects) and the scheduler's result. Environment
switches, read here and nowhere deeper:

- ``CGRAPH_DEBUG=1``: the scheduler dumps its text form after each pass to the
  "cgraph" logger.
- ``CGRAPH_VISUALIZE_SCHEDULE=1`` (or Ray's ``RAY_CGRAPH_VISUALIZE_SCHEDULE=1``):
  compile writes the schedule picture (ops moved by the overlap pass in red) into
  ``$CGRAPH_VISUALIZE_DIR`` (default ``./cgraph-schedules``) and logs the file name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cgraph._log import logger
from cgraph.dag import CommunicatorTable, FrontEnd, read_dag
from cgraph.runtime.options import CompileOptions
from cgraph.scheduler import ChannelPlan, Planned, Schedule

if TYPE_CHECKING:
    from cgraph._boundary import RayObject, UserValue
    from cgraph.ir import Graph
    from cgraph.runtime.compiled_graph import CompiledGraph

DEBUG_ENV = "CGRAPH_DEBUG"
VISUALIZE_ENV = "CGRAPH_VISUALIZE_SCHEDULE"
RAY_VISUALIZE_ENV = "RAY_CGRAPH_VISUALIZE_SCHEDULE"  # Ray's name for the same switch


@dataclass(frozen=True)
class CompiledPlan:
    """A compiled DAG, planned but not launched: the IR, channels and schedule."""

    front: FrontEnd
    planned: Planned
    options: CompileOptions

    @property
    def graph(self) -> Graph:
        """The Graph IR (``cgraph.ir.Graph``)."""
        return self.planned.graph

    @property
    def plan(self) -> ChannelPlan:
        """The channel plan: which channel carries each value to each reader."""
        return self.planned.plan

    @property
    def schedule(self) -> Schedule:
        """``dict[actor_id, tuple[Op, ...]]``: each actor's ops for one execution."""
        return self.planned.schedule

    def text(self) -> str:
        """The graph, its channels and its schedule grid, as text."""
        from cgraph.ir import format_graph
        from cgraph.scheduler.ops import format_grid

        return (
            f"{format_graph(self.graph)}\n\n# channels\n{self.plan}\n\n"
            f"# schedule\n{format_grid(self.schedule)}"
        )

    def visualize(
        self,
        filename: str | os.PathLike[str] | None = None,
        format: str = "png",
        view: bool = False,
        channel_details: bool = False,
    ) -> Picture:
        """Draw the schedule, ops moved by the overlap pass in red.

        Takes Ray Compiled Graphs' ``visualize`` arguments and returns what Ray's
        returns: the DOT source of the picture as text (here a ``Picture``, a ``str``
        whose ``path`` is the file written), or the text for ``format="ascii"``.

        Args:
            filename: where to write (a trailing ``.png``/``.dot``... is replaced by
                the format); default: a new numbered file in
                ``$CGRAPH_VISUALIZE_DIR`` or ``./cgraph-schedules``.
            format: "png", "svg" or "pdf" (a ``.dot`` file without graphviz), or
                "ascii": the schedule grid as text, nothing written.
            view: open the picture with the desktop's viewer (``xdg-open``) if there is
                one; with "ascii", also write the text to standard output, as Ray does.
            channel_details: accepted for Ray's signature (every edge is labelled
                anyway); with "ascii" a ``ValueError``, as in Ray.

        Returns:
            The ``Picture``: DOT source (or the ascii grid), ``.path`` the file.
        """
        return draw_schedule(self.planned, filename, format=format, view=view,
                             channel_details=channel_details)


class Picture(str):
    """What ``visualize`` returns: the text Ray's ``visualize`` returns (the picture's DOT
    source, or the ascii grid), with ``path``, the file written (None for ascii)."""

    path: Path | None

    def __new__(cls, text: str, path: Path | None) -> Picture:  # noqa: D102
        picture = super().__new__(cls, text)
        picture.path = path
        return picture


def draw_schedule(
    planned: Planned,
    path: str | os.PathLike[str] | None = None,
    *,
    format: str = "png",
    view: bool = False,
    channel_details: bool = False,
) -> Picture:
    """Render a planned schedule (ops moved by the overlap pass in red); see ``visualize``."""
    if format == "ascii":
        if channel_details:
            raise ValueError("Parameters 'channel_details' are not compatible with 'ascii' format.")
        from cgraph.scheduler.ops import format_grid

        grid = format_grid(planned.schedule)
        if view:  # asked for: Ray prints the ascii picture
            sys.stdout.write(grid + "\n")
        return Picture(grid, None)
    from cgraph import visualize  # lazy: only when a picture is asked for

    before = planned.before_overlap
    dot = visualize.schedule_to_dot(planned.schedule, before)
    if path is None:
        written = visualize.write_schedule_picture(planned.schedule, before, format=format)
    else:
        written = visualize.render(dot, path, format=format)
    if view:
        _open_viewer(written)
    return Picture(dot, written)


def _open_viewer(path: Path) -> None:
    opener = shutil.which("xdg-open") or shutil.which("open")
    if opener is None:
        logger.warning("visualize(view=True): no viewer (xdg-open) here; the picture is %s", path)
        return
    subprocess.Popen([opener, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def plan_dag(
    dag: RayObject,
    *,
    overlap: bool = False,
    ahead: bool = False,
    default_communicator: str | UserValue | None = None,
    check: bool = True,
    locate: Callable[[FrontEnd], Graph] | None = None,
) -> tuple[FrontEnd, Planned]:
    """Read and check ``dag``, then run the scheduler's pass pipeline on it.

    Args:
        dag: the root of a Ray DAG (a ``MultiOutputNode`` or one bound call).
        overlap: run the overlap pass (GPU communication overlaps compute).
        ahead: with ``overlap``, run the ahead pass (receives of the next execution early).
        default_communicator: transport for communicator edges the actors cannot
            serve themselves: a name (``"cpu"``, ``"gloo"``, ``"nccl"``) or a communicator
            object, registered as ``custom:<Class>`` like per-edge ones.
        check: verify the schedule after each pass and look for deadlocks.
        locate: optional ``f(front) -> Graph`` run before planning (the runtime
            fills in which Ray node each actor lives on and the GPUs Ray gave it: the
            only place compile reads placement; planning stays pure).

    Returns:
        ``(front_end, planned)``: the live objects, and the scheduler's ``Planned``.

    Raises:
        DAGValidationError: (or a subclass) the DAG breaks a front-end rule.
        TransportError: an edge asks for a transport its actors cannot use.
        DeadlockError: the bound order can never run; the message shows the cycle.
    """
    from cgraph.scheduler import plan_schedule

    table = CommunicatorTable()
    default = _communicator_name(default_communicator, table)
    front = read_dag(dag, communicators=table)
    if locate is not None:
        front = replace(front, graph=locate(front))
    dump = _log_pass if os.environ.get(DEBUG_ENV, "") not in ("", "0") else None
    if dump is not None:
        _log_pass("read_dag", front.graph)
    planned = plan_schedule(
        front.graph, overlap=overlap, ahead=ahead, check=check, default_communicator=default,
        customs=tuple(front.communicators), dump=dump,
    )
    return front, planned


def plan(dag: RayObject, **options: UserValue) -> CompiledPlan:
    """Plan a Ray DAG without running it: the IR, channels and schedule.

    Works on DAGs of live actor handles and of unstarted ``Worker.bind()``
    ClassNodes alike, and needs no Ray cluster: use it to inspect, test or draw
    a schedule. ``compile`` plans the same way and then launches the graph.

    Args:
        dag: the root of a Ray DAG: a ``MultiOutputNode`` or one bound call.
        **options: ``compile``'s keyword options.

    Returns:
        The ``CompiledPlan`` (graph, plan, schedule, ``text()``, ``visualize()``).

    Raises:
        DAGValidationError: (or a subclass) the DAG breaks a front-end rule.
        TransportError: an edge asks for a transport its actors cannot use.
        DeadlockError: the bound order can never run.
        ValueError: an option is out of range.
    """
    return _plan(dag, CompileOptions(**options), locate=None)


def compile(  # noqa: A001 - the public name, as in Ray's experimental_compile
    dag: RayObject, *, overlap_gpu_communication: bool | str = False, max_inflight_executions: int = 10,
    buffer_size_bytes: int = 1 << 20, submit_timeout: float | None = 10.0,
    get_timeout: float | None = None, enable_asyncio: bool = False,
    default_communicator: str | UserValue | None = None, cpu_affinity: str | Iterable[int] | None = None,
    max_buffered_results: int = 1000, on_full: str = "raise",
    max_value_bytes: int = 16 << 30, tls: bool | None = None, timeline: bool | None = None,
    timeline_executions: int = 100, teardown_timeout: float = 30.0, auto_executions: int = 5, run_ahead: bool = False,
) -> CompiledGraph:
    """Compile a Ray DAG of live actors with cgraph and start it.

    Options take Ray Compiled Graphs' names without the underscore, and Ray's defaults.

    Args:
        dag: the root of a Ray DAG over actor handles: a ``MultiOutputNode`` or one bound call.
        overlap_gpu_communication: run communicator receives early, beside compute;
            ``"auto"``: measure, then run the faster (``compiled.overlap_decision``).
        max_inflight_executions: executions submitted and not yet read from the
            output channels, at most (one more: see ``on_full``).
        buffer_size_bytes: initial size of each shared-memory slot (grows once if needed).
        submit_timeout: seconds ``execute`` waits for room (``None``/negative: no limit).
        get_timeout: default seconds ``get`` waits (``None``/negative: no limit).
        enable_asyncio: prepare ``execute_async``.
        default_communicator: for tensor edges the actors cannot serve themselves:
            ``"cpu"`` (shared-memory links, actors on the driver's node), ``"gloo"``
            (any nodes), ``"nccl"``, or a ``cgraph.Communicator`` object.
        cpu_affinity: ``None`` (the OS places processes), ``"colocate"`` (pin the
            driver's thread and its node's actor loops to one CPU: lowest latency for
            small graphs, methods run one at a time), or a set of CPU ids.
        max_buffered_results: results read before their refs asked for them, at most.
        on_full: ``execute`` beyond ``max_inflight_executions``: ``"raise"`` (Ray's
            ``RayCgraphCapacityExceeded``, as ``cgraph.CapacityError``) or ``"wait"``
            (backpressure: it waits up to ``submit_timeout`` for the oldest execution
            to finish, keeps that result for its ref, and submits; then ``CapacityError``).
        max_value_bytes: the largest value an edge between nodes carries.
        tls: mutual TLS on every socket between nodes (``None``: ``CGRAPH_TLS=1``
            or ``RAY_USE_TLS=1`` turns it on).
        timeline: record one event per op per execution for ``timeline()``
            (``None``: on when ``CGRAPH_TIMELINE`` names a file).
        timeline_executions: how many of the latest executions each actor keeps.
        teardown_timeout: seconds ``teardown()`` waits for the actor loops to end.
        auto_executions: ``"auto"`` decides after this many executions.
        run_ahead: with overlap and several executions in flight, receive execution
            i+1's values while execution i computes (``+1`` in the schedule).

    Returns:
        A ``cgraph.CompiledGraph``: ``execute``, ``execute_async``, ``visualize``, ``timeline``, ``teardown``.

    Raises:
        DAGValidationError: (or a subclass) the DAG breaks a front-end rule.
        TransportError: an edge asks for a transport its actors cannot use.
        DeadlockError: the bound order can never run.
        CompileError: the DAG's actors are not started (``Worker.bind()``), or
            ``overlap_gpu_communication="auto"`` meets a method that does not wait on
            the input.
        ValueError: an option is out of range.
    """
    # the first statement: locals() holds exactly the keyword arguments above
    options = CompileOptions(**{name: value for name, value in locals().items() if name != "dag"})
    return _launch(dag, options)


def _launch(dag: RayObject, options: CompileOptions) -> CompiledGraph:
    from cgraph import visualize
    from cgraph.runtime.launch import launch, locate_actors

    planned = _plan(dag, options, locate=locate_actors)
    compiled = launch(planned.front, planned.planned, options)
    compiled.drawer = draw_schedule  # the runtime draws through it, without importing the compiler
    compiled.tracer = visualize  # and builds traces, summaries and timeline pictures through it
    return compiled


def _plan(dag: RayObject, options: CompileOptions, locate: Callable[[FrontEnd], Graph] | None) -> CompiledPlan:
    front, planned = plan_dag(
        dag,
        overlap=bool(options.overlap_gpu_communication),  # "auto" plans both schedules
        # "auto" weighs running ahead itself, where several executions can be in flight
        ahead=options.run_ahead or (options.overlap_gpu_communication == "auto"
                                    and options.max_inflight_executions >= 2),
        default_communicator=options.default_communicator,
        locate=locate,
    )
    compiled = CompiledPlan(front, planned, options)
    if os.environ.get(VISUALIZE_ENV, "") not in ("", "0") or os.environ.get(RAY_VISUALIZE_ENV) == "1":
        compiled.visualize()  # logs the file it wrote
    return compiled


def _communicator_name(communicator: str | UserValue | None, table: CommunicatorTable) -> str | None:
    if communicator is None or isinstance(communicator, str):
        return communicator
    return table.name(communicator)


def _log_pass(name: str, value: object) -> None:
    """``dump`` for the scheduler: the text form after a pass, on the "cgraph" logger."""
    from cgraph.scheduler.ops import format_schedule

    text = format_schedule(value) if isinstance(value, dict) else str(value)
    logger.info("after %s:\n%s", name, text)
