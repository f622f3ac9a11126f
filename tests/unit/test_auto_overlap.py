"""overlap="auto"'s driver side without Ray: where it starts, when it decides, and the graphs
it refuses (a method that does not wait on the input could run past the switch)."""

from __future__ import annotations

import pytest

from cgraph.errors import CompileError
from cgraph.ir import parse_graph
from cgraph.runtime.auto_overlap import WITH, WITHOUT, AutoOverlap, check
from cgraph.runtime.options import CompileOptions
from cgraph.scheduler import plan_schedule
from cgraph.scheduler.simulate import op_key

CHAIN = """
actor a = W(gpus={gpus})
actor b = W(gpus={gpus})
n0 = input
n1 = a.f(n0) :nccl
n2 = b.g(n1)
return n2
"""


def start(gpus: int, executions: int = 3) -> AutoOverlap:
    graph = parse_graph(CHAIN.format(gpus=gpus))
    planned = plan_schedule(graph, overlap=True, default_communicator=None if gpus else "cpu")
    return AutoOverlap.start(graph, planned.before_overlap, planned.schedule, executions, keep_recording=False)


def test_gpu_actors_start_overlapped_and_cpu_actors_lowered() -> None:
    assert start(gpus=1).current == WITH
    assert start(gpus=0).current == WITHOUT


def test_it_decides_once_after_its_executions() -> None:
    auto = start(gpus=0, executions=3)
    assert not auto.due(2) and auto.due(3) and auto.due(10)
    durations = {op_key(op): 1.0 for ops in auto.schedule().values() for op in ops}
    decision = auto.choose(durations)
    assert decision.current == WITHOUT and set(decision.predicted) == {WITH, WITHOUT}
    auto.decision = decision
    assert not auto.due(10)


def test_a_method_that_does_not_wait_on_the_input_is_refused() -> None:
    graph = parse_graph("""
    actor a = W(gpus=0)
    n0 = input
    n1 = a.f(n0)
    n2 = a.g()
    return [n1, n2]
    """)
    with pytest.raises(CompileError, match=r"n2 = a.g does not"):
        check(graph)
    check(parse_graph(CHAIN.format(gpus=0)))  # every method waits on it


def test_the_option_takes_true_false_or_auto() -> None:
    assert CompileOptions(overlap_gpu_communication="auto").auto_executions == 5
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        CompileOptions(overlap_gpu_communication="yes")
    with pytest.raises(ValueError, match="auto_executions"):
        CompileOptions(auto_executions=0)
