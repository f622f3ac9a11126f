"""Choosing between schedules from measured op durations: the decision behind overlap="auto".

    decide(schedules, durations, current="no overlap", machine=..., cores=...) -> Decision

Each candidate schedule (the lowered one and the overlapped one, say) is simulated on
one machine model (``simulate.py``) with the same op durations, recorded by the graph's
first executions. The graph moves to the candidate predicted fastest only if it is
predicted at least ``threshold`` (5%) faster than the schedule it runs now: a smaller
gain is within what one run's noise moves, and each switch costs the actors a pause at
an execution boundary. So the choice is never predicted slower than any candidate by
more than ``threshold``, and it is the fastest whenever it differs from ``current``.

Which model fits an actor: a GPU actor's comm stream is its own engine (the copy
engines and NCCL's kernels run beside compute), so ``OWN_ENGINE``; a CPU actor's comm
thread takes a core like its loop, so ``SHARED_CORES`` with the cores its node gives
the graph's actors (``machine_for``). Pure: no Ray, no clocks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from cgraph.scheduler.ahead import in_execution_order
from cgraph.scheduler.ops import NodeId, Schedule
from cgraph.scheduler.simulate import Machine, simulate, simulate_executions

THRESHOLD = 0.05
WITHOUT, WITH, AHEAD = "without overlap", "with overlap", "with overlap, running ahead"
MODES = (WITHOUT, WITH)
"""The two candidates' names: the lowered schedule and the overlapped one (``AHEAD``:
the overlapped one with receives run ahead, ``ahead.py``, a third where it differs)."""


@dataclass(frozen=True)
class Decision:
    """What was chosen, from what predictions, on which model and durations."""

    choice: str
    current: str
    predicted: dict[str, float]  # time per execution per candidate, in the durations' unit
    machine: Machine
    cores: int | None
    threshold: float
    durations: dict[str, float]
    executions: int = 1  # in flight at once in the prediction (the most the driver had)

    @property
    def switches(self) -> bool:
        return self.choice != self.current

    def __str__(self) -> str:
        others = ", ".join(f"{name} {ms * 1e3:.3g} ms" for name, ms in self.predicted.items() if name != self.choice)
        cores = f" on {self.cores} shared core(s)" if self.cores else ""
        cores += f", {self.executions} executions in flight" if self.executions > 1 else ""
        why = (f"predicted at least {self.threshold:.0%} faster" if self.switches
               else f"kept: nothing predicted {self.threshold:.0%} faster")
        return (f"{self.choice}: predicted {self.predicted[self.choice] * 1e3:.3g} ms per execution "
                f"({others}) with {self.machine.value}{cores}; {why}")


def decide(schedules: Mapping[str, Schedule], durations: Mapping[str, float], *, current: str,
           machine: Machine, cores: int | None = None,
           reads: Mapping[NodeId, Collection[NodeId]] | None = None,
           threshold: float = THRESHOLD, executions: int = 1) -> Decision:
    """The schedule to run from now on (module docstring).

    ``executions``: how many executions the user keeps in flight. With one, each
    candidate's prediction is one execution's makespan; with k, the time per execution
    of k in flight at once (``simulate_executions``), where a schedule that runs receives
    ahead can gain.

    Raises:
        ValueError: ``current`` is not among ``schedules``, or ``threshold`` is not in [0, 1).
        DeadlockError: a candidate cannot finish.
    """
    if current not in schedules:
        raise ValueError(f"current={current!r} is none of the candidates {sorted(schedules)}")
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold={threshold}: use a fraction in [0, 1)")
    if executions < 1:
        raise ValueError(f"executions={executions}: at least one is in flight")
    if executions == 1:
        predicted = {name: simulate(in_execution_order(schedule), durations, machine=machine, reads=reads,
                                    cores=cores).makespan
                     for name, schedule in schedules.items()}
    else:
        predicted = {name: simulate_executions(schedule, durations, executions, machine=machine, reads=reads,
                                               cores=cores).makespan / executions
                     for name, schedule in schedules.items()}
    best = min(predicted, key=lambda name: (predicted[name], name != current))
    choice = best if predicted[best] <= predicted[current] * (1.0 - threshold) else current
    return Decision(choice, current, predicted, machine, cores, threshold, dict(durations), executions)


def machine_for(gpu_actors: bool, shared_cores: int | None) -> tuple[Machine, int | None]:
    """The model for a graph's actors: GPUs' comm streams are their own engines; CPU
    actors share ``shared_cores`` cores (None: one each)."""
    return (Machine.OWN_ENGINE, None) if gpu_actors else (Machine.SHARED_CORES, shared_cores)
