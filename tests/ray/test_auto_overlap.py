"""overlap_gpu_communication="auto" on Ray: the graph records its first executions, decides,
and every actor runs the choice from one execution on, with results right throughout."""

from __future__ import annotations

import pytest
import ray
import torch

import cgraph
from cgraph import TorchTensorType
from cgraph.runtime import switches
from cgraph.runtime.auto_overlap import WITH, WITHOUT, AutoOverlap
from cgraph.scheduler.decide import Decision
from cgraph.scheduler.simulate import Machine

pytestmark = pytest.mark.usefixtures("no_leaks")


@ray.remote(num_cpus=0)
class Sender:
    def send(self, x: int) -> torch.Tensor:
        return torch.full((64, 64), float(x))


@ray.remote(num_cpus=0)
class Receiver:
    def recv(self, t: torch.Tensor) -> float:
        return float(t[0, 0])

    def constant(self) -> int:
        return 7


@pytest.fixture(scope="module")
def seed(ray_session):
    """The overlap seed's shape: three senders, one receiver, tensor edges on the CPU communicator."""
    senders, receiver = [Sender.remote() for _ in range(3)], Receiver.remote()
    with cgraph.InputNode() as inp:
        dag = cgraph.MultiOutputNode([receiver.recv.bind(s.send.bind(inp).with_type_hint(
            TorchTensorType(transport="nccl"))) for s in senders])
    yield dag
    for actor in (*senders, receiver):
        ray.kill(actor)


def switched_at(compiled) -> dict[str, int | None]:
    return {actor: ray.get(handle.__ray_call__.remote(switches.switched_at, compiled._tag, actor), timeout=30)
            for actor, handle in compiled._handles.items()}


def test_auto_decides_after_its_executions_and_every_actor_switches_at_one_boundary(seed):
    compiled = cgraph.compile(seed, overlap_gpu_communication="auto", default_communicator="cpu",
                              auto_executions=4)
    try:
        assert compiled.overlap_decision is None
        for i in range(4):
            assert compiled.execute(i).get(timeout=60) == [float(i)] * 3
        assert compiled.overlap_decision is None  # decides at the next execute
        for i in range(4, 10):
            assert compiled.execute(i).get(timeout=60) == [float(i)] * 3
        decision = compiled.overlap_decision
        assert decision is not None and set(decision.predicted) == {WITH, WITHOUT}
        assert decision.machine is Machine.SHARED_CORES and decision.cores and decision.durations
        assert "per execution" in str(decision)
        assert set(switched_at(compiled).values()) == {5}  # execution 4 ran on the old schedule
        chosen = compiled.planned.schedule if decision.choice == WITH else compiled.planned.before_overlap
        assert compiled.schedule == chosen
    finally:
        compiled.teardown()


def test_a_switch_to_the_other_schedule_with_executions_in_flight_keeps_every_value(seed, monkeypatch):
    def overlap_it(self, durations):  # the model's choice made for the test: the overlapped schedule
        return Decision(WITH, self.current, {WITH: 1.0, WITHOUT: 2.0}, Machine.OWN_ENGINE, None, 0.05,
                        dict(durations))

    monkeypatch.setattr(AutoOverlap, "choose", overlap_it)
    compiled = cgraph.compile(seed, overlap_gpu_communication="auto", default_communicator="cpu",
                              auto_executions=3)
    try:
        assert compiled.schedule == compiled.planned.before_overlap  # CPU actors start lowered
        got = [compiled.execute(i).get(timeout=60) for i in range(3)]
        refs = [compiled.execute(i) for i in range(3, 8)]  # the first decides; the rest in flight
        got += [ref.get(timeout=60) for ref in refs]
        got += [compiled.execute(i).get(timeout=60) for i in range(8, 12)]
        assert got == [[float(i)] * 3 for i in range(12)]
        assert compiled.overlap_decision is not None and compiled.overlap_decision.switches
        assert set(switched_at(compiled).values()) == {4}
        assert compiled.schedule == compiled.planned.schedule  # the overlapped one now
        assert any("@comm" in str(op) for ops in compiled.schedule.values() for op in ops)
        assert all(w.state == "waiting" for w in compiled.status())
    finally:
        compiled.teardown()


def test_auto_decides_under_execute_async_off_the_event_loop(seed, monkeypatch):
    import asyncio
    import threading

    compiled = cgraph.compile(seed, overlap_gpu_communication="auto", default_communicator="cpu",
                              auto_executions=2, enable_asyncio=True)
    deciders: list[str] = []
    choose = AutoOverlap.choose

    def spy(self, durations):
        deciders.append(threading.current_thread().name)
        return choose(self, durations)

    async def main() -> list[list[float]]:
        loop_thread = threading.current_thread().name
        got = []
        for i in range(5):
            futures = await compiled.execute_async(i)
            got.append(await futures)
        assert deciders and loop_thread not in deciders  # decided in a worker thread
        return got

    monkeypatch.setattr(AutoOverlap, "choose", spy)
    try:
        assert asyncio.run(main()) == [[float(i)] * 3 for i in range(5)]
        assert compiled.overlap_decision is not None
    finally:
        compiled.teardown()


def test_auto_refuses_a_method_that_does_not_wait_on_the_input(ray_session):
    receiver = Receiver.remote()
    try:
        with cgraph.InputNode() as inp:
            dag = cgraph.MultiOutputNode([receiver.recv.bind(inp), receiver.constant.bind()])
        with pytest.raises(cgraph.CompileError, match=r"needs every method to wait on the InputNode"):
            cgraph.compile(dag, overlap_gpu_communication="auto")
    finally:
        ray.kill(receiver)


def test_a_bad_overlap_setting_is_refused(seed):
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        cgraph.compile(seed, overlap_gpu_communication="sometimes")
    with pytest.raises(ValueError, match="auto_executions"):
        cgraph.compile(seed, overlap_gpu_communication="auto", auto_executions=0)


def test_with_executions_in_flight_auto_weighs_running_ahead_and_switches_to_it(seed, monkeypatch):
    """Over gloo, with four executions in flight, "auto" predicts three schedules for four
    at once, and (its choice forced, the durations being this VM's) every actor switches
    to receiving ahead at one boundary with every value right."""
    from dataclasses import replace

    from cgraph.scheduler.decide import AHEAD

    made: list[Decision] = []
    real = AutoOverlap.choose

    def run_ahead(self, durations):
        made.append(real(self, durations))
        return replace(made[-1], choice=AHEAD)

    monkeypatch.setattr(AutoOverlap, "choose", run_ahead)
    compiled = cgraph.compile(seed, overlap_gpu_communication="auto", default_communicator="gloo",
                              auto_executions=4, max_inflight_executions=4)
    try:
        got = []
        for start in range(0, 16, 4):  # four in flight at a time
            refs = [compiled.execute(i) for i in range(start, start + 4)]
            got += [ref.get(timeout=60) for ref in refs]
        assert got == [[float(i)] * 3 for i in range(16)]
        (decision,) = made
        assert set(decision.predicted) == {WITHOUT, WITH, AHEAD} and decision.executions == 4
        assert "4 executions in flight" in str(decision)
        assert len(set(switched_at(compiled).values())) == 1
        lane = " ".join(str(op) for op in compiled.schedule["d"])
        assert lane.startswith("d.RECV1<a@comm+1 d.RECV2<b@comm+1 d.RECV3<c@comm+1"), lane
    finally:
        compiled.teardown()
