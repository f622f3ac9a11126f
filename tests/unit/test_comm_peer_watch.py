"""``PeerWatch``: a rank hears at once that a process of its node exited (pidfds, one thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from cgraph.comm.cpu.peer_watch import PeerWatch

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open here")


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _watch(peers: dict[int, int]) -> tuple[PeerWatch, list[tuple[int, int]], threading.Event]:
    deaths: list[tuple[int, int]] = []
    heard = threading.Event()

    def on_death(rank: int, pid: int) -> None:
        deaths.append((rank, pid))
        heard.set()

    return PeerWatch(peers, on_death), deaths, heard


def test_the_first_peer_to_die_is_reported_once() -> None:
    a, b = _sleeper(), _sleeper()
    watch, deaths, heard = _watch({1: a.pid, 2: b.pid})
    try:
        assert watch.watching == 2
        time.sleep(0.2)
        assert deaths == [], "nobody died yet"
        b.kill()
        b.wait()
        assert heard.wait(10)
        a.kill()
        a.wait()
        time.sleep(0.3)
        assert deaths == [(2, b.pid)], "one report: the group is aborted by the first"
    finally:
        watch.stop()
        a.kill()
        a.wait()


def test_stop_ends_the_watch_without_a_report() -> None:
    a = _sleeper()
    watch, deaths, _ = _watch({0: a.pid})
    watch.stop()
    watch.stop()  # idempotent
    a.kill()
    a.wait()
    time.sleep(0.3)
    assert deaths == []


def test_a_peer_already_gone_is_reported_at_once() -> None:
    a = _sleeper()
    a.kill()
    a.wait()
    watch, deaths, heard = _watch({3: a.pid})
    try:
        assert heard.wait(10) and deaths == [(3, a.pid)]
    finally:
        watch.stop()
