"""Strangers without Ray or the graph's secret attack a live graph on two Ray nodes.

The cluster, the graph and the strangers run in a child process
(``attack_script.py``, each stranger is ``stranger.py`` in a process of its own)
so that this session's one-node Ray instance stays as it is. Every attack aims
only at the graph's own listening sockets on this machine.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def checks(child_scripts):
    return child_scripts.get("attack_script.py").checks()


def test_the_graph_answers_right_through_every_data_attack(checks):
    data = checks["data"]
    assert data["results_ok"], "executions while strangers sat at every door"
    assert data["after_ok"], "executions after the attacks"


@pytest.mark.parametrize("attack", ["garbage", "huge", "pickle", "forged", "hold"])
def test_every_stranger_at_a_data_door_is_challenged_then_closed(checks, attack):
    seen = checks["data"]["seen"][attack]
    # the listener spoke first, with a challenge; or (a slow machine) the writer got in and
    # the listener closed before this stranger was accepted: it never read a byte either
    assert seen["challenged"] or seen.get("door_shut"), "the listener spoke first, with a challenge"
    assert seen["closed"], f"the {attack} stranger's connection was closed"


def test_a_silent_stranger_who_came_first_held_the_door_at_most_the_deadline(checks):
    assert checks["data"]["seen"]["hold"]["held_s"] < 8, "closed when the writer got in, or at 5 s"


def test_a_flood_of_silent_connections_is_closed_and_the_writer_still_gets_in(checks):
    flood = checks["data"]["seen"]["flood"]
    assert flood == {"closed": 24, "of": 24}
    assert checks["data"]["results_ok"]


def test_no_pickle_of_a_stranger_is_ever_unpickled(checks):
    assert checks["data"]["files"] == [] and checks["after"]["files"] == []


def test_a_frame_claiming_a_gigabyte_grows_nobody(checks):
    assert checks["data"]["rss_growth"] < 256 << 20, checks["data"]["rss_growth"]


def test_refused_connections_are_counted_where_they_were_refused(checks):
    a, b, driver = checks["data"]["refused"]
    # a: huge + pickle; b: hold + garbage + forged; the driver: pickle + the flood's
    # connections it accepted before its writer got in (on a slow machine the door
    # shuts first and the kernel resets the rest, uncounted: see the flood test)
    assert a >= 2 and b >= 3 and driver >= 2, checks["data"]["refused"]


def test_every_data_door_is_shut_once_its_writer_is_in(checks):
    assert checks["data"]["doors_shut"]


def test_forged_control_lines_neither_redirect_nor_close_anything(checks):
    control = checks["control"]
    hello = control["seen"]["hello"]
    assert hello["closed"] and not hello["writer_came"], hello
    for close in (control["seen"]["close"],):
        assert close["closed"] and close["forged_closed"], close
    assert control["seen"]["garbage"]["closed"]
    assert control["closed"] == [False, False, False], "no channel was closed by a stranger"
    assert control["after_ok"]


def test_nothing_is_left_after_teardown(checks):
    assert checks["after"]["segments"] == []
