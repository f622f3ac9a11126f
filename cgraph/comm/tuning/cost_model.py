"""The alpha-beta-gamma cost model of the collective algorithms (seed 003).

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
    shared            B + 2(m-1) S'      2(L-1) n/L              (L-1) n/L        B barriers: 2; 3 from
                                         + 2(m-1) n/(L m)        + (m-1) n/(L m)  12 MiB; 4 above 32 MiB/L

Star, chain and tree are Thakur-Rabenseifner-Gropp's (2005) and seed 003's
formulas; the slice counts S follow the defaults of the implementations. Ring
and the reduction server move the bandwidth-optimal 2(p-1)/p n bytes; the
reduction server trades ring's 2(p-1) latencies for 2(L+m-2). Without
``ranks_per_node`` neither the reduction server nor shared is a candidate (they need a layout).

    explain(16, 64 << 20, CostParams(alpha=1e-5, beta=1e-9, gamma=1e-10)) ->
    algorithm            steps   MB moved  MB reduced     predicted
    star                    30   2013.266    1006.633       2.114 s
    chain                  156    163.578      81.789    173.317 ms
    tree                     8    536.871     268.435    563.794 ms
    butterfly                4    268.435     268.435    295.319 ms
    ring                    30    125.829      62.915    132.421 ms  <- best

The model counts a blocking transport: slices add latencies, and the stages of
slices in flight are not credited with overlapping.

Two link classes. With ``ranks_per_node`` (L ranks per node, ranks numbered node
by node, m nodes) each algorithm's steps and bytes split into those on links
within a node (alpha, beta) and between nodes (``alpha_inter``, ``beta_inter``):
ring and chain move in lock step, so on m > 1 nodes every step waits for an
inter-node link and all of it counts there; star's root talks to p-L ranks on
other nodes; tree's top ceil(log2 m) levels and butterfly's distances >= L cross
nodes; the reduction server keeps 2(L-1) steps and 2(L-1)/L n bytes inside
nodes and sends only 2(m-1)/(L m) n across. Equal parameters give the
one-class totals above. ``fit`` determines the inter-node pair too when its
samples have inter-node terms (several layouts).

``fit`` recovers (alpha, beta, gamma) by least squares on relative error; beta
and gamma can only be told apart if some samples reduce a different share of
the bytes they move (butterfly moves as many bytes as it reduces, the others
twice as many), which the tests' ``fabric.sample`` ensures by timing every algorithm.

Reduce-scatter and all-gather, an allreduce's halves (``collective_terms``, n the
whole buffer): steps, moved, reduced; a level over k ranks sends k-1 times n/k:

    reducescatter ring           p-1           (p-1) n/p              (p-1) n/p
    reducescatter hierarchical   L-1 + m-1     (L-1) n/L + (m-1) n/p  (p-1) n/p
    allgather ring, hierarchical as above                             0

where hierarchical sends only the m-1 and (m-1)/p n across nodes (its local
staging copy is not counted). ``slice_bytes`` credits the overlap those rows do
not (links that work at once, as under NCCL): in S slices, one slice's four
stages take t_k each (alphas in full, bytes / S); the first slice fills the
pipeline, each later one adds the slowest stage (or a depth-th of a slice), so
more slices hide more bytes but pay every alpha again:

    T(S) = sum t_k + (S - 1) * max(max t_k, sum t_k / depth)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from cgraph.comm.algorithms import (
    ALGORITHMS,
    chain,
    reduction_server,
    ring,
    shared,
)


@dataclass(frozen=True, slots=True)
class CostParams:
    """Seconds per message (alpha), per byte moved (beta), per byte reduced (gamma); for
    links between nodes ``alpha_inter`` / ``beta_inter`` (None: the same as within one)."""

    alpha: float
    beta: float
    gamma: float
    alpha_inter: float | None = None
    beta_inter: float | None = None

    @property
    def inter(self) -> tuple[float, float]:
        """(alpha, beta) of a link between nodes."""
        return (self.alpha if self.alpha_inter is None else self.alpha_inter,
                self.beta if self.beta_inter is None else self.beta_inter)


TERM_NAMES = ("latency", "bandwidth", "inter-node latency", "inter-node bandwidth", "reduction")


@dataclass(frozen=True, slots=True)
class Terms:
    """The coefficients of alpha, beta and gamma in one algorithm's time; ``steps`` and
    ``moved`` count links within a node, ``steps_inter`` and ``moved_inter`` those between."""

    steps: float
    moved: float
    reduced: float
    steps_inter: float = 0.0
    moved_inter: float = 0.0

    def parts(self, params: CostParams) -> tuple[float, ...]:
        """Seconds of each of ``TERM_NAMES``."""
        alpha_inter, beta_inter = params.inter
        return (self.steps * params.alpha, self.moved * params.beta, self.steps_inter * alpha_inter,
                self.moved_inter * beta_inter, self.reduced * params.gamma)

    def time(self, params: CostParams) -> float:
        return sum(self.parts(params))

    def __add__(self, other: Terms) -> Terms:
        """The terms of running ``self`` then ``other``."""
        return Terms(*np.add(dataclasses.astuple(self), dataclasses.astuple(other)).tolist())

    def dominant(self, params: CostParams) -> str:
        """The name of the largest part (``TERM_NAMES``)."""
        parts = self.parts(params)
        return TERM_NAMES[parts.index(max(parts))]


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured allreduce."""

    algorithm: str
    world_size: int
    nbytes: int
    seconds: float
    ranks_per_node: int | None = None


def _nodes(p: int, rpn: int) -> int:
    return math.ceil(p / rpn)


def _star(p: int, n: int, rpn: int) -> Terms:
    # the root's node: L-1 messages each way within it, p-L across
    return Terms(2 * (rpn - 1), 2 * (rpn - 1) * n, (p - 1) * n, 2 * (p - rpn), 2 * (p - rpn) * n)


def _chain(p: int, n: int, rpn: int) -> Terms:
    s = max(1, math.ceil(n / chain.SLICE_BYTES))
    hops = p + s - 2
    return _across(Terms(2 * hops, 2 * hops * n / s, hops * n / s), _nodes(p, rpn))


def _tree(p: int, n: int, rpn: int) -> Terms:
    levels = (p - 1).bit_length()
    inter = (_nodes(p, rpn) - 1).bit_length()  # the levels whose partners sit on other nodes
    return Terms(2 * (levels - inter), 2 * (levels - inter) * n, levels * n, 2 * inter, 2 * inter * n)


def _butterfly(p: int, n: int, rpn: int) -> Terms:
    k, e = p.bit_length() - 1, int(p & (p - 1) != 0)
    inter = max(0, k - (rpn - 1).bit_length()) if _nodes(p, rpn) > 1 else 0  # distances >= rpn
    fold = 2 * e if _nodes(p, rpn) > 1 else 0  # the extra ranks fold in from far away
    return Terms(k - inter + 2 * e - fold, (k - inter + 2 * e - fold) * n, (k + e) * n, inter + fold,
                 (inter + fold) * n)


def _ring(p: int, n: int, rpn: int) -> Terms:
    s = max(1, math.ceil(n / (p * ring.SLICE_BYTES)))
    return _sliced(_ring_half(p, n, rpn, True) + _ring_half(p, n, rpn, False), s)


def _reduction_server(p: int, n: int, rpn: int) -> Terms:
    s = max(1, math.ceil(n / reduction_server.SLICE_BYTES))
    return _sliced(_hierarchical_half(p, n, rpn, True) + _hierarchical_half(p, n, rpn, False), s)


def _shared(p: int, n: int, rpn: int) -> Terms:
    """Every chunk but its own in and out ((L-1)/L n each way: through the workspace, or
    read from the peers from ``CMA_MIN_BYTES``), one chunk reduced from L inputs, one step
    per barrier (2; 3 reading peers; 4 where one set of slots spans the workspace); then
    the rail's ring."""
    local, nodes = min(p, rpn), _nodes(p, rpn)
    if local == 1:  # nothing to share: the algorithm runs the reduction server (a ring)
        return _reduction_server(p, n, rpn)
    barriers = 3 if n >= shared.CMA_MIN_BYTES else 4 if 2 * local * n > shared.DOUBLE_BUFFER_BYTES else 2
    node = Terms(barriers, 2 * (local - 1) * n / local, (local - 1) * n / local)
    if nodes == 1:
        return node
    return node + _level(nodes, n / local, True, inter=True) + _level(nodes, n / local, False, inter=True)


def _level(k: int, n: float, reduces: bool, inter: bool = False) -> Terms:
    """A reduce-scatter (``reduces``) or all-gather over k ranks: k-1 messages of n/k."""
    share = (k - 1) * n / k
    folded = share if reduces else 0.0
    return Terms(0, 0, folded, k - 1, share) if inter else Terms(k - 1, share, folded)


def _two_levels(p: int, n: float, rpn: int, reduces: bool) -> tuple[Terms, Terms]:
    """The intra-node level (L ranks, n bytes) and the rails' (m ranks, n/L bytes)."""
    return _level(rpn, n, reduces), _level(_nodes(p, rpn), n / rpn, reduces, inter=True)


def _ring_half(p: int, n: int, rpn: int, reduces: bool) -> Terms:
    """A ring reduce-scatter (``reduces``) or all-gather: one level, in lock step."""
    return _across(_level(p, n, reduces), _nodes(p, rpn))


def _hierarchical_half(p: int, n: int, rpn: int, reduces: bool) -> Terms:
    return sum(_two_levels(p, n, rpn, reduces), Terms(0, 0, 0))


def _sliced(t: Terms, slices: int) -> Terms:
    """``t`` run as ``slices`` slices: every latency paid per slice, the bytes once."""
    return dataclasses.replace(t, steps=t.steps * slices, steps_inter=t.steps_inter * slices)


def _across(t: Terms, nodes: int) -> Terms:
    """A lock-step algorithm over several nodes: every step waits for its slowest link,
    one between nodes, so all its steps and bytes count as inter-node."""
    return t if nodes == 1 else Terms(0, 0, t.reduced, t.steps, t.moved)


COST: dict[str, Callable[[int, int, int], Terms]] = {
    "star": _star,
    "chain": _chain,
    "tree": _tree,
    "butterfly": _butterfly,
    "ring": _ring,
    "reduction_server": _reduction_server,
    "shared": _shared,
}
"""The terms of each algorithm in ``ALGORITHMS`` (a test checks every one has a row)."""

COLLECTIVE_COST: dict[str, dict[str, Callable[[int, int, int], Terms]]] = {"allreduce": COST} | {
    kind: {"ring": functools.partial(_ring_half, reduces=reduces),
           "hierarchical": functools.partial(_hierarchical_half, reduces=reduces)}
    for kind, reduces in (("reducescatter", True), ("allgather", False))
}
"""Each kind's rows, named as in its registry (``REDUCESCATTER_ALGORITHMS``, ...)."""


def terms(algorithm: str, world_size: int, nbytes: int, ranks_per_node: int | None = None) -> Terms:
    """``collective_terms`` of the allreduce ``algorithm``: its alpha, beta, gamma coefficients."""
    return collective_terms("allreduce", algorithm, world_size, nbytes, ranks_per_node)


def collective_terms(
    kind: str, algorithm: str, world_size: int, nbytes: int, ranks_per_node: int | None = None
) -> Terms:
    """The coefficients of ``algorithm`` for a ``kind`` collective of ``nbytes`` (the whole
    buffer) over ``world_size`` ranks, ``ranks_per_node`` to a node (module tables).

    Raises:
        ValueError: unknown kind or algorithm, or a world size below 1.
    """
    if kind not in COLLECTIVE_COST:
        raise ValueError(f"no cost formulas for {kind!r}; known: {sorted(COLLECTIVE_COST)}")
    table = COLLECTIVE_COST[kind]
    if algorithm not in table:
        raise ValueError(f"no cost formula for {algorithm!r} ({kind}); known: {sorted(table)}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size == 1 or nbytes == 0:
        return Terms(0, 0, 0)
    rpn = min(world_size, ranks_per_node or world_size)
    return table[algorithm](world_size, nbytes, rpn)


def predict(
    algorithm: str, world_size: int, nbytes: int, params: CostParams,
    ranks_per_node: int | None = None,
) -> float:
    """Predicted seconds of one allreduce of ``nbytes`` over ``world_size`` ranks."""
    return terms(algorithm, world_size, nbytes, ranks_per_node).time(params)


def predict_collective(kind: str, algorithm: str, world_size: int, nbytes: int,
                       params: CostParams, ranks_per_node: int | None = None) -> float:
    """Predicted seconds of one ``kind`` collective (``COLLECTIVE_COST``) of ``nbytes``."""
    return collective_terms(kind, algorithm, world_size, nbytes, ranks_per_node).time(params)


SLICE_CHOICES = tuple(1 << k for k in range(18, 25))
"""The slice sizes ``slice_bytes`` weighs: the powers of two from 256 KiB to 16 MiB."""


def pipelined_time(stages: Sequence[Terms], slices: int, params: CostParams, depth: int) -> float:
    """``T(S)`` of the module docstring, ``stages`` being one slice's, S = ``slices``."""
    times = [t.time(params) for t in stages]
    return sum(times) + (slices - 1) * max(max(times), sum(times) / max(1, depth))


def slice_bytes(
    world_size: int, nbytes: int, params: CostParams, ranks_per_node: int | None = None,
    name: str = "reduction_server", depth: int = reduction_server.DEPTH,
) -> int:
    """The size in ``SLICE_CHOICES`` with the lowest ``pipelined_time`` of ``name``'s stages
    (the smallest on ties: less staging), for ``allreduce(..., name, slice_bytes=)``.

    Raises:
        ValueError: ``name`` is not the reduction server (the one pipelined model).
    """
    if name != "reduction_server":
        raise ValueError(f"slice_bytes models the 'reduction_server' pipeline, not {name!r}")
    rpn = min(world_size, ranks_per_node or world_size)
    times = []
    for size in SLICE_CHOICES:
        slices = max(1, math.ceil(nbytes / size))
        rs, ag = (_two_levels(world_size, nbytes / slices, rpn, r) for r in (True, False))
        times.append(pipelined_time((*rs, *ag[::-1]), slices, params, depth))  # STAGES order
    return SLICE_CHOICES[times.index(min(times))]


NEEDS_LAYOUT = ("reduction_server", "shared")
"""Algorithms that work per node: without a node layout (``ranks_per_node``) they are no candidates."""


def candidates(ranks_per_node: int | None = None) -> tuple[str, ...]:
    """The algorithms ``choose`` weighs: all, less ``NEEDS_LAYOUT`` without a node layout."""
    return tuple(a for a in ALGORITHMS if ranks_per_node is not None or a not in NEEDS_LAYOUT)


def choose(
    world_size: int, nbytes: int, params: CostParams, ranks_per_node: int | None = None
) -> str:
    """The candidate with the lowest predicted time (the first in table order on ties)."""
    names = candidates(ranks_per_node)
    return min(names, key=lambda a: predict(a, world_size, nbytes, params, ranks_per_node))


def explain(
    world_size: int, nbytes: int, params: CostParams, ranks_per_node: int | None = None,
    measured: dict[str, float] | None = None,
) -> str:
    """A table of every algorithm: each candidate's terms, predicted time, the term that
    dominates it and the ``measured`` seconds where given, the best prediction marked
    ``<- best``; an algorithm that is no candidate here says why."""
    best = choose(world_size, nbytes, params, ranks_per_node)
    layout = f", {ranks_per_node} ranks/node" if ranks_per_node else ""
    inter = ""
    if params.alpha_inter is not None or params.beta_inter is not None:
        inter = f"; between nodes alpha={params.inter[0]:.3g} s, beta={params.inter[1]:.3g} s/B"
    lines = [
        f"allreduce of {nbytes} bytes over {world_size} ranks{layout}; "
        f"alpha={params.alpha:.3g} s, beta={params.beta:.3g} s/B, gamma={params.gamma:.3g} s/B{inter}",
        f"{'algorithm':<18}{'steps':>8}{'MB moved':>11}{'MB reduced':>12}{'predicted':>14}  "
        f"{'dominant term':<22}{'measured':>10}",
    ]
    weighed = candidates(ranks_per_node)
    for name in ALGORITHMS:
        if name not in weighed:  # listed, with why it is not weighed
            lines.append(f"{name:<18}{'-':>8}{'-':>11}{'-':>12}{'-':>14}  not a candidate: it works per "
                         "node, and no node layout was given (pass ranks_per_node)")
            continue
        t = terms(name, world_size, nbytes, ranks_per_node)
        mark = "  <- best" if name == best else ""
        seen = _format_seconds(measured[name]) if measured and name in measured else "-"
        lines.append(
            f"{name:<18}{t.steps + t.steps_inter:>8.0f}{(t.moved + t.moved_inter) / 1e6:>11.3f}"
            f"{t.reduced / 1e6:>12.3f}{_format_seconds(t.time(params)):>14}  {t.dominant(params):<22}"
            f"{seen:>10}{mark}"
        )
    return "\n".join(lines)


def _format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds / 1e-9:.1f} ns"


def fit(samples: Iterable[Sample | tuple[str, int, int, float]]) -> CostParams:
    """Least-squares (alpha, beta, gamma) >= 0 minimising the relative error of ``samples``;
    also (alpha_inter, beta_inter) when some samples span several nodes.

    Raises:
        ValueError: fewer usable samples than parameters, or samples that cannot tell
            the parameters apart (e.g. no butterfly samples to separate beta from gamma).
    """
    rows = []
    for s in samples:
        s = s if isinstance(s, Sample) else Sample(*s)
        t = terms(s.algorithm, s.world_size, s.nbytes, s.ranks_per_node)
        if s.seconds > 0 and t.steps + t.steps_inter > 0:
            rows.append((t.steps, t.moved, t.reduced, t.steps_inter, t.moved_inter, s.seconds))
    table = np.array(rows, dtype=np.float64).reshape(-1, 6)
    inter = bool(table[:, 3:5].any())
    design = table[:, :5 if inter else 3] / table[:, 5:6]
    unknowns = design.shape[1]
    scale = np.abs(design).max(axis=0) if len(rows) else np.ones(unknowns)
    if len(rows) < unknowns or np.linalg.matrix_rank(design / np.where(scale > 0, scale, 1)) < unknowns:
        raise ValueError(
            f"{len(rows)} usable samples cannot determine the {unknowns} parameters; time "
            "several sizes and include butterfly (it alone reduces every byte it moves)"
            + (", and within one node as well as across nodes" if inter else "")
        )
    x = _nonnegative_lstsq(design / np.where(scale > 0, scale, 1), np.ones(len(rows))) / np.where(scale > 0, scale, 1)
    if not inter:
        return CostParams(float(x[0]), float(x[1]), float(x[2]))
    return CostParams(float(x[0]), float(x[1]), float(x[2]), float(x[3]), float(x[4]))


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
