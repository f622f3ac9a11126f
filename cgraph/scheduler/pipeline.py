"""The pass pipeline: graph -> channel plan -> schedule, checked between passes.

    plan_channels   which channel carries each edge
    plan_groups     which actors share each communicator, and what kind runs it
    lower           per-actor ops in bind order, comm pairs co-scheduled
    overlap         (when asked) comm stream, RECVs hoisted
    ahead           (when asked, after overlap) leading RECVs issued one execution ahead

After each schedule pass, ``verify`` (when ``check``) and the deadlock dry run
(always; of one execution, in ``execution_order``) guard the result; ``dump(pass_name, text)`` sees the text form after
every pass (the caller wires ``CGRAPH_DEBUG=1`` to it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from cgraph.ir.graph import Graph
from cgraph.scheduler.ahead import RENDEZVOUS_KINDS, in_execution_order, run_ahead
from cgraph.scheduler.channels import ChannelPlan, format_channels, plan_channels
from cgraph.scheduler.deadlock import raise_on_deadlock
from cgraph.scheduler.groups import plan_groups
from cgraph.scheduler.lower import lower
from cgraph.scheduler.ops import Op, Schedule, format_schedule
from cgraph.scheduler.overlap import overlap as overlap_schedule
from cgraph.scheduler.verify import check as check_schedule

SchedulePass = Callable[[Graph, ChannelPlan, Schedule], Schedule]

PASSES: tuple[tuple[str, SchedulePass], ...] = (
    ("lower", lambda graph, plan, schedule: lower(graph, plan)),
    ("overlap", lambda graph, plan, schedule: overlap_schedule(schedule)),
    ("ahead", lambda graph, plan, schedule: run_ahead(schedule, lambda op: _rendezvous(plan, op))),
)
"""The schedule passes, in order; ``overlap`` and ``ahead`` run only when asked."""


def _rendezvous(plan: ChannelPlan, op: Op) -> bool:
    """Whether ``op``'s (a RECV's) group moves data only once the receive is posted."""
    spec = plan.for_reader(op.node, op.actor)
    return spec is not None and plan.group(spec.transport).kind in RENDEZVOUS_KINDS


@dataclass(frozen=True)
class Planned:
    """Everything the compiler decided about one graph."""

    graph: Graph
    plan: ChannelPlan
    schedule: Schedule  # the final schedule
    before_overlap: Schedule | None  # the lowered schedule, when overlap ran
    passes: tuple[tuple[str, Schedule], ...]  # each pass's result, in order


def plan_schedule(
    graph: Graph,
    *,
    overlap: bool = False,
    ahead: bool = False,
    check: bool = True,
    default_communicator: str | None = None,
    customs: Collection[str] | None = None,
    dump: Callable[[str, str], None] | None = None,
) -> Planned:
    """Run the pipeline on ``graph``.

    Args:
        graph: the DAG.
        overlap: run the overlap pass (``_overlap_gpu_communication=True``).
        ahead: with ``overlap``, also issue leading RECVs one execution ahead (``ahead.py``;
            only worth it with several executions in flight, and only RECVs of groups whose
            data moves once the receive is posted: ``RENDEZVOUS_KINDS``).
        check: verify the invariants after each pass.
        default_communicator: communicator for NCCL edges between actors
            without GPUs (see ``plan_channels``), and for collectives (``plan_groups``).
        customs: the "custom:<name>" communicators given as objects; None: not checked.
        dump: called as ``dump(pass_name, text)`` after each pass.

    Returns:
        The plan, the final schedule and every pass's result.

    Raises:
        TransportError, DAGValidationError: from ``plan_channels``.
        TransportError, CompileError: from ``plan_groups``.
        DeadlockError: a schedule cannot finish; the evidence is attached.
        ScheduleInvariantError: a pass broke an invariant (a cgraph bug).
    """
    plan = plan_channels(graph, default_communicator=default_communicator)
    plan = replace(plan, groups=plan_groups(graph, plan.channels, default_communicator, customs))
    if dump is not None:
        dump("plan_channels", format_channels(plan))
    schedule: Schedule = {}
    done: list[tuple[str, Schedule]] = []
    for name, run in PASSES:
        if (name == "overlap" and not overlap) or (name == "ahead" and not (overlap and ahead)):
            continue
        schedule = run(graph, plan, schedule)
        done.append((name, schedule))
        if dump is not None:
            dump(name, format_schedule(schedule))
        if check:
            check_schedule(graph, plan, schedule, name)
        raise_on_deadlock(in_execution_order(schedule), graph)
    before = done[0][1] if overlap else None
    return Planned(graph, plan, schedule, before, tuple(done))
