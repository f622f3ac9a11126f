"""The node workspace's barrier (``ShmArena.meet``): semaphores in shared memory.

Each rank is a thread with its own mapping of the segments, as a process would
have; the semaphores are process-shared, so threads exercise the same code.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cgraph.channels.segments import unlink_channel
from cgraph.comm.algorithms.barrier import barrier
from cgraph.comm.cpu.arena import ShmArena
from cgraph.errors import ChannelClosedError, ChannelTimeoutError
from tests.fabric import LocalTransport


def run_node(size: int, work: Any) -> list[Any]:
    """``work(arena, rank)`` on ``size`` ranks of one node, after the workspace is mapped."""
    base = f"cgraph_{os.getpid()}_a{uuid.uuid4().hex[:6]}"
    links = LocalTransport.create(size)

    def one(rank: int) -> Any:
        arena = ShmArena(base, rank, size)
        arena.view(1, lambda: barrier(links[rank]))
        try:
            return work(arena, rank)
        except Exception as exc:  # noqa: BLE001 - returned for the test to inspect
            return exc

    try:
        with ThreadPoolExecutor(size) as pool:
            return [f.result(timeout=60) for f in [pool.submit(one, r) for r in range(size)]]
    finally:
        unlink_channel(base)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_no_rank_leaves_a_barrier_before_every_rank_reached_it(size: int) -> None:
    """Ranks arrive late at random; a fast rank's tokens for the next barrier must not
    let a slow rank out of this one."""
    rounds = 60
    arrived = [0] * rounds
    lock = threading.Lock()
    seen: list[tuple[int, int]] = []

    def work(arena: ShmArena, rank: int) -> None:
        rng = random.Random(rank)
        for k in range(rounds):
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.003)
            with lock:
                arrived[k] += 1
            arena.meet(10.0)
            seen.append((k, arrived[k]))

    assert run_node(size, work) == [None] * size
    assert len(seen) == rounds * size
    assert all(count == size for _, count in seen), [s for s in seen if s[1] != size][:5]


def test_a_rank_that_never_comes_times_the_barrier_out() -> None:
    def work(arena: ShmArena, rank: int) -> str:
        if rank == 0:
            arena.meet(0.5)
        else:
            time.sleep(1.5)
        return "done"

    got = run_node(2, work)
    assert isinstance(got[0], ChannelTimeoutError) and "within 0.5 s" in str(got[0])


def test_closing_wakes_every_rank_asleep_at_the_barrier() -> None:
    def work(arena: ShmArena, rank: int) -> Any:
        if rank == 0:
            time.sleep(0.3)
            arena.close()
            return "closed"
        start = time.monotonic()
        try:
            arena.meet(60.0)
        except ChannelClosedError:
            return time.monotonic() - start
        return "passed"

    got = run_node(3, work)
    assert got[0] == "closed"
    assert all(isinstance(w, float) and w < 5 for w in got[1:]), got


def test_meet_before_the_workspace_is_mapped_says_so() -> None:
    with pytest.raises(RuntimeError, match="before the first view"):
        ShmArena("cgraph_0_never", 0, 2).meet(1.0)
