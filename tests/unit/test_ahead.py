"""Run-ahead (scheduler/ahead.py): RECVs issued one execution early, planned, simulated and run.

The pass, its text form and its safety checks run on text graphs; the simulator's
several executions in flight say where it gains; the runtime runs it in threads
(``test_comm_ops.Harness``, the CPU communicator), where no value may cross into
another execution's.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.errors import GraphSyntaxError
from cgraph.ir import parse_graph
from cgraph.runtime.comm_ops import last_link_reads
from cgraph.scheduler import find_deadlock, format_schedule, parse_schedule, plan_schedule, verify
from cgraph.scheduler.ahead import execution_order, in_execution_order, unroll
from cgraph.scheduler.ops import Op, OpKind, Stream, parse_op
from cgraph.scheduler.simulate import Machine, simulate, simulate_executions
from tests.unit.test_comm_ops import (
    CHAIN,
    SEED,
    SEND_THEN_BUMP,
    Harness,
    normalise,
    switch_and_check,
)

PIPE = """
actor a = W(gpus=0)
actor b = W(gpus=0)
n0 = input
n1 = a.make(n0) :nccl
n2 = b.double(n1)
return n2
"""

def planned(text: str, communicator: str = "gloo"):  # type: ignore[no-untyped-def]
    return plan_schedule(parse_graph(text), overlap=True, ahead=True, default_communicator=communicator)


def test_only_receives_of_communicators_that_wait_for_them_run_ahead() -> None:
    """gloo's and NCCL's data moves once the receive is posted; the CPU communicator's
    link takes the sender's copy without it (and the receive keeps its view)."""
    assert any(op.ahead for op in planned(PIPE).schedule["b"])
    cpu = planned(PIPE, "cpu")
    assert cpu.schedule == dict(cpu.passes)["overlap"]


def test_a_pipeline_stage_receives_the_next_execution_while_it_computes() -> None:
    p = planned(PIPE)
    assert format_schedule(p.schedule) == "a.R0 a.C1 a.SEND1>b@comm | b.RECV1<a@comm+1 b.C2 b.W2"
    assert [name for name, _ in p.passes] == ["lower", "overlap", "ahead"]


def test_a_middle_stage_issues_its_receive_after_its_own_send() -> None:
    """The comm queue keeps each execution's ops in order: b's RECV of i+1 waits behind
    its SEND of i, never in front of it."""
    p = planned(CHAIN)
    assert format_schedule({"b": p.schedule["b"]}) == "b.C2 b.SEND2>c@comm b.RECV1<a@comm+1"
    assert execution_order(p.schedule["b"])[0] == Op("b", OpKind.RECV, "n1", ("a",), Stream.COMM)


def test_every_receiver_of_the_seed_runs_its_three_receives_ahead() -> None:
    p = planned(SEED)
    assert p.schedule["r"][:3] == tuple(parse_op(f"r.RECV{i}<s{i}@comm+1") for i in (1, 2, 3))
    assert not verify(p.graph, p.plan, p.schedule)


def test_the_text_form_round_trips_and_refuses_an_ahead_op_that_is_not_a_comm_receive() -> None:
    p = planned(SEED)
    assert parse_schedule(format_schedule(p.schedule)) == p.schedule
    for text in ("a.C1+1", "b.RECV1<a+1", "a.SEND1>b@comm+1"):
        with pytest.raises(GraphSyntaxError, match="runs ahead"):
            parse_op(text)


def test_a_receive_whose_sender_needs_its_own_actor_first_stays_in_its_execution() -> None:
    """b sends n2 to a, and a's reply n3 needs it: b's RECV of n3 cannot start before
    b's own SEND of the same execution, so nothing of b runs ahead."""
    text = """
actor a = W(gpus=0)
actor b = W(gpus=0)
n0 = input
n1 = b.make(n0)
n2 = b.double(n1) :nccl
n3 = a.double(n2) :nccl
n4 = b.double(n3)
return n4
"""
    p = planned(text)
    assert not any(op.ahead for op in p.schedule["b"]), format_schedule(p.schedule)
    assert any(op.ahead for op in p.schedule["a"])  # a's RECV of n2 leads its lane


def test_unroll_renames_values_per_execution_and_drops_the_last_executions_receives() -> None:
    p = planned(PIPE)
    lanes = unroll(p.schedule, 2)
    assert [str(op) for op in lanes["b"]] == [
        "b.RECV{n1.0}<a@comm", "b.RECV{n1.1}<a@comm", "b.C{n2.0}", "b.W{n2.0}", "b.C{n2.1}", "b.W{n2.1}"]
    late = unroll(p.schedule, 2, conservative=True)
    assert [str(op) for op in late["b"]][:4] == ["b.RECV{n1.0}<a@comm", "b.C{n2.0}", "b.W{n2.0}", "b.RECV{n1.1}<a@comm"]
    with pytest.raises(ValueError, match="at least one"):
        unroll(p.schedule, 0)


def test_the_simulator_predicts_the_gain_only_where_comm_has_its_own_engine() -> None:
    """Stage b computes as long as a value takes to cross; a computes little. Per
    execution, b's receive and compute come one after the other, unless the receive
    runs ahead, on its own engine."""
    p = planned(PIPE)
    overlapped, ahead = dict(p.passes)["overlap"], p.schedule
    durations = {"a.C1": 0.2, "a.SEND1>b": 1.0, "b.C2": 1.0}
    one = simulate(overlapped, durations).makespan
    assert simulate_executions(overlapped, durations, 1).makespan == simulate_executions(ahead, durations, 1).makespan == one
    own = [simulate_executions(s, durations, 8).makespan for s in (overlapped, ahead)]
    assert own == pytest.approx([16.2, 10.6])  # a period of 2.0 (receive + compute) against 1.2 (a's)
    shared = [simulate_executions(s, durations, 8, machine=Machine.SHARED_CORES).makespan for s in (overlapped, ahead)]
    assert shared[0] == pytest.approx(shared[1])  # one core per actor: nothing to overlap with


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(0.01, 2.0), min_size=3, max_size=3), st.integers(1, 6))
def test_running_ahead_is_never_predicted_slower_on_its_own_engine(times: list[float], executions: int) -> None:
    """Property: on its own engine, starting receives earlier never delays anything (a
    max-plus system with fewer constraints), for the pipeline and the seed's fan-in."""
    for text, keys in ((PIPE, ("a.C1", "a.SEND1>b", "b.C2")), (CHAIN, ("a.C1", "a.SEND1>b", "b.C2"))):
        p = planned(text)
        durations = dict(zip(keys, times, strict=True))
        slow = simulate_executions(dict(p.passes)["overlap"], durations, executions).makespan
        assert simulate_executions(p.schedule, durations, executions).makespan <= slow + 1e-9


def test_a_link_read_ahead_gives_no_views() -> None:
    """The CPU communicator's link holds one viewed message: a RECV of the next execution
    would meet this execution's view still held."""
    with Harness(PIPE, ahead=True) as h:
        program = h.comm.program_of("b")
        assert last_link_reads(h.planned.schedule["b"], program) == set()
        assert last_link_reads(dict(h.planned.passes)["overlap"]["b"], program) == {("n1", "a")}
        assert [normalise(row) for row in h.run(*range(6))] == [[[2.0 * x] * 3] for x in range(6)]


@pytest.mark.parametrize("text", [SEED, CHAIN])
def test_results_with_receives_run_ahead_are_those_without(text: str) -> None:
    inputs = [1, 4, -1, 2, 0, -3, 5, 3]
    with Harness(text, overlap=True) as h:
        want = [normalise(row) for row in h.run(*inputs)]
    with Harness(text, ahead=True) as h:
        assert any(op.ahead for ops in h.planned.schedule.values() for op in ops)
        got = [normalise(row) for row in h.run(*inputs)]  # written at once: several in flight
        got += [normalise(row) for x in inputs for row in h.run(x)]  # one at a time
    assert got == want + want


def test_the_send_fence_holds_with_receives_run_ahead() -> None:
    """a bumps the tensor it sends in place right after sending it; b's receive runs
    ahead, so a's send finishes sooner, but never after a's next method began."""
    with Harness(SEND_THEN_BUMP, ahead=True) as h:
        assert h.planned.schedule["b"][0].ahead
        rows = [row for start in (0, 4, 8) for row in h.run(*range(start, start + 4))]
    assert [row[0] for row in rows] == [[float(x), float(x)] for x in range(12)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(-3, 6), min_size=2, max_size=7), st.data())
def test_a_switch_to_or_from_running_ahead_at_any_boundary_changes_no_value(inputs: list[int], data) -> None:
    """Property (as test_comm_ops' for overlap): a switch between any two of the three
    schedules, at any execution, with any executions in flight after it, gives the
    results of no switch: values received ahead carry over, none is received twice."""
    at = data.draw(st.integers(1, len(inputs) - 1), label="switch at")
    start, to = data.draw(st.permutations(["with overlap", "without overlap", "ahead"]), label="from, to")[:2]
    switch_and_check(inputs, at, start, to, ahead=True)


def test_one_execution_checks_read_lanes_in_execution_order() -> None:
    p = planned(CHAIN)
    assert in_execution_order(p.schedule)["b"] == dict(p.passes)["overlap"]["b"]
    assert find_deadlock(in_execution_order(p.schedule)) is None


def test_the_picture_names_the_receives_that_serve_the_next_execution() -> None:
    from cgraph.visualize import schedule_to_dot

    p = planned(CHAIN)
    dot = schedule_to_dot(p.schedule, p.before_overlap)
    assert "b.RECV1<a\\ncomm stream: the next execution's" in dot
