"""Shared invariant checks for scheduler tests, and tests of ``verify`` itself.

Other test modules import ``assert_schedule_ok`` / ``assert_overlap_ok``:

    from tests.unit.test_scheduler_invariants import assert_schedule_ok
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cgraph.errors import ScheduleInvariantError
from cgraph.ir import Graph, parse_graph
from cgraph.scheduler import (
    COMM_KINDS,
    ChannelPlan,
    OpKind,
    Schedule,
    Stream,
    check,
    find_deadlock,
    format_schedule,
    lower,
    parse_schedule,
    plan_channels,
    verify,
)


def assert_schedule_ok(graph: Graph, plan: ChannelPlan, schedule: Schedule) -> None:
    """Every invariant holds, the schedule finishes, and its text round-trips."""
    problems = verify(graph, plan, schedule)
    assert not problems, "\n".join(problems) + "\n" + format_schedule(schedule)
    deadlock = find_deadlock(schedule)
    assert deadlock is None, deadlock.describe(schedule)
    assert parse_schedule(format_schedule(schedule)) == schedule


def assert_overlap_ok(before: Schedule, after: Schedule) -> None:
    """What overlap promises: same ops, comm ops on the comm stream, only RECVs moved
    (earlier), COMPUTE order and RECV order unchanged."""
    assert list(after) == list(before)
    for actor, ops in before.items():
        new = after[actor]
        plain = [replace(op, stream=Stream.COMPUTE) for op in new]
        assert sorted(map(str, plain)) == sorted(map(str, ops)), actor
        assert all((op.stream is Stream.COMM) == (op.kind in COMM_KINDS) for op in new)
        for kind in (OpKind.COMPUTE, OpKind.RECV):
            assert [op.node for op in plain if op.kind is kind] == [op.node for op in ops if op.kind is kind]
        staying = [op for op in ops if op.kind is not OpKind.RECV]
        assert [op for op in plain if op.kind is not OpKind.RECV] == staying
        for op in (op for op in ops if op.kind is OpKind.RECV):
            assert plain.index(op) <= ops.index(op), f"{op} moved later"


def hoisted_ops(before: Schedule, after: Schedule) -> list[str]:
    """The ops that run earlier in their lane than before (compared without streams)."""
    out = []
    for actor, ops in before.items():
        plain = [replace(op, stream=Stream.COMPUTE) for op in after[actor]]
        out += [str(op) for i, op in enumerate(ops) if plain.index(op) < i]
    return out


# --------------------------------------------------------------------------- verify
# driver -> a.f ==nccl==> b.g -> driver, and a.h reads f's result through an intra channel
GRAPH = parse_graph(
    """
    actor a = W(gpus=1)
    actor b = W(gpus=1)
    n0 = input
    n1 = a.f(n0) :nccl
    n2 = b.g(n1)
    n3 = a.h(n1)
    return [n2, n3]
    """
)
PLAN = plan_channels(GRAPH)
GOOD = "a.R0 a.C1 a.W1 a.SEND1>b a.R1 a.C3 a.W3 | b.RECV1<a b.C2 b.W2"


def test_the_lowered_schedule_is_the_good_one() -> None:
    assert format_schedule(lower(GRAPH, PLAN)) == GOOD
    assert_schedule_ok(GRAPH, PLAN, parse_schedule(GOOD))


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (GOOD.replace(" a.R1", ""), "a.W1 is never read by a"),
        (GOOD.replace("a.W1 ", ""), "a.R1 reads n1, which a never writes"),
        (GOOD.replace("a.SEND1>b ", ""), "b.RECV1<a has 0 matching a.SEND1>b"),
        (GOOD.replace("b.RECV1<a ", ""), "a.SEND1>b has 0 matching b.RECV1<a"),
        (GOOD.replace("b.RECV1<a", "b.R1"), "b.R1 reads n1 through no planned channel"),
        (GOOD.replace("a.R0 a.C1", "a.C1 a.R0"), "a.C1 runs before a obtains n0"),
        (GOOD.replace("a.C1 a.W1", "a.W1 a.C1"), "a.W1 comes before a makes n1"),
        (GOOD.replace("a.C3 ", ""), "n3 (a.h) is computed 0 times on a"),
        (GOOD.replace("a.R1", "a.R1 a.R1"), "a obtains n1 2 times"),
        (GOOD.replace("b.C2", "b.C3"), "b.C3 runs n3, a method of a"),
        (GOOD.replace("b.C2", "b.C9"), "b.C9 names n9, which is not in the graph"),
        (GOOD.replace("b.RECV1<a b.C2", "b.C2 b.RECV1<a"), "b.C2 runs before b obtains n1"),
        (GOOD.replace("a.W3", "a.W3 a.SEND3>b"), "a.SEND3>b: no communicator channel n3 a -> b"),
    ],
)
def test_verify_reports_each_broken_invariant(broken: str, expected: str) -> None:
    problems = verify(GRAPH, PLAN, parse_schedule(broken))
    assert any(expected in p for p in problems), problems


def test_verify_reports_comm_pairs_in_different_orders() -> None:
    # a.f and a.k both send to b; b receives them the other way round
    graph = parse_graph(
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1)
        n0 = input
        n1 = a.f(n0) :nccl
        n2 = a.k(n0) :nccl
        n3 = b.g(n1, n2)
        return n3
        """
    )
    plan = plan_channels(graph)
    good = "a.R0 a.C1 a.SEND1>b a.C2 a.SEND2>b | b.RECV1<a b.RECV2<a b.C3 b.W3"
    assert format_schedule(lower(graph, plan)) == good
    swapped = parse_schedule(good.replace("b.RECV1<a b.RECV2<a", "b.RECV2<a b.RECV1<a"))
    problems = verify(graph, plan, swapped)
    assert problems == (
        "comm order: comm ops between a and b come in different orders: "
        "at their shared op #0, a has a.SEND1>b but b has b.RECV2<a",
    )
    assert find_deadlock(swapped) is not None


def test_verify_reports_collectives_out_of_order() -> None:
    # two allreduces over a and b, joined in opposite orders
    graph = parse_graph(
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n0)
        n3 = allreduce(n1, n2)
        n4 = allreduce(n1, n2)
        n5 = n3[0]
        n6 = n4[1]
        return [n5, n6]
        """
    )
    plan = plan_channels(graph)
    schedule = lower(graph, plan)
    assert_schedule_ok(graph, plan, schedule)
    text = format_schedule(schedule)
    assert "b.COLL3[a,b] b.COLL4[a,b]" in text
    swapped = parse_schedule(text.replace("b.COLL3[a,b] b.COLL4[a,b]", "b.COLL4[a,b] b.COLL3[a,b]"))
    assert any("different orders" in p for p in verify(graph, plan, swapped))
    dropped = parse_schedule(text.replace(" b.COLL4[a,b]", ""))
    assert any("b.COLL4[a,b] appears 0 times" in p for p in verify(graph, plan, dropped))


def test_check_raises_with_every_violation_and_the_grid() -> None:
    check(GRAPH, PLAN, parse_schedule(GOOD), "lower")  # fine: no error
    with pytest.raises(ScheduleInvariantError) as err:
        check(GRAPH, PLAN, parse_schedule(GOOD.replace("a.W1 ", "")), "overlap")
    message = str(err.value)
    assert message.startswith("after pass 'overlap' the schedule breaks 2 invariant(s)")
    assert "  - reads and writes: a.R1 reads n1, which a never writes" in message
    assert "  - channels used: channel n1.intra is never written (a.W1)" in message
    assert "step |" in message and "b    | b.RECV1<a" in message
