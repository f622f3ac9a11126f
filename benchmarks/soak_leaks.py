"""What a fault-soak trial may leave behind, read from /dev/shm and /proc (no psutil).

    before = snapshot(driver)         ... a trial: actors, graphs, faults, ray.kill ...
    after = snapshot(driver)
    leaks(before, after, owners)  ->  ["shm cgraph_123_ab12cd34_n3.shm", "listen 0.0.0.0:4711 pid 99 (python)"]

Only this soak's own processes count, since other Ray clusters and test runs may share
the machine: the driver and its descendants (``ray.init`` starts Ray's daemons as the
driver's children and they start the workers), plus pids the caller names (a child
driver). Three things, each against the snapshot taken before the trial:

- shared memory: files in /dev/shm named ``cgraph_<pid>_*`` (``cgraph/channels/segments.py``)
  whose creator pid is one of ours; Ray's own files and POSIX semaphores (``sem.*``) are
  not cgraph's and are ignored;
- processes: a Ray actor process (title ``ray::<Class>...``, not ``ray::IDLE``) that was
  not there before (the trial killed its actors: a store actor cgraph started, or a loop
  that kept its actor alive, would show here), and a new process in the tree that is not
  one of Ray's (cgraph starts only reapers: one per process that made segments, which
  ends with that process; a reaper whose process is gone is a leak);
- listening TCP sockets (/proc/net/tcp, tcp6) that are new and belong to the driver or
  to a process of the tree that is not Ray's. Ray's daemons and workers open and close
  ports as workers come and go; those are Ray's, not cgraph's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

SHM_DIR = "/dev/shm"
CGRAPH_PREFIX = "cgraph_"  # cgraph.channels.segments.PREFIX
RAY_PROCESSES = ("raylet", "gcs_server", "log_monitor", "dashboard", "runtime_env", "monitor.py",
                 "default_worker.py", "ray/_private", "setup_worker")


@dataclass
class Snapshot:
    tree: dict[int, str]  # the driver and its descendants: pid -> command line (or Ray's title)
    shm: set[str]  # every cgraph segment in /dev/shm (filtered by creator in leaks())
    listening: dict[int, tuple[str, int]]  # socket inode -> ("addr:port", owner pid in tree)


def snapshot(driver: int) -> Snapshot:
    processes, parents = _processes()
    tree = {pid: processes[pid] for pid in _descendants(driver, parents) | {driver} if pid in processes}
    return Snapshot(tree, cgraph_segments(), _listening(tree))


def cgraph_segments(pid: int | None = None) -> set[str]:
    """cgraph's segments in /dev/shm; only those created by ``pid`` when given."""
    prefix = CGRAPH_PREFIX if pid is None else f"{CGRAPH_PREFIX}{pid}_"
    return {e for e in _listdir(SHM_DIR) if e.startswith(prefix)}


def creator(segment: str) -> int | None:
    match = re.match(rf"{CGRAPH_PREFIX}(\d+)_", segment)
    return int(match.group(1)) if match else None


def leaks(before: Snapshot, after: Snapshot, driver: int, owners: set[int] = frozenset()) -> list[str]:
    """What ``after`` holds of cgraph's that ``before`` did not, one line each.

    ``owners``: pids besides the tree whose segments count (a child driver, the actors)."""
    # a segment counts when its creator is one of ours: in the tree, or an owner that is gone
    # (a live process of that pid outside the tree is someone else's, the pid reused)
    ours = set(after.tree) | {pid for pid in owners if _started(pid) is None}
    found = [f"shm {name}" for name in sorted(after.shm - before.shm) if creator(name) in ours]
    for pid, cmd in sorted(after.tree.items()):
        if pid in before.tree or pid == driver:
            continue
        if _is_actor(cmd):
            found.append(f"process {pid} {cmd[:80]!r} (an actor still alive)")
        elif _reaper_of(cmd) is not None and _started(_reaper_of(cmd) or 0) is not None:
            continue  # the reaper of a live process (the driver's, from its first segment on)
        elif not _is_ray(cmd):
            found.append(f"process {pid} {cmd[:80]!r} (not one of Ray's)")
    for inode, (addr, pid) in sorted(after.listening.items()):
        cmd = after.tree.get(pid, "")
        if inode not in before.listening and (pid == driver or not _is_ray(cmd)):
            found.append(f"listen {addr} pid {pid} ({cmd[:60]})")
    return found


def identify(pids: list[int]) -> dict[int, int]:
    """pid -> start time (clock ticks since boot) of the processes in ``pids`` that run:
    pids wrap at 32768 here, so a pid alone may name a newer process a moment later."""
    return {pid: started for pid in pids if (started := _started(pid)) is not None}


def still_running(processes: dict[int, int]) -> list[int]:
    """The pids of ``identify``'s processes that still run (zombies count as gone)."""
    return [pid for pid, started in processes.items() if _started(pid) == started]


def _started(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else int(fields[19])


def _reaper_of(cmd: str) -> int | None:
    """The creator pid a cgraph reaper (``cgraph/channels/reaper.py PID START``) serves."""
    match = re.search(r"cgraph/channels/reaper\.py (\d+) ", cmd)
    return int(match.group(1)) if match else None


def _is_actor(cmd: str) -> bool:
    return cmd.startswith("ray::") and not cmd.startswith("ray::IDLE")


def _is_ray(cmd: str) -> bool:
    return cmd.startswith("ray::") or any(name in cmd for name in RAY_PROCESSES)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _processes() -> tuple[dict[int, str], dict[int, int]]:
    processes, parents = {}, {}
    for entry in _listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z" or not cmd:  # zombies and kernel threads
            continue
        processes[pid], parents[pid] = cmd, int(fields[1])
    return processes, parents


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _listening(tree: dict[int, str]) -> dict[int, tuple[str, int]]:
    inodes: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A":  # TCP_LISTEN
                inodes[int(cols[9])] = _address(cols[1])
    found = {}
    for pid in tree:
        for inode in _socket_inodes(pid) & set(inodes):
            found.setdefault(inode, (inodes[inode], pid))
    return found


def _address(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    host = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(ip) == 8 else f"[{ip}]"
    return f"{host}:{int(port, 16)}"


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in _listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes
