"""cgraph's background threads end quietly on SystemExit and KeyboardInterrupt, never the process."""

from __future__ import annotations

import threading

import pytest

from cgraph import _threads


@pytest.mark.parametrize("exc", [SystemExit(1), KeyboardInterrupt()])
def test_exit_and_interrupt_end_the_thread_quietly(exc, monkeypatch, caplog):
    seen: list[object] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))

    def target(value: int) -> None:
        seen.append(value)
        raise exc

    caplog.set_level("DEBUG", logger="cgraph")
    thread = _threads.start(target, "cgraph-test", 7)
    thread.join(timeout=10)
    assert not thread.is_alive() and thread.daemon and thread.name == "cgraph-test"
    assert seen == [7], "nothing reached threading.excepthook"
    assert f"thread cgraph-test ended on {type(exc).__name__}" in caplog.text


def test_an_ordinary_error_still_reaches_the_excepthook(monkeypatch):
    seen: list[object] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))

    def target() -> None:
        raise ValueError("a bug to see")

    _threads.start(target, "cgraph-test").join(timeout=10)
    assert seen == [ValueError]
