"""Property tests: text forms round-trip, and random DAGs always lower to valid,
deadlock-free schedules, before and after overlap, and with receives run ahead."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.errors import TransportError
from cgraph.ir import Graph, format_graph, parse_graph
from cgraph.scheduler import (
    Schedule,
    find_deadlock,
    format_channels,
    format_schedule,
    lower,
    overlap,
    parse_channels,
    parse_schedule,
    plan_channels,
    plan_schedule,
    verify,
)
from cgraph.scheduler.ahead import UNROLLED, in_execution_order, run_ahead, unroll
from cgraph.scheduler.ops import OpKind, Stream
from cgraph.scheduler.overlap import _happens_before, _needed
from cgraph.scheduler.simulate import Machine, simulate_executions
from tests.unit.graph_strategies import graphs, schedules
from tests.unit.test_scheduler_invariants import assert_overlap_ok, assert_schedule_ok

pytestmark = pytest.mark.slow  # left out of `make test-fast`

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(graphs(hosts=True))
def test_graph_text_round_trips(graph: Graph) -> None:
    assert parse_graph(format_graph(graph), graph.constants) == graph


@FAST
@given(schedules())
def test_schedule_text_round_trips(schedule: Schedule) -> None:
    assert parse_schedule(format_schedule(schedule)) == schedule


@FAST
@given(graphs(hosts=True))
def test_channel_text_round_trips(graph: Graph) -> None:
    plan = plan_channels(graph, default_communicator="cpu")
    assert parse_channels(format_channels(plan)) == plan


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(hosts=True))
def test_random_dags_lower_and_overlap_to_valid_schedules(graph: Graph) -> None:
    plan = plan_channels(graph, default_communicator="cpu")
    lowered = lower(graph, plan)
    assert_schedule_ok(graph, plan, lowered)
    overlapped = overlap(lowered)
    assert_schedule_ok(graph, plan, overlapped)
    assert_overlap_ok(lowered, overlapped)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_actors=4, max_steps=16, transports=("nccl", "auto")))
def test_communicator_heavy_dags_are_co_scheduled_without_deadlock(graph: Graph) -> None:
    # few actors, many nccl edges: lowering has to arrange rendezvous meetings
    plan = plan_channels(graph, default_communicator="cpu")
    lowered = lower(graph, plan)
    assert_schedule_ok(graph, plan, lowered)
    overlapped = overlap(lowered)
    assert_schedule_ok(graph, plan, overlapped)
    assert_overlap_ok(lowered, overlapped)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_actors=4, max_steps=16, transports=("nccl", "auto")))
def test_every_leading_receive_whose_sender_needs_nothing_of_its_actor_runs_ahead(graph: Graph) -> None:
    """run_ahead keeps every candidate (its dry run over executions never has to pin one
    back: the argument in ahead.py), the result is valid in execution order, and
    several executions back to back finish: dry-run with each RECV at the end of the
    execution before, and simulated with it issued where the loop issues it (the dry
    run of that form would block the loop at the RECV, which the runtime does not).
    """
    plan = plan_channels(graph, default_communicator="cpu")
    overlapped = overlap(lower(graph, plan))
    ahead = run_ahead(overlapped)
    order = _happens_before(overlapped)
    assert order is not None
    for actor, ops in overlapped.items():
        leading = []
        for op in ops:  # the comm ops' order: RECVs whose SEND needs nothing of the actor, first
            if op.kind is OpKind.RECV and _needed(order, actor, op) == 0:
                leading.append(op)
            elif op.kind in (OpKind.SEND, OpKind.RECV, OpKind.COLLECTIVE):
                break
        assert [op.node for op in ahead[actor] if op.ahead] == [op.node for op in leading], format_schedule(ahead)
        assert in_execution_order(ahead)[actor] == (*leading, *(op for op in ops if op not in leading))
    assert_schedule_ok(graph, plan, in_execution_order(ahead))
    unrolled = unroll(ahead, UNROLLED, conservative=True)  # each RECV blocking a one-op-at-a-time lane
    assert find_deadlock(unrolled) is None, format_schedule(unrolled)
    for machine in Machine:  # where the loop issues them, on the comm engine: they finish too
        simulate_executions(ahead, {}, UNROLLED, machine=machine, cores=1)
    assert all(op.stream is Stream.COMM for ops in ahead.values() for op in ops if op.ahead)


@FAST
@given(graphs(max_actors=4, collectives=False))
def test_the_pipeline_agrees_with_the_passes(graph: Graph) -> None:
    try:
        planned = plan_schedule(graph, overlap=True)
    except TransportError as err:  # an nccl edge between actors without GPUs
        assert "uses transport 'nccl'" in str(err)
        return
    assert planned.before_overlap == lower(graph, planned.plan)
    assert planned.schedule == overlap(planned.before_overlap)


@FAST
@given(graphs(max_actors=4), st.data())
def test_verify_notices_any_missing_op(graph: Graph, data: st.DataObject) -> None:
    plan = plan_channels(graph, default_communicator="cpu")
    schedule = lower(graph, plan)
    actor = data.draw(st.sampled_from(sorted(schedule)))
    ops = schedule[actor]
    i = data.draw(st.integers(0, len(ops) - 1))
    broken = {**schedule, actor: ops[:i] + ops[i + 1:]}
    assert verify(graph, plan, broken), f"dropping {ops[i]} went unnoticed"
