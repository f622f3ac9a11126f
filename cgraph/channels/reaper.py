"""A process that removes another process's shared-memory segments when that process dies.

A driver killed without ``teardown()`` (or an actor that made segments on its node, when
Ray kills it) leaves its segments in /dev/shm; before, only the next compile on that
node removed them (``segments.cleanup_stale_segments``). Now the first time a process
creates a segment named with its own pid, it starts one reaper (``ensure``): a small
Python process that holds the read end of a pipe whose write end only the creator holds,
and blocks reading it. When the creator exits, however it exits (kill -9 too), the
kernel closes that end; the read returns, and the reaper unlinks every
``cgraph_<creator pid>_*`` segment and exits. It waits in the kernel: no polling, no
cost while the creator lives. It runs in a session of its own, so that a signal to the
creator's process group (Ray stopping a worker) does not end it first. Python's
``multiprocessing.resource_tracker`` keeps a process beside its creator the same way.

This file is run as a script (``python -I reaper.py PID START``): it imports nothing
from cgraph, so it starts in milliseconds and needs neither Ray nor torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

SHM_DIR = "/dev/shm"
PREFIX = "cgraph_"

_LOCK = threading.Lock()
_STARTED: dict[int, subprocess.Popen[bytes]] = {}  # creator pid -> its reaper (a fork starts its own)


def ensure() -> None:
    """Start this process's reaper unless it has one."""
    pid = os.getpid()
    if pid in _STARTED:
        return
    with _LOCK:
        if pid in _STARTED:
            return
        _STARTED[pid] = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(pid), str(_start_ticks(pid))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True,
        )  # this process holds the pipe's write end (proc.stdin) until it exits


def _start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks after boot (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def reap(pid: int, started: int) -> list[str]:
    """Unlink the segments of process ``pid`` (started at ``started`` ticks); returns them.

    If another process has taken the pid since (it started later), its segments stay."""
    if _start_ticks(pid) not in (0, started):
        return []
    removed = []
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(f"{PREFIX}{pid}_"):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                removed.append(entry)
            except FileNotFoundError:
                pass
    return removed


def main(argv: list[str]) -> int:
    pid, started = int(argv[1]), int(argv[2])
    try:
        while sys.stdin.buffer.read(65536):  # the creator never writes: this returns at its exit
            pass
    except OSError:
        pass
    reap(pid, started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
