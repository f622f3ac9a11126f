"""overlap="auto" on the driver: when to decide, what to decide, and asking every actor.

The graph starts with the schedule the static model prefers (GPU actors: the overlapped
one, which on their own engines is never predicted slower; CPU actors: the lowered one,
since overlap only pays where communication has an engine of its own). Its loops record
op events for the first ``auto_executions`` executions. Once the driver has read that
many results, the next ``execute`` fetches the records, takes each op's duration
(``visualize.explain.durations``), predicts both schedules on the model that fits the
actors (``scheduler.decide``: GPUs their own engines, CPU actors the cores of the
driver's node; as many executions in flight as the driver had: with several, the
overlapped schedule with receives run ahead is a third candidate) and asks every actor
to run the chosen one, and to stop recording unless
the user asked for a timeline, from the execution after the one it is about to submit
(``switches.py`` says why that boundary is the same on every actor). One ``execute``
pays for it: a Ray call per actor twice, and the simulation (milliseconds).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import ray

from cgraph._boundary import ActorHandle
from cgraph.errors import CompileError
from cgraph.ir import Graph, NodeKind
from cgraph.runtime import switches
from cgraph.scheduler.decide import AHEAD, WITH, WITHOUT, Decision, decide, machine_for
from cgraph.scheduler.ops import Schedule
from cgraph.scheduler.simulate import compute_reads

ASK_TIMEOUT_S = 60.0


@dataclass
class AutoOverlap:
    """One graph's "auto": its two schedules, the one running, and the decision once made."""

    graph: Graph
    schedules: dict[str, Schedule]
    current: str
    executions: int  # recorded and read before it decides
    keep_recording: bool  # the user asked for a timeline
    decision: Decision | None = None
    switch_at: int | None = None  # the first execution run on the chosen schedule
    in_flight: int = 1  # the most executions the driver had in flight before deciding

    @classmethod
    def start(cls, graph: Graph, lowered: Schedule, overlapped: Schedule, executions: int,
              keep_recording: bool, ahead: Schedule | None = None) -> AutoOverlap:
        """``ahead``: the overlapped schedule with receives run ahead, a third candidate where
        it differs (``scheduler/ahead.py``). Raises CompileError where a method does not
        wait on the input (see ``check``)."""
        check(graph)
        gpus = any(actor.gpus > 0 for actor in graph.actors)
        schedules = {WITHOUT: lowered, WITH: overlapped}
        if ahead is not None and ahead != overlapped:
            schedules[AHEAD] = ahead
        return cls(graph, schedules, WITH if gpus else WITHOUT, executions, keep_recording)

    def due(self, read: int) -> bool:
        """Whether to decide now, with ``read`` results read by the driver."""
        return self.decision is None and read >= self.executions

    def observe(self, in_flight: int) -> None:
        """The driver submits with ``in_flight`` executions in flight, this one counted: the
        predictions are for as many at once as the user had (running ahead pays only then)."""
        if in_flight > self.in_flight:
            self.in_flight = in_flight

    def choose(self, durations: Mapping[str, float]) -> Decision:
        machine, cores = machine_for(any(a.gpus > 0 for a in self.graph.actors), len(os.sched_getaffinity(0)))
        return decide(self.schedules, durations, current=self.current, machine=machine, cores=cores,
                      reads=compute_reads(self.graph), executions=self.in_flight)

    def apply(self, decision: Decision, handles: Mapping[str, ActorHandle], tag: str, at: int) -> None:
        """Ask every actor to run ``decision.choice`` from execution ``at`` on; returns once
        each has the request (before the driver writes execution ``at - 1``'s input).

        Raises:
            ray.exceptions.RayError: an actor did not take it (it died, say).
        """
        ray.get([handle.__ray_call__.remote(switches.request, tag, actor, at, decision.choice,
                                            self.keep_recording)
                 for actor, handle in handles.items()], timeout=ASK_TIMEOUT_S)
        self.decision, self.switch_at, self.current = decision, at, decision.choice

    def schedule(self) -> Schedule:
        return self.schedules[self.current]


def check(graph: Graph) -> None:
    """"auto" switches every actor at one execution boundary by holding back an execution's
    input; a method that does not wait on the input could run past it.

    Raises:
        CompileError: naming such methods.
    """
    inp = graph.input_node()
    reached: set[str] = set()
    if inp is not None:
        consumers = graph.consumers()
        todo = [inp.id]
        while todo:
            node = todo.pop()
            for nxt in consumers[node]:
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
    loose = [f"{node.id} = {node.actor}.{node.method}" for node in graph.nodes
             if node.kind is NodeKind.CALL and node.id not in reached]
    if loose:
        raise CompileError(
            f"overlap_gpu_communication='auto' needs every method to wait on the InputNode, and "
            f"{', '.join(loose)} does not: pass it a value that depends on the input, or choose "
            "overlap_gpu_communication=True or False")

