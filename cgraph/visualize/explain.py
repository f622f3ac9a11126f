"""What recorded executions say, in measured terms and next to the simulator's model.

    explain(tracks, planned) -> TimelineSummary
        per process      busy, idle, compute, comm, overlap fraction  (trace.summarize)
        makespan         an execution's measured span, from the driver's submission to
                         its last op, median
        critical_path    the ops that set the end of the median execution
        predicted        the simulator (scheduler.simulate) on the recorded op durations:
                         the schedule without and with the overlap pass, comm on its own
                         engine and comm sharing the actor's cores
        decision         what overlap="auto" chooses from them (scheduler.decide): on the
                         model that fits the actors (GPUs: their own engines; CPUs: the
                         ``cores`` their processes share)

Op durations for the model: a COMPUTE or WRITE takes its median; an op that can
block (READ, SEND, RECV, COLLECTIVE) its minimum, the sample that waited least
(a recorded READ or RECV includes its wait for the writer or sender). Pure
functions on plain data: no Ray, no clocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from cgraph.errors import GraphSyntaxError
from cgraph.scheduler.ahead import in_execution_order
from cgraph.scheduler.decide import MODES, Decision, decide, machine_for
from cgraph.scheduler.ops import parse_op
from cgraph.scheduler.overlap import overlap
from cgraph.scheduler.pipeline import Planned
from cgraph.scheduler.simulate import (
    BLOCKING,
    Machine,
    compute_reads,
    critical_path,
    op_key,
    simulate,
)
from cgraph.visualize.trace import Summary, Track, summarize


@dataclass(frozen=True)
class TimelineSummary(Mapping[str, Summary]):
    """Per process label its ``Summary``, plus the execution-wide measures (module docstring).

    ``critical_path``: (op, seconds) in order; ``predicted[(mode, machine)]``: seconds,
    ``mode`` one of ``MODES``. Times in seconds.
    """

    processes: dict[str, Summary]
    executions: int = 0
    makespan: float = 0.0
    critical_path: tuple[tuple[str, float], ...] = ()
    predicted: dict[tuple[str, Machine], float] = field(default_factory=dict)
    decision: Decision | None = None

    def __getitem__(self, label: str) -> Summary:
        return self.processes[label]

    def __iter__(self) -> Iterator[str]:
        return iter(self.processes)

    def __len__(self) -> int:
        return len(self.processes)

    def speedup(self, machine: Machine) -> float:
        """Predicted makespan without overlap over with it, on ``machine``."""
        with_overlap = self.predicted.get((MODES[1], machine), 0.0)
        return self.predicted.get((MODES[0], machine), 0.0) / with_overlap if with_overlap else 0.0

    def __str__(self) -> str:
        lines = [f"measured: an execution takes {self.makespan * 1e3:.2f} ms "
                 f"(median of {self.executions}, from its submission to its last op)"]
        lines += [f"  {label}: {summary}" for label, summary in self.processes.items() if label != "driver"]
        if self.critical_path:
            lines.append("  critical path: " + " > ".join(f"{op} {t * 1e3:.2f}" for op, t in self.critical_path)
                         + " (ms)")
        if self.predicted:
            lines.append("model (scheduler.simulate on these op durations, one execution):")
            for machine in Machine:
                times = "   ".join(f"{mode} {self.predicted[(mode, machine)] * 1e3:.2f} ms" for mode in MODES)
                lines.append(f"  {machine.value}: {times}   ({self.speedup(machine):.2f}x)")
        if self.decision is not None:
            lines.append(f"overlap_gpu_communication='auto' would run {self.decision}")
        return "\n".join(lines)


def explain(tracks: Iterable[Track], planned: Planned | None = None, cores: int | None = None) -> TimelineSummary:
    """The summary of recorded ``tracks`` of the graph ``planned`` (module docstring);
    ``cores``: how many cores the CPU actors' processes share (None: one each)."""
    rows = list(tracks)
    processes = summarize(rows)
    spans = executions(rows)
    if not spans:
        return TimelineSummary(processes)
    lengths = {index: max(e for _, e in times.values()) - min(s for s, _ in times.values())
               for index, times in spans.items()}
    median = statistics.median_low(lengths.values())
    index = next(i for i, length in lengths.items() if length == median)
    if planned is None:
        return TimelineSummary(processes, len(spans), median)
    reads = compute_reads(planned.graph)
    slack = 50e-6 + max(uncertainty for *_, uncertainty in rows) / 1e9
    passes = dict(planned.passes)  # one execution's view: receives run ahead in their execution
    path = critical_path(in_execution_order(planned.schedule), spans[index], reads=reads, slack=slack)
    table = durations(rows)
    lowered = passes["lower"]
    schedules = {MODES[0]: lowered, MODES[1]: passes["overlap"] if "overlap" in passes else overlap(lowered)}
    predicted = {(mode, machine): simulate(schedule, table, machine=machine, reads=reads).makespan
                 for mode, schedule in schedules.items() for machine in Machine}
    machine, shared = machine_for(any(actor.gpus > 0 for actor in planned.graph.actors), cores)
    decision = decide(schedules, table, current=MODES[1] if planned.before_overlap else MODES[0],
                      machine=machine, cores=shared, reads=reads)
    return TimelineSummary(processes, len(spans), median,
                           tuple((op, spans[index][op][1] - spans[index][op][0]) for op in path), predicted,
                           decision)


def executions(tracks: Iterable[Track]) -> dict[int, dict[str, tuple[float, float]]]:
    """Per execution that every actor recorded, each op's (start, end) in seconds on the
    driver's axis, keyed by ``op_key`` (the driver's events and compute waits left out).
    No op starts before the driver submitted its execution: a loop that waits for the
    input in a READ is idle until then, so the READ starts there."""
    out: dict[int, dict[str, tuple[float, float]]] = {}
    recorded: dict[str, set[int]] = {}
    for actor, key, execution, start, end in _events(tracks):
        if actor != "driver":
            recorded.setdefault(actor, set()).add(execution)
            out.setdefault(execution, {})[key] = (start, end)
    complete = set.intersection(*recorded.values()) if recorded else set()
    return {index: times for index, times in out.items() if index in complete}


def durations(tracks: Iterable[Track]) -> dict[str, float]:
    """Seconds per op (``op_key``) for the simulator (module docstring)."""
    samples: dict[str, list[float]] = {}
    for actor, key, _, start, end in _events(tracks):
        if actor != "driver":
            samples.setdefault(key, []).append(end - start)
    return {key: (min(values) if parse_op(key).kind in BLOCKING else statistics.median(values))
            for key, values in samples.items()}


def _events(tracks: Iterable[Track]) -> list[tuple[str, str, int, float, float]]:
    """(actor, op key or the driver's text, execution, start, end): seconds on the driver's
    axis, an actor's op starting no earlier than its execution's submission ended."""
    rows = list(tracks)
    submitted = {index: end for actor, _, events, _, _ in rows if actor == "driver"
                 for text, _, index, _, end, *_ in events if text == "execute"}
    out = []
    for actor, _, events, offset, _ in rows:
        for text, _, execution, start, end, *_ in events:
            key = text if actor == "driver" else _key(text)
            if key is not None:
                begin = max(start - offset, submitted.get(execution, start - offset) if actor != "driver" else 0)
                out.append((actor, key, execution, begin / 1e9, max(begin, end - offset) / 1e9))
    return out


def _key(text: str) -> str | None:
    try:
        return op_key(parse_op(text))
    except GraphSyntaxError:
        return None  # a compute's "wait a.C3"
