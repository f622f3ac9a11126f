"""overlap: comm stream, RECVs hoisted as far as their SEND's dependencies allow, and
the fallback when several hoists together would deadlock. (The seed example is a
case of test_scheduler_lower.)"""

from __future__ import annotations

from cgraph.ir import parse_graph
from cgraph.scheduler import (
    find_deadlock,
    format_schedule,
    lower,
    overlap,
    parse_schedule,
    plan_channels,
)
from cgraph.scheduler.simulate import compute_reads, op_key, simulate
from tests.unit.test_scheduler_invariants import assert_overlap_ok, assert_schedule_ok, hoisted_ops


def test_a_recv_stops_below_what_its_send_needs() -> None:
    # -> c.f -> b.g ==nccl==> c.h -> driver ; c.k (bound between) is independent.
    # b's SEND2 needs c.W1 (through b.R1): c's RECV may pass C3/W3 but not W1.
    graph = parse_graph(
        """
        actor b = W(gpus=1)
        actor c = W(gpus=1)
        n0 = input
        n1 = c.f(n0)
        n2 = b.g(n1) :nccl
        n3 = c.k(n0)
        n4 = c.h(n2)
        return [n3, n4]
        """
    )
    plan = plan_channels(graph)
    lowered = lower(graph, plan)
    assert format_schedule(lowered) == "b.R1 b.C2 b.SEND2>c | c.R0 c.C1 c.W1 c.C3 c.W3 c.RECV2<b c.C4 c.W4"
    after = overlap(lowered)
    assert format_schedule(after) == (
        "b.R1 b.C2 b.SEND2>c@comm | c.R0 c.C1 c.W1 c.RECV2<b@comm c.C3 c.W3 c.C4 c.W4"
    )
    assert hoisted_ops(lowered, after) == ["c.RECV2<b"]
    assert_schedule_ok(graph, plan, after)
    assert_overlap_ok(lowered, after)


def test_hoists_that_close_a_cycle_together_are_pinned_one_by_one() -> None:
    # Each hoist alone is safe; both together close a cycle through the two WRITEs
    # they pass: x.RECV8<p before x.W1 (p.SEND8 needs y.W5, q.SEND9 needs x.W1)
    # and y.RECV9<q before y.W5.
    lowered = parse_schedule(
        "x.C1 x.W1 x.RECV8<p | y.C5 y.W5 y.RECV9<q | p.R5 p.C8 p.SEND8>x | q.R1 q.C9 q.SEND9>y"
    )
    assert find_deadlock(lowered) is None
    both = parse_schedule(
        "x.RECV8<p@comm x.C1 x.W1 | y.RECV9<q@comm y.C5 y.W5 | p.R5 p.C8 p.SEND8>x@comm | q.R1 q.C9 q.SEND9>y@comm"
    )
    deadlock = find_deadlock(both)
    assert deadlock is not None and len(deadlock.cycle) == 4
    after = overlap(lowered)
    assert format_schedule(after) == (
        "x.C1 x.W1 x.RECV8<p@comm | y.RECV9<q@comm y.C5 y.W5 | p.R5 p.C8 p.SEND8>x@comm | q.R1 q.C9 q.SEND9>y@comm"
    )
    assert find_deadlock(after) is None
    assert_overlap_ok(lowered, after)


def test_a_recv_never_passes_an_earlier_comm_op() -> None:
    # x's comm ops run one after another on its comm stream: RECV2<z hoisted above
    # SEND1>y would hold y's value until z's slow C2 ends (predicted 104 against 54).
    graph = parse_graph(
        """
        actor x = W(gpus=1)
        actor y = W(gpus=1)
        actor z = W(gpus=1)
        n0 = input
        n1 = x.f(n0) :nccl
        n2 = z.h(n0) :nccl
        n3 = y.g(n1)
        n4 = x.k(n2)
        return [n3, n4]
        """
    )
    lowered = lower(graph, plan_channels(graph))
    after = overlap(lowered)
    assert [str(op) for op in after["x"]] == [
        "x.R0", "x.C1", "x.SEND1>y@comm", "x.RECV2<z@comm", "x.C4", "x.W4"]
    times = {op_key(op): 1 for ops in lowered.values() for op in ops} | {"z.C2": 50, "y.C3": 50}
    reads = compute_reads(graph)
    assert simulate(after, times, reads=reads).makespan == simulate(lowered, times, reads=reads).makespan == 54
    hoisted = {**after, "x": (after["x"][3], *after["x"][:3], *after["x"][4:])}
    assert simulate(hoisted, times, reads=reads).makespan == 104


def test_recvs_keep_their_order() -> None:
    # r receives from s2 (which needs r's first result) and then from s1 (free):
    # the second RECV may not pass the first one.
    lowered = parse_schedule(
        "s1.C1 s1.SEND1>r | s2.R3 s2.C2 s2.SEND2>r | r.C3 r.W3 r.RECV2<s2 r.C4 r.RECV1<s1 r.C5"
    )
    after = overlap(lowered)
    assert format_schedule(after) == (
        "s1.C1 s1.SEND1>r@comm | s2.R3 s2.C2 s2.SEND2>r@comm"
        " | r.C3 r.W3 r.RECV2<s2@comm r.RECV1<s1@comm r.C4 r.C5"
    )
    assert_overlap_ok(lowered, after)


def test_a_deadlocked_schedule_only_moves_to_the_comm_stream() -> None:
    stuck = parse_schedule("a.C1 a.SEND1>b a.RECV2<b | b.C2 b.SEND2>a b.RECV1<a")
    assert format_schedule(overlap(stuck)) == (
        "a.C1 a.SEND1>b@comm a.RECV2<b@comm | b.C2 b.SEND2>a@comm b.RECV1<a@comm"
    )


def test_collectives_go_to_the_comm_stream_and_recvs_stay_after_them() -> None:
    # b.RECV6<c stays after the collective though c is no member: one comm stream runs both
    lowered = parse_schedule(
        "a.R1 a.C2 a.COLL3[a,b] a.W4 a.C7 a.SEND7>b | b.C5 b.COLL3[a,b] b.RECV6<c b.RECV7<a | c.C6 c.SEND6>b"
    )
    after = overlap(lowered)
    assert format_schedule(after) == (
        "a.R1 a.C2 a.COLL3[a,b]@comm a.W4 a.C7 a.SEND7>b@comm"
        " | b.C5 b.COLL3[a,b]@comm b.RECV6<c@comm b.RECV7<a@comm | c.C6 c.SEND6>b@comm"
    )
    assert_overlap_ok(lowered, after)
