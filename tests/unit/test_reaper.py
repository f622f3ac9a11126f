"""A process's segments outlive it no longer: its reaper removes them when it dies, also
by kill -9 (channels/reaper.py). The creators here are child processes of the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cgraph.channels import reaper

ROOT = Path(__file__).resolve().parents[2]
CREATOR = """
import os, sys
from cgraph.channels.segments import create_segment, segment_name
maps = [create_segment(segment_name("reapertest", f"c{i}"), 4096) for i in range(3)]
print(os.getpid(), flush=True)
sys.stdin.read()  # until the test kills it, or closes stdin
"""


def creator() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", CREATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def segments_of(pid: int) -> list[str]:
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(f"cgraph_{pid}_"))


def wait_until_gone(pid: int, limit_s: float = 20.0) -> list[str]:
    """The segments of ``pid`` still there once they are gone or ``limit_s`` passed."""
    deadline = time.monotonic() + limit_s
    while segments_of(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return segments_of(pid)


def test_a_killed_creators_segments_are_removed_within_seconds() -> None:
    proc, pid = creator()
    try:
        assert len(segments_of(pid)) == 3
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert wait_until_gone(pid) == []
    finally:
        proc.kill()


def test_a_creator_that_exits_leaves_nothing_and_its_reaper_ends() -> None:
    proc, pid = creator()
    reapers_before = _reapers_of(pid)
    assert len(reapers_before) == 1  # one reaper per creating process, however many segments
    assert proc.stdin is not None
    proc.stdin.close()  # it exits normally without removing its segments
    proc.wait(10)
    assert wait_until_gone(pid) == []
    deadline = time.monotonic() + 20
    while _reapers_of(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _reapers_of(pid) == []


def test_a_reused_pid_keeps_its_segments() -> None:
    me = os.getpid()
    name = f"cgraph_{me}_reapertest_mine"
    Path("/dev/shm", name).write_bytes(b"x")
    try:
        assert reaper.reap(me, started=1) == []  # this pid started later than "1": another process
        assert Path("/dev/shm", name).exists()
        assert reaper.reap(me, started=reaper._start_ticks(me)) == [name]
    finally:
        Path("/dev/shm", name).unlink(missing_ok=True)


def _reapers_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"reaper.py") for part in cmd) and str(pid).encode() in cmd:
                found.append(int(entry))
    return found
