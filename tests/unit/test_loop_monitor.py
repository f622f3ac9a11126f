"""A graph's monitor without Ray: the first loop end while the graph is live is its failure,
a death seen just after a lost channel is reported instead, and ``wait_all`` counts every
actor's end."""

from __future__ import annotations

import threading

from cgraph.errors import ActorDiedError, ChannelLostError
from cgraph.runtime import hosting
from cgraph.runtime import monitor as monitor_module
from cgraph.runtime.monitor import DIED, LoopEnds, LoopMonitor, Outcome

LABELS = {"a": "a (W)", "b": "b (W)"}


def watch(ends: LoopEnds) -> tuple[LoopMonitor, list, threading.Event]:
    failures: list = []
    failed = threading.Event()

    def on_failure(error) -> None:
        failures.append(error)
        failed.set()

    return LoopMonitor(ends, LABELS, on_failure), failures, failed


def test_a_death_is_reported_at_once_naming_the_actor() -> None:
    ends = LoopEnds({"a", "b"})
    monitor, failures, failed = watch(ends)
    ends.put("b", Outcome(DIED, "The actor died unexpectedly."))
    assert failed.wait(10)
    (error,) = failures
    assert isinstance(error, ActorDiedError) and error.actor == "b (W)"
    assert "actor b (W) died while the compiled graph was running: The actor died unexpectedly. Tear" in str(error)
    monitor.join()


def test_a_lost_channel_gives_way_to_the_death_behind_it() -> None:
    ends = LoopEnds({"a", "b"})
    monitor, failures, failed = watch(ends)
    ends.put("a", Outcome(hosting.RETURNED, "the channel n1 to b was lost"))
    ends.put("b", Outcome(DIED, "killed"))
    assert failed.wait(10)
    assert isinstance(failures[0], ActorDiedError) and failures[0].actor == "b (W)"


def test_a_lost_channel_alone_is_a_channel_lost_error_and_a_crash_names_its_loop(monkeypatch) -> None:
    monkeypatch.setattr(monitor_module, "DEATH_GRACE_S", 0.1)  # no death follows: a short grace
    ends = LoopEnds({"a"})
    monitor, failures, failed = watch(ends)
    ends.put("a", Outcome(hosting.RETURNED, "the channel n1 was lost"))
    assert failed.wait(10)  # after the grace for a death
    assert isinstance(failures[0], ChannelLostError) and "the actor is alive" in str(failures[0])
    crashed = LoopEnds({"a"})
    _, failures, failed = watch(crashed)
    crashed.put("a", Outcome(hosting.FAILED, "KeyError: 'x'"))
    assert failed.wait(10)
    assert "the execution loop on actor a (W) failed: KeyError: 'x'" in str(failures[0])


def test_a_stopped_monitor_reports_nothing_and_ends_count_once() -> None:
    ends = LoopEnds({"a", "b"})
    monitor, failures, _ = watch(ends)
    monitor.stop()  # teardown: the loops' ends are expected
    ends.put("a", Outcome(hosting.RETURNED, "closed"))
    assert not ends.wait_all(0.05)
    ends.put("b", Outcome(hosting.RETURNED, "closed"))
    ends.put("b", Outcome(DIED, "later"))  # a second end of one actor is ignored
    assert ends.wait_all(1)
    monitor.join()
    assert failures == []
