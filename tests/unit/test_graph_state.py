"""GraphState.closed_error: why a driver channel closed under a waiter (no Ray)."""

from __future__ import annotations

import threading

import cgraph
from cgraph.errors import ChannelClosedError, ChannelLostError
from cgraph.runtime.results import GraphState


def test_a_close_the_user_did_not_ask_for_waits_for_the_monitors_verdict():
    """A survivor's loop closed its channel to the driver a moment before the monitor said
    an actor died: the waiter gives the death, not "torn down" (the soak across nodes saw
    GraphTornDownError after a kill before this waited)."""
    state = GraphState()
    died = cgraph.ActorDiedError("actor b (W) died", actor="b (W)")
    threading.Timer(0.2, state.fail, args=(died,)).start()
    error = state.closed_error(ChannelClosedError("channel n1.xnode was closed"))
    assert isinstance(error, cgraph.ActorDiedError) and "actor b (W) died" in str(error)


def test_without_a_verdict_the_channels_own_error_and_after_teardown_torn_down(monkeypatch):
    from cgraph.runtime import results

    monkeypatch.setattr(results, "VERDICT_S", 0.05)
    state = GraphState()
    lost = ChannelLostError("the writer of n1.xnode went away")
    assert state.closed_error(lost) is not None and "went away" in str(state.closed_error(lost))
    state.torn_down = True
    assert isinstance(state.closed_error(ChannelClosedError("closed")), cgraph.GraphTornDownError)
