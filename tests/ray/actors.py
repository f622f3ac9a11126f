"""Actor classes shared by the Ray tests."""

from __future__ import annotations

import os
import time

import numpy as np
import ray


def in_cgraph_shm(arr) -> bool:
    """True when the array's (or tensor's) memory lies inside one of cgraph's shm mappings."""
    addr = arr.data_ptr() if hasattr(arr, "data_ptr") else arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/cgraph_" not in line:
                continue
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, name: str = "w") -> None:
        self.name = name
        self.calls = 0

    def getpid(self) -> int:
        return os.getpid()

    def echo(self, x):
        return x

    def inc(self, x, by=1):
        self.calls += 1
        return x + by

    def add(self, *xs):
        return sum(xs)

    def mul(self, x, factor=2):
        return x * factor

    def tag(self, x):
        return f"{self.name}({x})"

    def split(self, x):
        return x, x + 1

    def fail_if(self, x, bad=-1):
        if x == bad:
            raise ValueError(f"bad input {x}")
        return x

    def sleep_then(self, x, seconds=0.0):
        time.sleep(seconds)
        return x

    def when_exists(self, x, path):
        """x, once ``path`` exists (a gate the test opens; gives up after 60 s)."""
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return x

    def die_if(self, x, bad=-1):
        if x == bad:
            os._exit(1)
        return x

    def zero_copy(self, arr):
        return (in_cgraph_shm(arr), float(arr.sum()), arr.shape)

    def segment_of(self, arr):
        """The /dev/shm file the array's memory lies in (None: private memory), and its sum."""
        addr = arr.__array_interface__["data"][0]
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= addr < hi and "/dev/shm/" in line:
                    return line.split()[-1].rsplit("/", 1)[-1], float(arr.sum())
        return None, float(arr.sum())

    def tensor_info(self, t):
        import torch

        return (in_cgraph_shm(t), float(t.float().sum()), str(t.dtype), isinstance(t, torch.Tensor))

    def nbytes(self, arr):
        return int(arr.nbytes), float(arr[:16].sum()) if arr.size else 0.0

    def make_array(self, n):
        return np.arange(n, dtype=np.float64)


@ray.remote(num_cpus=0)
class AffinityProbe:
    def cpus(self, _x=None):
        import threading

        return sorted(os.sched_getaffinity(threading.get_native_id()))


@ray.remote(num_cpus=0)
class AsyncWorker:
    """An async actor: its ``async def`` methods run inside compiled graphs too."""

    def __init__(self) -> None:
        self.seen = 0

    async def add_later(self, x, y=1):
        import asyncio

        await asyncio.sleep(0.001)
        self.seen += 1
        return x + y

    async def fail_on(self, x, bad):
        import asyncio

        await asyncio.sleep(0)
        if x == bad:
            raise KeyError(f"bad key {x}")
        return x

    def count(self):
        return self.seen


@ray.remote(num_cpus=0)
class Overlap:
    """Counts how many of its methods run at once (``max_concurrency=2`` makes it threaded)."""

    def __init__(self) -> None:
        import threading

        self.inside = 0
        self.most = 0
        self.changed = threading.Condition()

    def hold(self, x, seconds=0.001):
        with self.changed:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(seconds)
        with self.changed:
            self.inside -= 1
        return x

    def meet(self, x, timeout=20.0):
        """Whether another call came in while this one was inside (waits up to ``timeout``)."""
        with self.changed:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.changed.notify_all()
            met = self.changed.wait_for(lambda: self.most >= 2, timeout=timeout)
            self.inside -= 1
        return met, x

    def most_at_once(self):
        return self.most
