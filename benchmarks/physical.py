"""Physical references for array throughput: copies into POSIX shared memory.

A shm channel moves an array with one copy into a pre-faulted mapping, so the
reference is that copy done by bare numpy, timed two ways:

    single   one process copying, the other core idle: the speed of one copy
    paired   two forked processes copying at once, each its own array into its
             own mapping: the speed of each copy while the other core copies too

The pipelined 2-actor chain runs two copies of different executions at once
(the driver's and A's), so the paired rate, not the single one, bounds it: when
one core's copy already uses most of the machine's memory bandwidth, the paired
copies each run at half speed and two copies per execution cap the chain at 50%
of the single rate, whatever the executor does.
"""

from __future__ import annotations

import functools
import os
import pickle
import struct
from collections.abc import Callable
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from common import gb_per_s, log, percentile, time_calls


def memcpy_reference(sizes: tuple[int, ...], iterations: int) -> dict[str, Any]:
    """Per size: single-core copy into shm and into numpy, and the paired copy into shm."""
    out: dict[str, Any] = {"iterations": iterations, "sizes": {}}
    for size in sizes:
        row = {}
        for name, ns in (("shm", _single_copy_ns(size, iterations, shm=True)),
                         ("numpy", _single_copy_ns(size, iterations, shm=False)),
                         ("shm_paired", max(paired_copy_ns(size, iterations)))):
            row[f"{name}_gbps"] = gb_per_s(size, ns / 1e9)
            row[f"{name}_median_ms"] = ns / 1e6
        out["sizes"][str(size)] = row
        log(f"  memcpy {size >> 20} MiB: shm {row['shm_gbps']:.2f} GB/s, numpy {row['numpy_gbps']:.2f} GB/s, "
            f"shm with both cores copying {row['shm_paired_gbps']:.2f} GB/s each")
    return out


def _single_copy_ns(size: int, iterations: int, shm: bool) -> float:
    """Median ns of one np.copyto of ``size`` bytes into a pre-faulted destination."""
    return _timed_copies(size, iterations, shm, warmup=2)


def _timed_copies(size: int, iterations: int, shm: bool, warmup: int = 0,
                  before: Callable[[], None] | None = None) -> float:
    """Median ns of ``iterations`` copies into a fresh pre-faulted destination,
    after ``warmup`` untimed ones and then ``before()``."""
    segment = shared_memory.SharedMemory(create=True, size=size) if shm else None
    try:
        dst = np.ndarray((size,), np.uint8, buffer=segment.buf) if segment else np.empty(size, np.uint8)
        dst[:] = 0  # fault the pages in once: channels reuse their buffers
        src = np.ones(size, dtype=np.uint8)
        for _ in range(warmup):
            np.copyto(dst, src)
        if before is not None:
            before()
        copy = functools.partial(np.copyto, dst, src)
        ns = percentile(time_calls(copy, iterations), 50)
        del copy, dst  # the mapping's last views: close() refuses while one is alive
        return ns
    finally:
        if segment is not None:
            segment.close()
            segment.unlink()


def paired_copy_ns(size: int, iterations: int) -> tuple[float, float]:
    """Median ns per copy in each of two processes copying at the same time.

    Both set up their own source and pre-faulted shm destination, meet at a
    pipe barrier, then copy ``iterations`` times back to back (the same count
    at the same speed, so the runs overlap but for their ends)."""
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            ns = _copy_after_barrier(size, iterations, to_child_r, to_parent_w, leader=False)
            data = pickle.dumps(ns)
            os.write(to_parent_w, struct.pack("q", len(data)) + data)
            code = 0
        finally:
            os._exit(code)
    os.close(to_child_r)
    os.close(to_parent_w)
    try:
        mine = _copy_after_barrier(size, iterations, to_parent_r, to_child_w, leader=True)
        with os.fdopen(to_parent_r, "rb", closefd=False) as pipe:
            (length,) = struct.unpack("q", pipe.read(8))
            theirs = pickle.loads(pipe.read(length))
    finally:
        os.close(to_parent_r)
        os.close(to_child_w)
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("the paired-copy child failed")
    return mine, theirs


def _copy_after_barrier(size: int, iterations: int, inbox: int, outbox: int, leader: bool) -> float:
    def barrier() -> None:  # the leader waits for the follower's "ready", then says "go"
        if leader:
            os.read(inbox, 1)
            os.write(outbox, b"g")
        else:
            os.write(outbox, b"r")
            os.read(inbox, 1)

    return _timed_copies(size, iterations, shm=True, warmup=1, before=barrier)
