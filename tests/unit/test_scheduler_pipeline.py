"""plan_schedule: the pass list, checks, dumps, errors; and package-level rules
(per-kind tables complete, no ray/torch import, module and function size)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cgraph.scheduler as scheduler
from cgraph.errors import DeadlockError, TransportError
from cgraph.ir import parse_graph
from cgraph.scheduler import PASSES, ChannelKind, OpKind, Planned, format_schedule, plan_schedule

SEED = parse_graph(
    """
    actor s1 = W(gpus=1)
    actor s2 = W(gpus=1)
    actor r = W(gpus=1)
    n0 = input
    n1 = s1.send(n0) :nccl
    n2 = s2.send(n0) :nccl
    n3 = r.recv(n1)
    n4 = r.recv(n2)
    return [n3, n4]
    """
)
LOWERED = "s1.R0 s1.C1 s1.SEND1>r | s2.R0 s2.C2 s2.SEND2>r | r.RECV1<s1 r.C3 r.W3 r.RECV2<s2 r.C4 r.W4"
OVERLAPPED = (
    "s1.R0 s1.C1 s1.SEND1>r@comm | s2.R0 s2.C2 s2.SEND2>r@comm"
    " | r.RECV1<s1@comm r.RECV2<s2@comm r.C3 r.W3 r.C4 r.W4"
)


def test_without_overlap_only_lower_runs() -> None:
    planned = plan_schedule(SEED)
    assert isinstance(planned, Planned) and planned.graph is SEED
    assert format_schedule(planned.schedule) == LOWERED
    assert planned.before_overlap is None
    assert [name for name, _ in planned.passes] == ["lower"]


def test_with_overlap_both_passes_run_and_are_kept() -> None:
    planned = plan_schedule(SEED, overlap=True)
    assert [name for name, _ in planned.passes] == ["lower", "overlap"]
    assert [name for name, _ in PASSES] == ["lower", "overlap", "ahead"]  # ahead only when asked
    assert format_schedule(planned.before_overlap or {}) == LOWERED
    assert format_schedule(planned.schedule) == OVERLAPPED
    assert planned.passes[-1][1] is planned.schedule


def test_dump_sees_the_text_after_each_pass() -> None:
    seen: list[tuple[str, str]] = []
    plan_schedule(SEED, overlap=True, dump=lambda name, text: seen.append((name, text)))
    assert [name for name, _ in seen] == ["plan_channels", "lower", "overlap"]
    assert seen[0][1].startswith("n0.shm = shm driver -> s1,s2 via shm")
    assert seen[1][1] == LOWERED and seen[2][1] == OVERLAPPED


def test_check_runs_verify_after_each_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = sys.modules["cgraph.scheduler.pipeline"]
    calls: list[str] = []
    monkeypatch.setattr(pipeline, "check_schedule", lambda graph, plan, schedule, name: calls.append(name))
    plan_schedule(SEED, overlap=True)
    assert calls == ["lower", "overlap"]
    calls.clear()
    plan_schedule(SEED, overlap=True, check=False)
    assert calls == []


def test_errors_come_through_with_their_evidence() -> None:
    # a.h is bound first but needs b.g, which needs a.f
    cycle = parse_graph(
        "actor a = W(gpus=0)\nactor b = W(gpus=0)\nn0 = input\nn1 = a.f(n0)\n"
        "n2 = b.g(n1)\nn3 = a.h(n2) order=0\nreturn n3"
    )
    with pytest.raises(DeadlockError) as err:
        plan_schedule(cycle, check=False)
    assert [str(op) for op in err.value.evidence.cycle] == ["a.R2", "b.R1"]
    cpu = parse_graph("actor a = W(gpus=0)\nactor b = W(gpus=0)\nn0 = input\nn1 = a.f(n0) :nccl\nn2 = b.g(n1)\nreturn n2")
    with pytest.raises(TransportError):
        plan_schedule(cpu)
    planned = plan_schedule(cpu, default_communicator="cpu")
    assert planned.plan.for_reader("n1", "b").transport == "cpu"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- package rules
def test_every_kind_has_a_row_in_every_table() -> None:
    deadlock = sys.modules["cgraph.scheduler.deadlock"]
    lower = sys.modules["cgraph.scheduler.lower"]
    verify = sys.modules["cgraph.scheduler.verify"]
    for table in (deadlock._STEPS, lower._NEEDS, verify._NODE_KINDS):
        assert set(table) == set(OpKind)
    assert set(deadlock._AWAITED) == {OpKind.READ, OpKind.SEND, OpKind.RECV, OpKind.COLLECTIVE}
    assert set(deadlock._AWAITED) == set(deadlock._ADVICE)
    assert set(lower._OBTAIN) == set(ChannelKind)


def test_the_scheduler_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, cgraph.scheduler\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch'))\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_public_names_are_exported() -> None:
    for name in scheduler.__all__:
        assert hasattr(scheduler, name), name

