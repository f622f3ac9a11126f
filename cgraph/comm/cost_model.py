"""The alpha-beta-gamma cost model of the allreduce algorithms (seed 003).

A message of b bytes costs ``alpha + b * beta`` and reducing b bytes costs
``b * gamma``. Each algorithm's time is linear in the three parameters,

    T = steps * alpha + moved * beta + reduced * gamma

where, along the critical path, ``steps`` counts message latencies, ``moved``
the bytes sent and ``reduced`` the bytes combined. With p ranks, n bytes,
l = ceil(log2 p), k = floor(log2 p), e = 1 if p is not a power of two else 0:

    algorithm         steps              moved                   reduced
    star              2(p-1)             2(p-1) n                (p-1) n
    chain             2(p+S-2)           2(p+S-2) n/S            (p+S-2) n/S      S = ceil(n / 1 MiB)
    tree              2 l                2 l n                   l n
    butterfly         k + 2e             (k + 2e) n              (k + e) n
    ring              2(p-1) S           2(p-1) n/p              (p-1) n/p        S = ceil(n / (p 8 MiB))
    reduction_server  2(L-1+m-1) S       2(L-1) n/L              (L-1) n/L        L ranks/node, m nodes,
                                         + 2(m-1) n/(L m)        + (m-1) n/(L m)  S = ceil(n / 4 MiB)

Star, chain and tree are Thakur-Rabenseifner-Gropp's (2005) and seed 003's
formulas; the slice counts S follow the defaults of the implementations. Ring
and the reduction server move the bandwidth-optimal 2(p-1)/p n bytes; the
reduction server trades ring's 2(p-1) latencies for 2(L+m-2). Without
``ranks_per_node`` the reduction server is not a candidate (it needs a layout).

    explain(16, 64 << 20, CostParams(alpha=1e-5, beta=1e-9, gamma=1e-10)) ->
    algorithm            steps   MB moved  MB reduced     predicted
    star                    30   2013.266    1006.633       2.114 s
    chain                  156    163.578      81.789    173.317 ms
    tree                     8    536.871     268.435    563.794 ms
    butterfly                4    268.435     268.435    295.319 ms
    ring                    30    125.829      62.915    132.421 ms  <- best

The model counts a blocking transport: slices add latencies, and the stages of
slices in flight are not credited with overlapping. One beta serves intra- and
inter-node links alike, so it cannot show the reduction server's real gain
(keeping most bytes on fast intra-node links); fit it per layout to see that.

``fit`` recovers (alpha, beta, gamma) by least squares on relative error; beta
and gamma can only be told apart if some samples reduce a different share of
the bytes they move (butterfly moves as many bytes as it reduces, the others
twice as many), which ``sample`` ensures by timing every algorithm.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from cgraph.comm.algorithms import (
    ALGORITHMS,
    allreduce,
    barrier,
    chain,
    reduction_server,
    ring,
)
from cgraph.comm.transport import LocalTransport, run_ranks
from cgraph.comm.types import ReduceOp


@dataclass(frozen=True, slots=True)
class CostParams:
    """Seconds per message (alpha), per byte moved (beta), per byte reduced (gamma)."""

    alpha: float
    beta: float
    gamma: float


@dataclass(frozen=True, slots=True)
class Terms:
    """The coefficients of alpha, beta and gamma in one algorithm's time."""

    steps: float
    moved: float
    reduced: float

    def time(self, params: CostParams) -> float:
        return self.steps * params.alpha + self.moved * params.beta + self.reduced * params.gamma


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured allreduce."""

    algorithm: str
    world_size: int
    nbytes: int
    seconds: float
    ranks_per_node: int | None = None


def _star(p: int, n: int, rpn: int) -> Terms:
    return Terms(2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n)


def _chain(p: int, n: int, rpn: int) -> Terms:
    s = max(1, math.ceil(n / chain.SLICE_BYTES))
    hops = p + s - 2
    return Terms(2 * hops, 2 * hops * n / s, hops * n / s)


def _tree(p: int, n: int, rpn: int) -> Terms:
    levels = (p - 1).bit_length()
    return Terms(2 * levels, 2 * levels * n, levels * n)


def _butterfly(p: int, n: int, rpn: int) -> Terms:
    k, e = p.bit_length() - 1, int(p & (p - 1) != 0)
    return Terms(k + 2 * e, (k + 2 * e) * n, (k + e) * n)


def _ring(p: int, n: int, rpn: int) -> Terms:
    s = max(1, math.ceil(n / (p * ring.SLICE_BYTES)))
    return Terms(2 * (p - 1) * s, 2 * (p - 1) * n / p, (p - 1) * n / p)


def _reduction_server(p: int, n: int, rpn: int) -> Terms:
    local, nodes = rpn, math.ceil(p / rpn)
    s = max(1, math.ceil(n / reduction_server.SLICE_BYTES))
    intra, inter = (local - 1) * n / local, (nodes - 1) * n / (local * nodes)
    return Terms(2 * (local - 1 + nodes - 1) * s, 2 * (intra + inter), intra + inter)


COST: dict[str, Callable[[int, int, int], Terms]] = {
    "star": _star,
    "chain": _chain,
    "tree": _tree,
    "butterfly": _butterfly,
    "ring": _ring,
    "reduction_server": _reduction_server,
}
"""The terms of each algorithm in ``ALGORITHMS`` (a test checks every one has a row)."""


def terms(algorithm: str, world_size: int, nbytes: int, ranks_per_node: int | None = None) -> Terms:
    """The alpha, beta and gamma coefficients of ``algorithm`` (see the module table).

    Raises:
        ValueError: unknown algorithm or a world size below 1.
    """
    if algorithm not in COST:
        raise ValueError(f"no cost formula for {algorithm!r}; known: {sorted(COST)}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size == 1 or nbytes == 0:
        return Terms(0, 0, 0)
    rpn = min(world_size, ranks_per_node or world_size)
    return COST[algorithm](world_size, nbytes, rpn)


def predict(
    algorithm: str,
    world_size: int,
    nbytes: int,
    params: CostParams,
    ranks_per_node: int | None = None,
) -> float:
    """Predicted seconds of one allreduce of ``nbytes`` over ``world_size`` ranks."""
    return terms(algorithm, world_size, nbytes, ranks_per_node).time(params)


def candidates(ranks_per_node: int | None = None) -> tuple[str, ...]:
    """The algorithms ``choose`` weighs: all, less reduction_server without a node layout."""
    return tuple(a for a in ALGORITHMS if ranks_per_node is not None or a != "reduction_server")


def choose(
    world_size: int, nbytes: int, params: CostParams, ranks_per_node: int | None = None
) -> str:
    """The candidate with the lowest predicted time (the first in table order on ties)."""
    names = candidates(ranks_per_node)
    return min(names, key=lambda a: predict(a, world_size, nbytes, params, ranks_per_node))


def explain(
    world_size: int, nbytes: int, params: CostParams, ranks_per_node: int | None = None
) -> str:
    """A table of every candidate's terms and predicted time, the best marked ``<- best``."""
    best = choose(world_size, nbytes, params, ranks_per_node)
    layout = f", {ranks_per_node} ranks/node" if ranks_per_node else ""
    lines = [
        f"allreduce of {nbytes} bytes over {world_size} ranks{layout}; "
        f"alpha={params.alpha:.3g} s, beta={params.beta:.3g} s/B, gamma={params.gamma:.3g} s/B",
        f"{'algorithm':<18}{'steps':>8}{'MB moved':>11}{'MB reduced':>12}{'predicted':>14}",
    ]
    for name in candidates(ranks_per_node):
        t = terms(name, world_size, nbytes, ranks_per_node)
        mark = "  <- best" if name == best else ""
        lines.append(
            f"{name:<18}{t.steps:>8.0f}{t.moved / 1e6:>11.3f}{t.reduced / 1e6:>12.3f}"
            f"{_format_seconds(t.time(params)):>14}{mark}"
        )
    return "\n".join(lines)


def _format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds / 1e-9:.1f} ns"


def fit(samples: Iterable[Sample | tuple[str, int, int, float]]) -> CostParams:
    """Least-squares (alpha, beta, gamma) >= 0 minimising the relative error of ``samples``.

    Raises:
        ValueError: fewer than three usable samples, or samples that cannot tell
            the parameters apart (e.g. no butterfly samples to separate beta from gamma).
    """
    rows = []
    for s in samples:
        s = s if isinstance(s, Sample) else Sample(*s)
        t = terms(s.algorithm, s.world_size, s.nbytes, s.ranks_per_node)
        if s.seconds > 0 and t.steps > 0:
            rows.append((t.steps / s.seconds, t.moved / s.seconds, t.reduced / s.seconds))
    design = np.array(rows, dtype=np.float64).reshape(-1, 3)
    scale = np.abs(design).max(axis=0) if len(rows) else np.ones(3)
    if len(rows) < 3 or np.linalg.matrix_rank(design / np.where(scale > 0, scale, 1)) < 3:
        raise ValueError(
            f"{len(rows)} usable samples cannot determine alpha, beta and gamma; time "
            "several sizes and include butterfly (it alone reduces every byte it moves)"
        )
    alpha, beta, gamma = _nonnegative_lstsq(design / scale, np.ones(len(rows))) / scale
    return CostParams(float(alpha), float(beta), float(gamma))


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0: drop negative coefficients and refit (3 unknowns)."""
    free = np.ones(a.shape[1], dtype=bool)
    x = np.zeros(a.shape[1])
    while free.any():
        x[:] = 0.0
        x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        if (x >= 0).all():
            return x
        free &= x > 0
    return x


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
