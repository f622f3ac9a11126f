"""POSIX shared-memory segments of cgraph: names, creation, removal, stale cleanup.

Segments are files in /dev/shm opened with ``os.open`` (what glibc's
``shm_open`` does), never through ``multiprocessing.shared_memory``: its
resource_tracker would warn about, and unlink, every segment an actor opened
when that actor exits. Names say who made them and what they are::

    cgraph_<creator pid>_<graph tag>_<channel id>[_<generation>]

Tag and channel id are escaped so that ``_`` only separates fields; a segment
whose creator pid is dead (or reused by a younger process) is stale, and
``cleanup_stale_segments`` removes it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re

from cgraph.channels import reaper

SHM_DIR = "/dev/shm"
PREFIX = "cgraph_"


def segment_name(tag: str, channel_id: str, pid: int | None = None) -> str:
    """``cgraph_<pid>_<tag>_<channel id>`` with both parts made file-name safe.

    Characters other than letters, digits and ``.`` become ``-xx`` (hex bytes), so
    the mapping is one-to-one and ``_`` only ever separates fields; very long
    names are shortened with a hash.
    """
    name = f"{PREFIX}{os.getpid() if pid is None else pid}_{_safe(tag)}_{_safe(channel_id)}"
    if len(name) > 200:
        name = f"{name[:180]}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
    return name


def unlink_channel(name: str) -> list[str]:
    """Unlink the control segment ``name`` and all its data generations."""
    gen_name = re.compile(re.escape(name) + r"(_\d+)?")
    removed = []
    for entry in _list_segments():
        if gen_name.fullmatch(entry) and unlink_quietly(entry):
            removed.append(entry)
    return removed


def cleanup_stale_segments() -> list[str]:
    """Unlink every cgraph segment whose creator process is gone; returns their names.

    A live pid that started after the segment was created (a reused pid)
    counts as gone.
    """
    removed = []
    for entry in _list_segments():
        match = re.match(rf"{PREFIX}(\d+)_", entry)
        if match is None:
            continue
        try:
            created = os.stat(os.path.join(SHM_DIR, entry)).st_ctime
        except FileNotFoundError:
            continue
        if not _process_older_than(int(match.group(1)), created) and unlink_quietly(entry):
            removed.append(entry)
    return removed


def _safe(part: str) -> str:
    return "".join(
        c if c.isascii() and (c.isalnum() or c == ".") else "".join(f"-{b:02x}" for b in c.encode())
        for c in part
    )


def _list_segments() -> list[str]:
    return [e for e in os.listdir(SHM_DIR) if e.startswith(PREFIX)]


def _process_older_than(pid: int, created: float) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= created + 1.0


def _boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    return 0.0


def create_segment(name: str, size: int) -> mmap.mmap:
    """Create ``/dev/shm/<name>`` of ``size`` bytes and map it (fails if it exists).

    A segment named with this process's pid is removed by this process's reaper if the
    process dies without removing it (``reaper.py``)."""
    if name.startswith(f"{PREFIX}{os.getpid()}_"):
        reaper.ensure()
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def open_segment(name: str, size: int = 0) -> mmap.mmap:
    """Map an existing segment (``size`` 0: all of it)."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink_quietly(name: str) -> bool:
    """Unlink a segment; False if it was already gone."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
        return True
    except FileNotFoundError:
        return False
