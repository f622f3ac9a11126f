"""find_deadlock / raise_on_deadlock: the evidence, the message, and lowering that avoids it."""

from __future__ import annotations

import pytest

from cgraph.errors import DeadlockError
from cgraph.ir import parse_graph
from cgraph.scheduler import (
    Deadlock,
    find_deadlock,
    format_schedule,
    lower,
    parse_op,
    parse_schedule,
    plan_channels,
    raise_on_deadlock,
)
from tests.unit.test_scheduler_invariants import assert_schedule_ok


def ops(text: str) -> tuple[object, ...]:
    return tuple(parse_op(t) for t in text.split())


def test_crossed_sends_are_a_cycle() -> None:
    # both actors send first; each SEND waits for a RECV the other has not reached
    schedule = parse_schedule("a.C1 a.SEND1>b a.RECV2<b | b.C2 b.SEND2>a b.RECV1<a")
    deadlock = find_deadlock(schedule)
    assert deadlock == Deadlock(
        blocked={"a": 1, "b": 1},
        waits_for={"a": "b", "b": "a"},
        cycle=ops("a.SEND1>b b.SEND2>a"),  # type: ignore[arg-type]
    )
    text = deadlock.describe(schedule)
    first, grid = text.split("\n", 1)
    assert first == "wait-for cycle: a.SEND1>b waits for b.RECV1<a, b.SEND2>a waits for a.RECV2<b"
    assert "[a.SEND1>b]" in grid and "<-- here (step 1: a.SEND1>b)" in grid
    assert "<-- here (step 1: b.SEND2>a)" in grid


# Both send first over NCCL, bound in the order f, h, g, k:
# -> a.f ==nccl==> b.g -> driver
# -> b.h ==nccl==> a.k -> driver
FHGK = parse_graph(
    """
    actor a = W(gpus=1)
    actor b = W(gpus=1)
    n0 = input
    n1 = a.f(n0) :nccl
    n2 = b.h(n0) :nccl
    n3 = b.g(n1)
    n4 = a.k(n2)
    return [n3, n4]
    """
)
FHGK_NAIVE = "a.R0 a.C1 a.SEND1>b a.RECV2<b a.C4 a.W4 | b.R0 b.C2 b.SEND2>a b.RECV1<a b.C3 b.W3"


def test_naive_lowering_of_crossed_nccl_edges_deadlocks_and_lower_avoids_it() -> None:
    naive = parse_schedule(FHGK_NAIVE)
    with pytest.raises(DeadlockError) as err:
        raise_on_deadlock(naive, FHGK)
    message = str(err.value)
    assert "a.SEND1>b waits for b.RECV1<a, b.SEND2>a waits for a.RECV2<b" in message
    assert "  a waits before n4 = a.k(n2) for n1 = a.f(n0) :nccl" in message
    assert "  b waits before n3 = b.g(n1) for n2 = b.h(n0) :nccl" in message
    assert 'transport="shm"' in message and "bind the methods of these actors" in message
    assert err.value.evidence.cycle == ops("a.SEND1>b b.SEND2>a")

    plan = plan_channels(FHGK)
    lowered = lower(FHGK, plan)
    assert format_schedule(lowered) == FHGK_NAIVE.replace("b.SEND2>a b.RECV1<a", "b.RECV1<a b.SEND2>a")
    assert_schedule_ok(FHGK, plan, lowered)
    raise_on_deadlock(lowered, FHGK)  # no error


# a.h is bound first (order=0) but needs b.g, which needs a.f, bound after h:
# -> a.f -> b.g -> a.h -> driver        a runs h, f;  b runs g
ORDER_CYCLE = parse_graph(
    """
    actor a = W(gpus=0)
    actor b = W(gpus=0)
    n0 = input
    n1 = a.f(n0)
    n2 = b.g(n1)
    n3 = a.h(n2) order=0
    return n3
    """
)


def test_bind_order_against_the_dataflow_is_reported_with_its_cycle() -> None:
    schedule = lower(ORDER_CYCLE, plan_channels(ORDER_CYCLE))
    assert format_schedule(schedule) == "a.R2 a.C3 a.W3 a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2"
    with pytest.raises(DeadlockError) as err:
        raise_on_deadlock(schedule, ORDER_CYCLE)
    message = str(err.value)
    assert message.startswith(
        "the compiled schedule deadlocks: wait-for cycle: a.R2 waits for b.W2, b.R1 waits for a.W1\n"
        "  at:  a waits before n3 = a.h(n2) order=0 for n2 = b.g(n1)\n"
        "       b waits before n2 = b.g(n1) for n1 = a.f(n0)\n"
        "  why: an actor runs its methods in bind order (order=), so a method that needs a value "
        "made later by its own actor, directly or through other actors, can never run\n"
        "  fix: bind the methods in dataflow order, or put one of them on another actor\n"
        "step |"
    )
    assert "<-- here (step 0: a.R2)" in message
    evidence = err.value.evidence
    assert isinstance(evidence, Deadlock)
    assert evidence.cycle == ops("a.R2 b.R1") and evidence.waits_for == {"a": "b", "b": "a"}


def test_a_read_of_its_own_later_write_is_a_cycle_of_one() -> None:
    # a.g (bound first) reads a.f's result through a's intra channel
    graph = parse_graph(
        """
        actor a = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = a.g(n1) order=0
        return n2
        """
    )
    schedule = lower(graph, plan_channels(graph))
    assert format_schedule(schedule) == "a.R1 a.C2 a.W2 a.R0 a.C1 a.W1"
    deadlock = find_deadlock(schedule)
    assert deadlock is not None
    assert deadlock.cycle == ops("a.R1") and deadlock.waits_for == {"a": "a"}
    assert deadlock.describe(schedule).startswith("wait-for cycle: a.R1 waits for a.W1\n")


def test_an_op_without_partner_leaves_a_frontier_and_no_cycle() -> None:
    schedule = parse_schedule("a.C1 a.SEND1>b a.C3 | b.C2 b.W2")
    deadlock = find_deadlock(schedule)
    assert deadlock == Deadlock(blocked={"a": 1}, waits_for={"a": "b"}, cycle=())
    assert deadlock.describe(schedule).startswith(
        "blocked, no cycle (an op has no partner): a.SEND1>b waits for b.RECV1<a (not in b's schedule)"
    )


def test_collectives_wait_for_every_member() -> None:
    schedule = parse_schedule("a.COLL3[a,b] a.SEND1>b | b.RECV1<a b.COLL3[a,b]")
    deadlock = find_deadlock(schedule)
    assert deadlock is not None
    assert deadlock.cycle == ops("a.COLL3[a,b] b.RECV1<a")
    assert "a.COLL3[a,b] waits for b.COLL3[a,b], b.RECV1<a waits for a.SEND1>b" in deadlock.describe(schedule)
    fine = parse_schedule("a.COLL3[a,b] a.SEND1>b | b.COLL3[a,b] b.RECV1<a | c.R0")
    assert find_deadlock(fine) is None


@pytest.mark.parametrize(
    "text",
    [
        "a.R0 a.C1",  # the driver's input is always there
        "a.C1 a.W1 | b.R1 b.C2",  # a READ waits for its WRITE
        "b.R1 b.C2 | a.C1 a.W1",  # whoever runs first
        "a.C1 a.SEND1>b@comm a.R2 | b.RECV1<a@comm b.C2 b.W2",  # streams do not matter
    ],
)
def test_schedules_that_finish(text: str) -> None:
    assert find_deadlock(parse_schedule(text)) is None


def test_a_long_ring_of_actors_finishes_or_shows_its_cycle() -> None:
    # 1,500 ops passing a value around 32 actors: n<k> is made on w<k % 32> from n<k-1>
    lanes: dict[str, list[str]] = {f"w{i}": [] for i in range(32)}
    for k in range(1, 500):
        actor = f"w{k % 32}"
        lanes[actor] += [f"{actor}.R{k - 1}", f"{actor}.C{k}", f"{actor}.W{k}"]
    assert find_deadlock(parse_schedule(" | ".join(" ".join(o) for o in lanes.values()))) is None
    lanes["w1"].insert(0, "w1.R40")  # w1 first waits for w8's second value, which needs w1's first
    deadlock = find_deadlock(parse_schedule(" | ".join(" ".join(o) for o in lanes.values())))
    assert deadlock is not None and len(deadlock.cycle) == 8
    assert str(deadlock.cycle[0]) == "w1.R40" and deadlock.waits_for["w1"] == "w8"


def test_raise_without_a_graph_still_shows_cycle_and_grid() -> None:
    with pytest.raises(DeadlockError) as err:
        raise_on_deadlock(parse_schedule("a.R2 a.C1 a.W1 | b.R1 b.C2 b.W2"))
    assert "a.R2 waits for b.W2, b.R1 waits for a.W1" in str(err.value)
    assert "step |" in str(err.value)
