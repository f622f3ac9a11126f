"""decide (overlap="auto"'s choice) and simulate's shared-core count.

The choice is never predicted slower than any candidate by more than the threshold, it
is the fastest whenever it leaves the current schedule, and on a machine whose actors
share fewer cores than they are, overlap that gains with a core each can lose."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.ir import Graph, parse_graph
from cgraph.scheduler import lower, overlap, plan_channels
from cgraph.scheduler.ahead import in_execution_order, run_ahead
from cgraph.scheduler.decide import THRESHOLD, decide, machine_for
from cgraph.scheduler.simulate import Machine, compute_reads, op_key, simulate, simulate_executions
from tests.unit.graph_strategies import graphs
from tests.unit.test_ahead import PIPE
from tests.unit.test_scheduler_simulate import SEED, SEED_TIMES

pytestmark = pytest.mark.slow  # left out of `make test-fast`

OWN, SHARED = Machine.OWN_ENGINE, Machine.SHARED_CORES


def candidates(graph: Graph, ahead: bool = False) -> dict[str, dict]:
    lowered = lower(graph, plan_channels(graph, default_communicator="cpu"))
    out = {"no overlap": lowered, "overlap": overlap(lowered)}
    if ahead:  # every leading receive, as over gloo or NCCL
        out["ahead"] = run_ahead(out["overlap"])
    return out


def test_shared_cores_serialize_the_actors_beyond_the_core_count() -> None:
    schedules = candidates(SEED)
    lowered, reads = schedules["no overlap"], compute_reads(SEED)
    one_each = simulate(lowered, SEED_TIMES, machine=SHARED, reads=reads).makespan
    on_one = simulate(lowered, SEED_TIMES, machine=SHARED, reads=reads, cores=1).makespan
    assert on_one == sum(SEED_TIMES.values()) - 15  # every op in turn; a pair runs once (3 x 5 saved)
    assert one_each < on_one
    assert simulate(lowered, SEED_TIMES, machine=SHARED, reads=reads, cores=4).makespan == one_each
    assert simulate(lowered, SEED_TIMES, machine=OWN, reads=reads, cores=1).makespan == \
        simulate(lowered, SEED_TIMES, machine=OWN, reads=reads).makespan  # engines are not cores
    with pytest.raises(ValueError, match="at least one core"):
        simulate(lowered, SEED_TIMES, machine=SHARED, cores=0)


def test_the_seed_overlaps_on_a_gpu_and_not_on_two_shared_cores() -> None:
    schedules, reads = candidates(SEED), compute_reads(SEED)
    on_gpu = decide(schedules, SEED_TIMES, current="no overlap", machine=OWN, reads=reads)
    assert on_gpu.choice == "overlap" and on_gpu.switches
    assert on_gpu.predicted["overlap"] < on_gpu.predicted["no overlap"] * (1 - THRESHOLD)
    on_cpu = decide(schedules, SEED_TIMES, current="overlap", machine=SHARED, cores=2, reads=reads)
    assert on_cpu.predicted["overlap"] >= on_cpu.predicted["no overlap"] * (1 - THRESHOLD)
    assert "predicted" in str(on_gpu) and "comm on its own engine" in str(on_gpu)
    assert "on 2 shared core(s)" in str(on_cpu)


def test_running_ahead_is_chosen_only_with_several_executions_in_flight() -> None:
    """A pipeline whose second stage computes as long as a value takes to cross: with
    executions one at a time running ahead predicts nothing more than the overlap; with
    four in flight it is chosen."""
    graph = parse_graph(PIPE)
    schedules, reads = candidates(graph, ahead=True), compute_reads(graph)
    times = {"a.C1": 0.2, "a.SEND1>b": 1.0, "b.C2": 1.0}
    one = decide(schedules, times, current="overlap", machine=OWN, reads=reads)
    assert one.choice == "overlap" and one.predicted["ahead"] == one.predicted["overlap"]
    assert one.predicted["no overlap"] == one.predicted["overlap"]  # one execution: nothing to overlap
    four = decide(schedules, times, current="no overlap", machine=OWN, reads=reads, executions=4)
    assert four.choice == "ahead" and four.predicted["ahead"] < 0.8 * four.predicted["overlap"]
    assert "4 executions in flight" in str(four)
    with pytest.raises(ValueError, match="at least one"):
        decide(schedules, times, current="overlap", machine=OWN, executions=0)


def test_bad_arguments_are_refused() -> None:
    schedules = candidates(SEED)
    with pytest.raises(ValueError, match="none of the candidates"):
        decide(schedules, SEED_TIMES, current="auto", machine=OWN)
    with pytest.raises(ValueError, match="threshold"):
        decide(schedules, SEED_TIMES, current="overlap", machine=OWN, threshold=1.5)


def test_the_model_follows_the_actors() -> None:
    assert machine_for(True, 2) == (OWN, None)
    assert machine_for(False, 2) == (SHARED, 2)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_actors=4, max_steps=14, transports=("nccl", "auto")), st.integers(0, 2**32),
       st.sampled_from([(OWN, None), (SHARED, None), (SHARED, 1), (SHARED, 2)]),
       st.sampled_from(["no overlap", "overlap", "ahead"]), st.sampled_from([1, 2, 4]))
def test_the_choice_is_never_predicted_slower_than_a_fixed_schedule(graph: Graph, seed: int, model, current: str,
                                                                    executions: int) -> None:
    """Over the three candidates, one execution or several in flight."""
    schedules, reads = candidates(graph, ahead=True), compute_reads(graph)
    rng = random.Random(seed)
    times = {op_key(op): rng.choice([0, 1, 2, 5, 10, 20]) for ops in schedules["no overlap"].values() for op in ops}
    machine, cores = model
    got = decide(schedules, times, current=current, machine=machine, cores=cores, reads=reads, executions=executions)
    best = min(got.predicted.values())
    for name, schedule in schedules.items():  # the predictions are the simulator's, on the same model
        want = (simulate(in_execution_order(schedule), times, machine=machine, reads=reads, cores=cores).makespan
                if executions == 1
                else simulate_executions(schedule, times, executions, machine=machine, reads=reads,
                                         cores=cores).makespan / executions)
        assert got.predicted[name] == pytest.approx(want)
    if executions == 1:  # one at a time, running ahead is the overlapped schedule
        assert got.predicted["ahead"] == pytest.approx(got.predicted["overlap"])
    assert got.predicted[got.choice] <= best / (1 - THRESHOLD) + 1e-9
    if got.switches:
        assert got.predicted[got.choice] == best
        assert got.predicted[got.choice] <= got.predicted[current] * (1 - THRESHOLD) + 1e-9
