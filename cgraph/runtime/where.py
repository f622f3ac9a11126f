"""Where each actor's loop is: the always-on record behind a timeout's message and ``status()``.

    actor (its loop)                          driver
    record = track(tag)                       status(): one Ray call per actor, beside the loop
    per op:  record[1] = position             report(tag) -> (execution, position, seconds)
             record[2] = perf_counter_ns()    describe: the op, its method or channel, and the
    per execution: record[0] += 1               actor and node at the channel's other end

    a (Worker, node 0): running f for 3.0 s (execution 1, op a.C1)
    b (Worker, node 0): waiting 3.0 s for a's value on channel n1 (execution 1, op b.R1)

The loop writes two list items per op (the op's position and a clock read) and one per
execution: about 0.1 us an op on an idle VM, against a budget of 1 us
(``benchmarks/bench_where.py``, ``benchmarks/results/where.md``). Nothing is
sent anywhere: the driver asks when a ``get`` timed out or when ``status()`` is called,
through ``__ray_call__``, which Ray runs beside the loop (the loop holds its own
concurrency group). Across nodes it is the same call.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cgraph._boundary import ActorHandle
from cgraph.scheduler.channels import ChannelSpec
from cgraph.scheduler.ops import Op, OpKind

ENDED = -2
"""The record's position once the loop has returned."""

_RECORDS: OrderedDict[str, list[int]] = OrderedDict()  # graph tag -> [execution, position, since_ns]
_LOCK = threading.Lock()
_KEEP = 16
"""Records of this many graphs are kept per process (an actor may outlive its graphs)."""

ASK_TIMEOUT_S = 2.0
"""How long ``status()`` waits for each actor's answer (a dead or wedged one says so)."""


def track(tag: str) -> list[int]:
    """Actor side: the record the loop of graph ``tag`` keeps up to date."""
    record = [0, -1, time.perf_counter_ns()]
    with _LOCK:
        _RECORDS[tag] = record
        while len(_RECORDS) > _KEEP:
            _RECORDS.popitem(last=False)
    return record


def report(_instance: object, tag: str) -> tuple[int, int, float] | None:
    """Run in an actor (``__ray_call__``): (execution, op position, seconds there) of the
    loop of graph ``tag``; None if this process runs none."""
    record = _RECORDS.get(tag)
    if record is None:
        return None
    execution, position, since = record
    return execution, position, (time.perf_counter_ns() - since) / 1e9


@dataclass(frozen=True)
class ActorWhere:
    """Where one actor's loop is (``CompiledGraph.status()``)."""

    actor: str  # the graph's actor id ("a", "b", ...)
    label: str  # "a (Worker, node 0)"
    execution: int | None  # None: no answer
    op: str  # "a.C1", "" when unknown
    state: str  # "running", "waiting", "ended", "no answer"
    seconds: float | None
    detail: str  # what it runs or waits for

    def __str__(self) -> str:
        if self.execution is None:
            return f"{self.label}: {self.detail}"
        if self.state == "ended":
            return f"{self.label}: its loop has ended (after execution {self.execution - 1})"
        return f"{self.label}: {self.detail} (execution {self.execution}, op {self.op})"


class GraphStatus(tuple[ActorWhere, ...]):
    """Every actor's ``ActorWhere``; prints as a table, one actor a line."""

    __slots__ = ()

    def __str__(self) -> str:
        rows = [("actor", "execution", "op", "state", "for", "what")]
        for w in self:
            seconds = "" if w.seconds is None else f"{w.seconds:.1f} s"
            rows.append((w.label, "" if w.execution is None else str(w.execution), w.op, w.state, seconds, w.detail))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True))
                         + "  " + row[5] for row in rows)

    def line(self) -> str:
        """One line: each actor's sentence, joined by "; " (a timeout's message)."""
        return "; ".join(map(str, self))


class Describer:
    """Driver side: the sentences of the records, from the schedule and the channel plan."""

    def __init__(self, schedule: Mapping[str, Sequence[Op]], channels: Sequence[ChannelSpec],
                 methods: Mapping[str, str], labels: Mapping[str, str]) -> None:
        self._schedule, self._methods, self._labels = schedule, methods, labels
        self._by_reader = {(reader, c.node): c for c in channels for reader in c.readers}
        self._by_writer: dict[tuple[str, str], list[ChannelSpec]] = {}
        for c in channels:  # a value may leave on several channels (shm here, a socket to a node)
            self._by_writer.setdefault((c.writer, c.node), []).append(c)

    def describe(self, actor: str, answer: tuple[int, int, float] | None | BaseException) -> ActorWhere:
        label = self._labels.get(actor, actor)
        if answer is None or isinstance(answer, BaseException):
            why = "no answer (dead, or its process is stuck)" if answer is not None else "runs no loop of this graph"
            return ActorWhere(actor, label, None, "", "no answer", None, why)
        execution, position, seconds = answer
        ops = self._schedule.get(actor, ())
        if position == ENDED:
            return ActorWhere(actor, label, execution, "", "ended", None, "its loop has ended")
        if not 0 <= position < len(ops):
            return ActorWhere(actor, label, execution, "", "waiting", seconds,
                              f"starting execution {execution} for {seconds:.1f} s")
        op = ops[position]
        state, what = self._sentence(actor, op, seconds)
        return ActorWhere(actor, label, execution, str(op), state, seconds, what)

    def _sentence(self, actor: str, op: Op, seconds: float) -> tuple[str, str]:
        for_s = f"{seconds:.1f} s"
        if op.kind is OpKind.COMPUTE:
            return "running", f"running {self._methods.get(op.node, op.node)} for {for_s}"
        if op.kind is OpKind.READ:
            channel = self._by_reader.get((actor, op.node))
            writer = channel.writer if channel is not None else "?"
            return "waiting", (f"waiting {for_s} for {self._name(writer)}'s value on channel "
                               f"{channel.id if channel is not None else op.node}")
        if op.kind is OpKind.WRITE:
            out = self._by_writer.get((actor, op.node), [])
            ids = ", ".join(c.id for c in out) or op.node
            readers = ", ".join(self._name(r) for c in out for r in c.readers) or "?"
            return "waiting", f"writing {op.node} for {for_s}: channel {ids} waits for room (read by {readers})"
        if op.kind is OpKind.SEND:
            return "waiting", f"sending {op.node} to {self._name(op.peer)} for {for_s}"
        if op.kind is OpKind.RECV:
            return "waiting", f"waiting {for_s} for {self._name(op.peer)}'s {op.node} (communicator receive)"
        peers = ", ".join(self._name(p) for p in op.peers)
        return "waiting", f"in collective {self._methods.get(op.node, op.node)} with {peers} for {for_s}"

    def _name(self, actor: str) -> str:
        return "the driver" if actor == "driver" else actor


def ask(handles: Mapping[str, ActorHandle], tag: str, timeout_s: float = ASK_TIMEOUT_S
        ) -> dict[str, tuple[int, int, float] | None | BaseException]:
    """Each actor's ``report`` of graph ``tag``, in parallel, waiting at most ``timeout_s``."""
    import ray

    refs = {actor: h.__ray_call__.remote(report, tag) for actor, h in handles.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    answers: dict[str, tuple[int, int, float] | None | BaseException] = {}
    for actor, ref in refs.items():
        if ref not in done:
            answers[actor] = TimeoutError("no answer")
            continue
        try:
            answers[actor] = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a dead actor is an answer too
            answers[actor] = exc
    return answers
