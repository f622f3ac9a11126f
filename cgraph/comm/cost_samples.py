"""Measuring the cost model's parameters in process: ranks as threads over ``LocalTransport``.

    params = cost_samples.measure()          fit(sample()): a few sizes, world sizes 2 and 4

What a live group measures is ``collective.measurement``; this is the
stand-alone version, for tests and for looking at the model on this host.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from cgraph.comm.algorithms import allreduce, barrier
from cgraph.comm.cost_model import CostParams, Sample, candidates, fit
from cgraph.comm.transport import LocalTransport, run_ranks
from cgraph.comm.types import ReduceOp


def sample(
    transport_factory: Callable[[int], Sequence[LocalTransport]] = LocalTransport.create,
    world_sizes: Sequence[int] = (2, 4),
    nbytes: Sequence[int] = (1 << 10, 1 << 16, 1 << 20),
    algorithms: Sequence[str] | None = None,
    repeats: int = 3,
) -> list[Sample]:
    """Time float32 SUM allreduces on fresh endpoints, one thread per rank.

    A sample is the slowest rank's time from a barrier to the end of its
    allreduce, each rank's best of ``repeats``.
    """
    names = tuple(algorithms or candidates())
    out = []
    for p in world_sizes:
        endpoints = transport_factory(p)
        for name in names:
            for size in nbytes:
                timed = functools.partial(_time_one, algorithm=name, nbytes=size, repeats=repeats)
                elapsed = run_ranks(endpoints, timed)
                out.append(Sample(name, p, size, max(elapsed)))
    return out


def _time_one(transport: LocalTransport, algorithm: str, nbytes: int, repeats: int) -> float:
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    best = math.inf
    for _ in range(repeats):
        barrier(transport)
        start = time.perf_counter()
        allreduce(transport, buf, ReduceOp.SUM, algorithm)
        best = min(best, time.perf_counter() - start)
    return best


def measure(
    transport_factory: Callable[[int], Sequence[LocalTransport]] = LocalTransport.create,
    **options: object,
) -> CostParams:
    """``fit(sample(transport_factory, **options))``: measure a few sizes and fit."""
    return fit(sample(transport_factory, **options))  # type: ignore[arg-type]
