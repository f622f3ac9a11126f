"""simulate: exact makespans of hand-computed schedules on both machine models, and the
overlap pass never predicted slower than the lowered schedule on random DAGs."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.errors import DeadlockError
from cgraph.ir import Graph, parse_graph
from cgraph.scheduler import lower, overlap, parse_schedule, plan_channels
from cgraph.scheduler.simulate import Machine, compute_reads, critical_path, op_key, simulate
from tests.unit.graph_strategies import graphs

pytestmark = pytest.mark.slow  # left out of `make test-fast`

OWN, SHARED = Machine.OWN_ENGINE, Machine.SHARED_CORES

SEED = parse_graph(
    """
    actor s1 = W(gpus=1)
    actor s2 = W(gpus=1)
    actor s3 = W(gpus=1)
    actor r = W(gpus=1)
    n0 = input
    n1 = s1.send(n0) :nccl
    n2 = s2.send(n0) :nccl
    n3 = s3.send(n0) :nccl
    n4 = r.recv(n1)
    n5 = r.recv(n2)
    n6 = r.recv(n3)
    return [n4, n5, n6]
    """
)
SEED_TIMES = {"s1.C1": 10, "s2.C2": 10, "s3.C3": 10, "r.C4": 20, "r.C5": 20, "r.C6": 20,
              **{f"s{i}.SEND{i}>r": 5 for i in (1, 2, 3)}, **{f"r.RECV{i}<s{i}": 5 for i in (1, 2, 3)}}


def spans(prediction, actor: str) -> list[tuple[str, float, float]]:
    return [(str(s.op), s.start, s.end) for s in prediction.tracks[actor]]


def test_a_chain_adds_up() -> None:
    chain = parse_schedule("a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2")
    times = {"a.R0": 1, "a.C1": 10, "a.W1": 2, "b.R1": 1, "b.C2": 10, "b.W2": 2}
    for machine in Machine:
        prediction = simulate(chain, times, machine=machine)
        assert prediction.makespan == 26
        assert spans(prediction, "b") == [("b.R1", 13, 14), ("b.C2", 14, 24), ("b.W2", 24, 26)]


def test_a_fan_in_waits_for_its_slowest_input() -> None:
    fan_in = parse_schedule("a.R0 a.C1 a.W1 | b.R0 b.C2 b.W2 | c.R1 c.R2 c.C3 c.W3")
    times = {"a.C1": 4, "b.C2": 9, "c.R1": 1, "c.R2": 1, "c.C3": 3, "c.W3": 1}
    prediction = simulate(fan_in, times)
    assert spans(prediction, "c") == [("c.R1", 4, 5), ("c.R2", 9, 10), ("c.C3", 10, 13), ("c.W3", 13, 14)]
    assert prediction.makespan == 14


def test_the_seed_lowered_runs_each_receive_after_the_last_compute() -> None:
    lowered = lower(SEED, plan_channels(SEED))
    for machine in Machine:
        prediction = simulate(lowered, SEED_TIMES, machine=machine, reads=compute_reads(SEED))
        assert prediction.makespan == 85  # 10 + (5 + 20) * 3
        assert [s.start for s in prediction.tracks["r"]][:4] == [10, 15, 35, 35]  # RECV1 C4 W4 RECV2


def test_the_seed_overlapped_gains_only_with_its_own_comm_engine() -> None:
    overlapped = overlap(lower(SEED, plan_channels(SEED)))
    reads = compute_reads(SEED)
    own = simulate(overlapped, SEED_TIMES, machine=OWN, reads=reads)
    # receives 10-15, 15-20, 20-25 on the engine; computes back to back from 15
    assert spans(own, "r") == [
        ("r.RECV1<s1@comm", 10, 15), ("r.RECV2<s2@comm", 15, 20), ("r.RECV3<s3@comm", 20, 25),
        ("r.C4", 15, 35), ("r.W4", 35, 35), ("r.C5", 35, 55), ("r.W5", 55, 55), ("r.C6", 55, 75), ("r.W6", 75, 75)]
    assert own.makespan == 75
    # sharing r's core, the receives take their turns between computes: no gain
    assert simulate(overlapped, SEED_TIMES, machine=SHARED, reads=reads).makespan == 85
    # without knowing what each compute reads, every compute waits for every receive before it
    assert simulate(overlapped, SEED_TIMES, machine=OWN).makespan == 85


def test_a_pair_takes_its_sends_time_and_a_collective_its_shortest_members() -> None:
    pair = parse_schedule("a.C1 a.SEND1>b | b.RECV1<a b.C2")
    assert simulate(pair, {"a.C1": 3, "a.SEND1>b": 8, "b.RECV1<a": 2, "b.C2": 1}).makespan == 12
    assert simulate(pair, {"a.C1": 3, "b.RECV1<a": 2, "b.C2": 1}).makespan == 6
    coll = parse_schedule("a.C1 a.COLL3[a,b] | b.C2 b.COLL3[a,b]")
    prediction = simulate(coll, {"a.C1": 1, "b.C2": 4, "a.COLL3[a,b]": 2, "b.COLL3[a,b]": 2})
    assert spans(prediction, "a")[1] == ("a.COLL3[a,b]", 4, 6)


def test_missing_durations_take_the_default_and_a_deadlock_raises() -> None:
    assert simulate(parse_schedule("a.C1 a.C2"), {"a.C1": 1}, default=0.5).makespan == 1.5
    with pytest.raises(DeadlockError, match="a.SEND1>b"):
        simulate(parse_schedule("a.SEND1>b a.RECV2<b | b.SEND2>a b.RECV1<a"), {})


def test_op_key_drops_the_stream() -> None:
    (op,) = parse_schedule("r.RECV1<s1@comm")["r"]
    assert op_key(op) == "r.RECV1<s1"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_actors=4, max_steps=16, transports=("nccl", "auto")), st.integers(0, 2**32))
def test_overlap_is_never_predicted_slower_on_its_own_engine(graph: Graph, seed: int) -> None:
    lowered = lower(graph, plan_channels(graph, default_communicator="cpu"))
    overlapped = overlap(lowered)
    rng = random.Random(seed)
    times = {op_key(op): rng.choice([0, 1, 2, 5, 10, 20]) for ops in lowered.values() for op in ops}
    reads = compute_reads(graph)
    before = simulate(lowered, times, machine=OWN, reads=reads).makespan
    after = simulate(overlapped, times, machine=OWN, reads=reads).makespan
    assert after <= before, (before, after)


def test_the_critical_path_of_the_seed() -> None:
    lowered = lower(SEED, plan_channels(SEED))
    overlapped = overlap(lowered)
    reads = compute_reads(SEED)
    prediction = simulate(overlapped, SEED_TIMES, reads=reads)
    # s1's compute, the first transfer, then the receiver's computes back to back
    assert critical_path(overlapped, prediction.times(), reads=reads) == [
        "s1.R0", "s1.C1", "r.RECV1<s1", "r.C4", "r.W4", "r.C5", "r.W5", "r.C6", "r.W6"]
    prediction = simulate(lowered, SEED_TIMES, reads=reads)
    assert critical_path(lowered, prediction.times(), reads=reads) == [
        "s1.R0", "s1.C1", "r.RECV1<s1", "r.C4", "r.W4", "r.RECV2<s2", "r.C5", "r.W5", "r.RECV3<s3", "r.C6", "r.W6"]


def test_a_critical_path_from_recorded_times_crosses_a_channel() -> None:
    chain = parse_schedule("a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2")
    # b's READ started early and waited for a's WRITE; recorded clocks are 1 off
    times = {"a.R0": (0, 1), "a.C1": (1, 9), "a.W1": (9, 10), "b.R1": (2, 10.5), "b.C2": (10.5, 20),
             "b.W2": (20, 21)}
    assert critical_path(chain, times, slack=1) == ["a.R0", "a.C1", "a.W1", "b.R1", "b.C2", "b.W2"]
    assert critical_path(chain, {}) == []
