"""hosting.py without Ray: loops on threads of their own, and how each ended reaching its
driver's watcher call (``wait_loops``), which blocks until then and never polls."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from cgraph.runtime import hosting


@pytest.fixture
def loops(monkeypatch):
    """Fake loops: ``release[tag]`` ends tag's loop with what it holds (an exception raises)."""
    release: dict[str, threading.Event] = {}
    outcome: dict[str, object] = {}

    def fake_loop(instance, program):
        release[program.graph_tag].wait(30)
        result = outcome.get(program.graph_tag, "closed")
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(hosting, "run_actor_loop", fake_loop)

    def start(tag: str, watcher: str) -> None:
        release[tag] = threading.Event()
        hosting.start_loop(object(), SimpleNamespace(graph_tag=tag), watcher)

    def end(tag: str, result: object = "closed") -> None:
        outcome[tag] = result
        release[tag].set()

    yield start, end
    for event in release.values():
        event.set()


def wait_in_thread(watcher: str) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(target=lambda: got.append(hosting.wait_loops(None, watcher)))
    thread.start()
    return thread, got


def test_a_wait_returns_when_one_of_its_loops_ends_and_not_before(loops) -> None:
    start, end = loops
    start("g1", "w")
    start("g2", "w")
    assert hosting.running(None)["w"] == {"g1", "g2"}
    thread, got = wait_in_thread("w")
    thread.join(0.2)
    assert thread.is_alive() and not got  # both loops still run: it waits
    end("g1", "the channel n1 was lost")
    thread.join(10)
    assert got == [{"g1": (hosting.RETURNED, "the channel n1 was lost")}]
    assert hosting.running(None)["w"] == {"g2"}
    end("g2")
    assert hosting.wait_loops(None, "w") == {"g2": (hosting.RETURNED, "closed")}
    assert hosting.wait_loops(None, "w") == {}  # none runs: at once
    assert "w" not in hosting.running(None)


def test_a_loop_that_raises_is_reported_with_its_error(loops) -> None:
    start, end = loops
    start("g", "w2")
    end("g", RuntimeError("a defect"))
    assert hosting.wait_loops(None, "w2") == {"g": (hosting.FAILED, "RuntimeError: a defect")}


def test_each_driver_hears_of_its_own_loops_only(loops) -> None:
    start, end = loops
    start("mine", "driver-1")
    start("theirs", "driver-2")
    thread, got = wait_in_thread("driver-1")
    end("theirs")
    thread.join(0.2)
    assert thread.is_alive() and not got  # another driver's loop ended: not this one's
    end("mine")
    thread.join(10)
    assert got == [{"mine": (hosting.RETURNED, "closed")}]
    assert hosting.wait_loops(None, "driver-2") == {"theirs": (hosting.RETURNED, "closed")}
