"""Run one compiled graph of the fault soak under a watchdog, with one fault injected.

    Injector(kind, ...) ─ armed at execution k ─► a timer thread: SIGKILL / SIGSTOP..SIGCONT /
                                                   compiled.teardown() from another thread
    run_executions(compiled, spec, ...) ─► one Outcome per execution:
        ok          the right value (or the armed user exception, as cgraph.TaskError), or
                    "dropped": its ref deleted unread
        error       a typed cgraph error the fault explains (ActorDiedError after the kill,
                    GraphTornDownError after the teardown)
        wrong       a wrong value, an untyped exception, or a typed error the fault does
                    not explain (e.g. a TaskError nobody raised, an error before the fault)
        hang        a call that did not return within its timeout plus slack (watchdog),
                    or an execution still timing out long after the fault ended
        skipped     not submitted: an earlier execute() raised (the graph had failed)

Every ``execute`` and ``get`` runs in a watchdog thread (``guarded``); ``get`` waits
``timeout`` at a time and is retried after ``cgraph.TimeoutError`` (the ref stays
readable) until the execution's deadline.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from common import CallTimeout, call_with_timeout
from soak_dag import FAILED, DagSpec, expected, make_input, same

import cgraph

SLACK_S = 10.0  # a get may outlast its timeout by this much: the monitor's death grace + polls
TERMINAL = (cgraph.ActorDiedError, cgraph.ChannelClosedError, cgraph.GraphTornDownError)
EXPLAINED = {  # fault -> the typed errors it may cause (besides cgraph.TimeoutError, retried)
    "kill9": (cgraph.ActorDiedError, cgraph.ChannelClosedError),
    "teardown": (cgraph.GraphTornDownError,),
    "node_removed": (cgraph.ActorDiedError, cgraph.ChannelClosedError),  # NodeDiedError is one
    "comm_raises": (cgraph.CommunicatorError,),  # and the send's own error, as a TaskError
}
FIRED_BY_CALL = ("node_removed", "stranger")  # the Injector's ``call`` is the fault


@dataclass
class Outcome:
    execution: int
    verdict: str  # ok | error | wrong | hang
    what: str  # "value", the error's type, or why it is wrong / hung
    timeouts: int = 0  # cgraph.TimeoutError before the outcome (retried)
    after_fault_s: float | None = None  # a typed error: how long after the fault it came
    names: str = ""  # a typed error: what its message names ("node actor op" or fewer)


class Hang(Exception):  # noqa: N818 - the watchdog's verdict
    pass


def guarded(fn: Any, seconds: float, what: str) -> Any:
    """``fn()`` in a daemon thread; raises ``Hang`` when it has not returned in ``seconds``."""
    try:
        return call_with_timeout(fn, seconds, what)
    except CallTimeout as exc:
        raise Hang(str(exc)) from None


@dataclass
class Injector:
    """One fault, fired from a timer thread when execution ``at`` is submitted."""

    kind: str  # kill9 | sigstop | teardown | (user_exception | slow_consumer: armed, no timer)
    at: int
    delay_s: float = 0.0
    pid: int = 0  # kill9, sigstop: the victim
    stop_s: float = 0.0  # sigstop: how long
    compiled: Any = None  # teardown: the graph
    call: Any = None  # node_removed, stranger: what the fault does
    fired_at: float | None = None  # monotonic time the fault hit
    span_s: float = 0.0  # how long the fault lasts (stop, sleep), for deadlines
    notes: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _stopped: bool = False

    def start(self) -> None:
        if self.kind in ("kill9", "sigstop", "teardown", *FIRED_BY_CALL):
            self._thread = threading.Thread(target=self._fire, name="soak-fault", daemon=True)
            self._thread.start()
        else:
            self.fired_at = time.monotonic()

    def _fire(self) -> None:
        time.sleep(self.delay_s)
        self.fired_at = time.monotonic()
        if self.kind == "kill9":
            os.kill(self.pid, signal.SIGKILL)
        elif self.kind in FIRED_BY_CALL:
            try:
                self.call()
            except Exception as exc:  # noqa: BLE001 - reported
                self.notes.append(f"wrong: the {self.kind} fault raised {type(exc).__name__}: {exc}")
        elif self.kind == "sigstop":
            os.kill(self.pid, signal.SIGSTOP)
            self._stopped = True
            time.sleep(self.stop_s)
            self.resume()
        else:
            start = time.monotonic()
            try:
                guarded(self.compiled.teardown, 30.0, "teardown from another thread")
            except Hang as exc:
                self.notes.append(f"hang: {exc}")
            except Exception as exc:  # noqa: BLE001 - reported
                self.notes.append(f"wrong: teardown raised {type(exc).__name__}: {exc}")
            self.notes.append(f"teardown took {time.monotonic() - start:.2f}s")

    def resume(self) -> None:
        if self._stopped:
            self._stopped = False
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def finish(self, seconds: float = 40.0) -> None:
        """Wait for the timer thread; whatever happens, a stopped actor runs again."""
        if self._thread is not None:
            self._thread.join(seconds)
            if self._thread.is_alive():
                self.notes.append(f"hang: the {self.kind} fault thread did not finish")
        self.resume()


@dataclass
class Plan:
    """What one graph run does: its executions, the fault, how it reads."""

    spec: DagSpec
    trial: int
    executions: int
    window: int  # executions submitted ahead of the reads
    timeout: float
    injector: Injector
    fails: set[int]  # nodes armed to raise in execution ``injector.at``
    rng: random.Random


def run_executions(compiled: Any, plan: Plan) -> list[Outcome]:
    """Submit and read ``plan.executions`` executions; one Outcome each (in order).

    Up to ``plan.window`` executions are in flight, counted from the oldest one not yet
    read (a dropped ref's execution counts until the ones before it are read); the next
    one read is usually the oldest, sometimes a later one (the earlier results are then
    buffered), and now and then one is dropped unread (its ref deleted)."""
    outcomes: dict[int, Outcome] = {}
    pending: list[tuple[int, Any, float]] = []
    submitted = 0
    stopped = False
    while submitted < plan.executions or pending:
        # in flight, as the graph counts: from the oldest execution not read yet (a ref
        # dropped unread stays in flight until every earlier execution is taken, as in Ray)
        while (submitted < plan.executions and not stopped
               and submitted - min((p[0] for p in pending), default=submitted) < plan.window):
            i = submitted
            if i == plan.injector.at:
                plan.injector.start()
            refs, outcome = _submit(compiled, plan, i)
            submitted += 1
            if outcome is None:
                pending.append((i, refs, time.monotonic()))
            else:
                outcomes[i] = outcome
                stopped = True  # execute() raised: the graph takes no more
        if stopped and submitted < plan.executions:  # the graph is gone: nothing more to submit
            for i in range(submitted, plan.executions):
                outcomes[i] = Outcome(i, "skipped", "not submitted")
            submitted = plan.executions
        if pending:
            later = len(pending) > 1 and plan.rng.random() < 0.3
            i, refs, since = pending.pop(plan.rng.randrange(len(pending)) if later else 0)
            if plan.rng.random() < 0.08:
                del refs  # dropped unread: the graph reads it away
                outcomes[i] = Outcome(i, "ok", "dropped")
            else:
                outcomes[i] = _read(plan, i, refs, since)
    return [outcomes[i] for i in range(plan.executions)]


def _submit(compiled: Any, plan: Plan, i: int) -> tuple[Any, Outcome | None]:
    """execute(); (refs, None), or (None, the execution's outcome) when it raised."""
    args = make_input(plan.spec, i, plan.trial)
    deadline = time.monotonic() + _budget(plan)
    timeouts = 0
    while True:
        try:
            return guarded(lambda: compiled.execute(*args), plan.timeout + SLACK_S, f"execute {i}"), None
        except Hang as exc:
            return None, Outcome(i, "hang", str(exc), timeouts)
        except cgraph.TimeoutError:
            timeouts += 1
            if time.monotonic() > deadline:
                return None, Outcome(i, "hang", "execute kept timing out", timeouts)
        except Exception as exc:  # noqa: BLE001 - judged
            return None, _judge_error(plan, i, exc, timeouts)


def _budget(plan: Plan) -> float:
    return plan.injector.span_s + 4 * plan.timeout + SLACK_S


def _read(plan: Plan, i: int, refs: Any, since: float) -> Outcome:
    """Read execution ``i`` (retrying after timeouts) and judge the result."""
    multi = isinstance(refs, list)
    order = list(range(len(refs))) if multi else []
    if multi and plan.rng.random() < 0.3:
        plan.rng.shuffle(order)  # outputs read one by one, in any order
    got: dict[int, Any] = {}
    timeouts = 0
    wait = plan.rng.choice((plan.timeout, plan.timeout, 0.0, 0.005))  # a first short try: retried
    while True:
        try:
            value = guarded(lambda w=wait: _get(refs, order, got, w), plan.timeout + SLACK_S, f"get {i}")
        except Hang as exc:
            return Outcome(i, "hang", str(exc), timeouts)
        except cgraph.TimeoutError:
            timeouts += 1
            wait = plan.timeout
            if time.monotonic() - since > _budget(plan):
                return Outcome(i, "hang", f"get still timing out {_budget(plan):.0f}s after submit", timeouts)
            continue
        except Exception as exc:  # noqa: BLE001 - judged
            return _judge_error(plan, i, exc, timeouts)
        return _judge_value(plan, i, value, timeouts)


def _get(refs: Any, order: list[int], got: dict[int, Any], timeout: float) -> Any:
    if not isinstance(refs, list):
        return refs.get(timeout=timeout)
    for j in order:
        if j not in got:
            got[j] = refs[j].get(timeout=timeout)
    return [got[j] for j in range(len(refs))]


def _want(plan: Plan, i: int) -> Any:
    fails = plan.fails if i == plan.injector.at else set()
    return expected(plan.spec, make_input(plan.spec, i, plan.trial), fails)


def _judge_value(plan: Plan, i: int, value: Any, timeouts: int) -> Outcome:
    want = _want(plan, i)
    if want is FAILED:
        return Outcome(i, "wrong", f"a value where the armed exception was due: {value!r:.80}", timeouts)
    if not same(value, want):
        return Outcome(i, "wrong", f"got {value!r:.120} want {want!r:.120}", timeouts)
    return Outcome(i, "ok", "value", timeouts)


def _judge_error(plan: Plan, i: int, exc: BaseException, timeouts: int) -> Outcome:
    name = type(exc).__name__
    if not isinstance(exc, cgraph.CGraphError):
        return Outcome(i, "wrong", f"untyped {name}: {str(exc)[:160]}", timeouts)
    fired = plan.injector.fired_at
    if isinstance(exc, cgraph.TaskError):
        if _want(plan, i) is FAILED and isinstance(exc, ValueError):
            return Outcome(i, "ok", "TaskError", timeouts)
        if _comm_fault(plan, i, exc) and fired is not None:
            return Outcome(i, "error", name, timeouts, round(time.monotonic() - fired, 3), _names(exc))
        return Outcome(i, "wrong", f"unexpected {name}: {str(exc)[:160]}", timeouts)
    if isinstance(exc, EXPLAINED.get(plan.injector.kind, ())) and fired is not None:
        return Outcome(i, "error", name, timeouts, round(time.monotonic() - fired, 3), _names(exc))
    return Outcome(i, "wrong", f"{name} not explained by the fault "
                   f"({plan.injector.kind}, fired={fired is not None}): {str(exc)[:160]}", timeouts)


def _comm_fault(plan: Plan, i: int, exc: BaseException) -> bool:
    """A communicator fault's error: in its execution or a later one, the flaky send's own
    ``ValueError`` or the group's ``CommunicatorError`` (a member's, wrapped as a TaskError
    by the op that read it); in an earlier execution still in flight with it, the group's
    abort cutting a member's op short (a documented limit, design-notes: "executions in
    flight")."""
    if plan.injector.kind != "comm_raises" or i <= plan.injector.at - plan.window:
        return False
    text = str(exc)
    group_error = "CommunicatorError" in text or isinstance(exc, cgraph.CommunicatorError)
    return group_error or (i >= plan.injector.at and "soak: flaky send" in text)


def _names(exc: BaseException) -> str:
    """What a typed error's message names, of the three a user needs: the machine node
    ("node 1", "Ray node ..."; a DAG node "node n3" does not count), the actor, the op
    (the where-record of every actor says all three)."""
    text = str(exc)
    named = [what for what, found in (("node", re.search(r"\bnode \d|Ray node ", text) is not None),
                                      ("actor", "actor " in text),
                                      ("op", " op " in text or "execution " in text)) if found]
    return " ".join(named)
