"""Compile options, with Ray's defaults where Ray has one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cgraph._boundary import UserValue

ON_FULL = ("raise", "wait")
"""What ``execute`` may do at ``max_inflight_executions``: raise ``CapacityError`` or wait."""


@dataclass(frozen=True)
class CompileOptions:
    """The options of ``cgraph.compile`` (Ray Compiled Graphs' names, without Ray's underscores).

    Attributes:
        overlap_gpu_communication: reorder communicator receives to overlap compute;
            ``"auto"``: the graph records its first ``auto_executions`` executions,
            predicts both schedules on the recorded op durations (``scheduler.decide``)
            and every actor runs the one chosen from the same execution on
            (``compiled.overlap_decision`` says what and why).
        auto_executions: with ``overlap_gpu_communication="auto"``, how many executions
            are recorded (and read) before it decides.
        run_ahead: with ``overlap_gpu_communication=True`` and ``max_inflight_executions
            >= 2``, each actor's comm thread or stream begins receiving execution i+1's
            values while execution i computes (``scheduler/ahead.py``: the receives that
            lead an actor's comm queue and whose senders need nothing of the actor).
        max_inflight_executions: executions submitted whose results the driver
            has not yet taken from the graph's output channels, at most (one
            more raises ``CapacityError``).
        buffer_size_bytes: initial size of each shared-memory slot (grows once
            when a larger value comes).
        submit_timeout: seconds ``execute`` may wait for room (``None`` or
            negative: forever).
        get_timeout: default seconds ``get`` waits (``None`` or negative: forever).
        enable_asyncio: prepare ``execute_async``.
        default_communicator: a name or communicator object for communicator
            edges the actors cannot serve themselves: ``"cpu"`` (shared-memory
            links, actors on the driver's node), ``"gloo"`` (torch's gloo, any
            nodes), ``"nccl"``, or an object (a ``cgraph.comm.Communicator``).
        cpu_affinity: ``None`` (default: the OS places every process),
            ``"colocate"`` (pin the driver's calling thread and the loops of the
            actors on its node to one CPU while the graph lives: lowest latency
            for small latency-bound graphs, methods run one at a time), or a set
            of CPU ids. Restored at teardown.
        on_full: what ``execute`` does when ``max_inflight_executions`` executions are
            in flight: ``"raise"`` (Ray's: ``CapacityError`` at once) or ``"wait"``
            (backpressure: it waits, up to ``submit_timeout``, for the oldest one to
            finish, and keeps that result for its ref; then ``CapacityError``).
        max_buffered_results: results taken from the output channels but not
            yet read by their refs (a later execution was read first), at most;
            a get() that would buffer one more raises ``CapacityError``.
        max_value_bytes: the largest value an edge between nodes carries (16 GiB); a
            larger one is that execution's error at the sender, and a frame that
            announces more is refused before memory is allocated.
        timeline: record one event per op per execution on every actor, for
            ``CompiledGraph.timeline()`` (None, the default: on when the
            ``CGRAPH_TIMELINE`` environment variable names a file to write at teardown).
        timeline_executions: how many of the latest executions each actor keeps.
        teardown_timeout: seconds ``teardown()`` waits for the actor loops to end
            (Ray's ``DAGContext.teardown_timeout``, 30).
        tls: run TLS on every socket of the graph (certificates from each process's
            ``CGRAPH_TLS_CERT``/``_KEY``/``_CA``, else Ray's ``RAY_TLS_*``); None (the
            default): on when ``CGRAPH_TLS=1`` or ``RAY_USE_TLS=1``.
    """

    overlap_gpu_communication: bool | str = False  # True | False | "auto"
    auto_executions: int = 5
    run_ahead: bool = False  # with overlap: receives of execution i+1 begin while i computes
    max_inflight_executions: int = 10
    max_buffered_results: int = 1000
    on_full: str = "raise"  # "raise" (Ray's) | "wait": execute at capacity waits for the oldest execution
    buffer_size_bytes: int = 1 << 20
    submit_timeout: float | None = 10.0
    get_timeout: float | None = None
    enable_asyncio: bool = False
    default_communicator: str | UserValue | None = None  # a name, or the user's communicator object
    cpu_affinity: str | Iterable[int] | None = None  # None | "colocate" | set of CPU ids (see runtime/affinity.py)
    max_value_bytes: int = 16 << 30  # the largest value a cross-node channel carries
    tls: bool | None = None  # TLS on every socket; None: CGRAPH_TLS / RAY_USE_TLS decide
    timeline: bool | None = None  # record op events; None: on when CGRAPH_TIMELINE is set
    timeline_executions: int = 100
    teardown_timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("submit_timeout", "get_timeout"):  # Ray's -1 (any negative): no limit
            value = getattr(self, name)
            if value is not None and value < 0:
                object.__setattr__(self, name, None)
        if self.overlap_gpu_communication not in (True, False, "auto"):
            raise ValueError("overlap_gpu_communication must be True, False or 'auto', "
                             f"got {self.overlap_gpu_communication!r}")
        if self.run_ahead not in (True, False):
            raise ValueError(f"run_ahead must be True or False, got {self.run_ahead!r}")
        if self.run_ahead and self.overlap_gpu_communication is not True:
            raise ValueError("run_ahead=True runs receives ahead on the comm stream, which needs "
                             f"overlap_gpu_communication=True (got {self.overlap_gpu_communication!r}; "
                             "'auto' weighs running ahead itself)")
        if self.run_ahead and self.max_inflight_executions < 2:
            raise ValueError("run_ahead=True receives the next execution's values while one runs, "
                             "which needs max_inflight_executions >= 2")
        if self.auto_executions < 1:
            raise ValueError(f"auto_executions must be >= 1, got {self.auto_executions}")
        if self.on_full not in ON_FULL:
            raise ValueError(f"on_full must be one of {ON_FULL}, got {self.on_full!r}")
        if self.max_buffered_results < 1:
            raise ValueError(f"max_buffered_results must be >= 1, got {self.max_buffered_results}")
        if self.max_inflight_executions < 1:
            raise ValueError(
                f"max_inflight_executions must be >= 1, got {self.max_inflight_executions}"
            )
        if self.max_value_bytes < 1:
            raise ValueError(f"max_value_bytes must be >= 1, got {self.max_value_bytes}")
        if self.timeline_executions < 1:
            raise ValueError(f"timeline_executions must be >= 1, got {self.timeline_executions}")
        if self.buffer_size_bytes < 1:
            raise ValueError(f"buffer_size_bytes must be >= 1, got {self.buffer_size_bytes}")
