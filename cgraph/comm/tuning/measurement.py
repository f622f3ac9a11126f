"""Timing allreduce candidates on a live group: what ``autotune`` fits and tries.

Every rank calls together. A candidate is one of cgraph's algorithms (run over
the group's ``Transport``) or a backend's own allreduce, handed in as ``own``
(name -> ``Run``: "native" on gloo and NCCL), timed by the same loop::

    measure(t)            every candidate at FIT_BYTES, in rounds over the candidates,
                          median per size; the ranks' element-wise maximum
    measure_links(t)      a group on several nodes: two ranks of one node and two of
                          two nodes (``link_pairs``), LINK_ALGORITHMS at LINK_BYTES
    slowest_rank_times    each round's time per candidate, the maximum over the ranks
    deadline, out_of_time a bound on the rounds: after each one the ranks agree
                          whether any is past its deadline, and all stop together

    layout  a a b b  ->  link_pairs: (0 1) inside node a, (0 2) between a and b

The slowest rank sets the pace of a collective, and taking every time's
maximum over the ranks gives each rank the same numbers, so whatever is
computed from them (a fit, a trial's winner) agrees without further messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from cgraph.comm.algorithms import allreduce, barrier, runs_on
from cgraph.comm.teams import Team, TeamTransport, node_teams
from cgraph.comm.transport import Transport, node_layout
from cgraph.comm.tuning import cost_model
from cgraph.comm.tuning.cost_model import Sample
from cgraph.comm.types import ReduceOp

FIT_BYTES: tuple[int, ...] = (256 << 10, 4 << 20, 32 << 20)
"""Sizes timed by the measurement (float32 buffers of this many bytes), up to large
gradient buckets (DDP's default is 25 MiB): whole-buffer algorithms fall off a cache
cliff between 16 and 32 MiB that sliced ones do not. Beyond, the largest's ratio holds."""
REPEATS = 3
"""Timings per algorithm at the largest size (2 * REPEATS + 1 at the others); the median counts."""
WARMUP = 1
"""Untimed rounds before the largest size (the first one grows the links' slots)."""
LINK_ALGORITHMS = ("butterfly", "ring")
"""What a link pair times: on two ranks butterfly reduces every byte it moves and ring half,
so the pairs alone separate beta from gamma."""
LINK_BYTES = (16 << 10, 1 << 20)
"""The link pairs' sizes: one where latency dominates, one where bandwidth does."""
Run = Callable[[np.ndarray, ReduceOp], None]
"""A backend's own allreduce as a candidate: in place on a numpy buffer, every rank calling."""


def ranks_per_node(transport: Transport) -> int:
    """The size of the largest node of the transport (the reduction server's L)."""
    counts: dict[object, int] = {}
    for r in range(transport.world_size):
        node = transport.node_of(r)
        counts[node] = counts.get(node, 0) + 1
    return max(counts.values())


def deadline(budget_s: float | None) -> float | None:
    """``budget_s`` from now on this rank's clock (the one ``out_of_time`` reads); None: none."""
    return None if budget_s is None else time.perf_counter() + budget_s


def out_of_time(transport: Transport, deadline: float | None) -> bool:
    """Whether any rank is past its ``deadline``: the same answer on every rank (every rank
    calls; one 8-byte allreduce). Without a deadline, False and no message."""
    if deadline is None:
        return False
    late = np.array([float(time.perf_counter() >= deadline)])
    allreduce(transport, late, ReduceOp.MAX, "ring")
    return bool(late[0])


def measure(transport: Transport, sizes: Sequence[int] = FIT_BYTES, repeats: int = REPEATS,
            own: Mapping[str, Run] | None = None, names: Sequence[str] = (),
            deadline: float | None = None) -> list[Sample]:
    """Time every candidate (cgraph's algorithms, then ``own``'s; or ``names``) at ``sizes``
    on all ranks; identical samples on every rank. Past ``deadline`` (``out_of_time``), each
    remaining size gets one round."""
    rpn = ranks_per_node(transport)
    runs = runs_on(transport)
    names = tuple(names) or (*(a for a in cost_model.candidates(rpn) if a in runs), *(own or {}))
    local = np.empty((len(names), len(sizes)), dtype=np.float64)
    # Largest size first, after WARMUP rounds: the links' slots grow (new segments,
    # page faults) on their first large messages, which is not the algorithm's time.
    for k, j in enumerate(sorted(range(len(sizes)), key=lambda j: -sizes[j])):
        # the largest size costs most; smaller ones are cheap and noisier: time them more
        count = repeats if k == 0 else 2 * repeats + 1
        local[:, j] = _median_times(transport, names, sizes[j], count, WARMUP if k == 0 else 0, own,
                                    deadline)
    allreduce(transport, local, ReduceOp.MAX, "ring")
    p = transport.world_size
    return [
        Sample(name, p, nbytes, float(local[i, j]), rpn)
        for i, name in enumerate(names)
        for j, nbytes in enumerate(sizes)
    ]


def _median_times(transport: Transport, names: Sequence[str], nbytes: int, repeats: int,
                  warmup: int, own: Mapping[str, Run] | None,
                  deadline: float | None) -> list[float]:
    """Each algorithm's median time at ``nbytes`` on this rank (see ``round_times``)."""
    times = round_times(transport, names, nbytes, repeats, warmup, own, deadline)
    return [float(v) for v in np.median(times, axis=0)]


def round_times(transport: Transport, names: Sequence[str], nbytes: int, repeats: int,
                warmup: int, own: Mapping[str, Run] | None = None,
                deadline: float | None = None) -> np.ndarray:
    """This rank's time of every algorithm in each timed round: shape (rounds, names).

    The algorithms run in rounds over all of them, from a fresh copy of the input
    each time, so that a burst of load from elsewhere on the host hits every
    algorithm of a round alike. With a ``deadline``, the ranks stop together after
    the first round that ends with one of them past it (``out_of_time``); stopped
    in the warmup, its last round counts as the one timed round."""
    source = np.random.default_rng(transport.rank).random(max(1, nbytes // 4), dtype=np.float32)
    buf = np.empty_like(source)
    times = np.empty((warmup + max(1, repeats), len(names)), dtype=np.float64)
    for r in range(times.shape[0]):
        for i, name in enumerate(names):
            np.copyto(buf, source)
            barrier(transport)
            start = time.perf_counter()
            run_candidate(transport, name, buf, ReduceOp.SUM, own)
            times[r, i] = time.perf_counter() - start
        if r < times.shape[0] - 1 and out_of_time(transport, deadline):
            return times[min(r, warmup) : r + 1]
    return times[warmup:]


def run_candidate(transport: Transport, name: str, buf: np.ndarray, op: ReduceOp,
                  own: Mapping[str, Run] | None) -> None:
    """One candidate's allreduce: the backend's own (``own``), else cgraph's over ``transport``."""
    if own and name in own:
        own[name](buf, op)
    else:
        allreduce(transport, buf, op, name)


def link_pairs(layout: Sequence[Hashable]) -> tuple[tuple[int, int], ...]:
    """Two ranks of one node, then two of two nodes (``measure_links``); () on one node or
    for a group that is itself one pair, and no first pair where no node has two ranks.
    Both pairs hold the same rank, so they run one after the other though every rank
    starts at once."""
    teams = node_teams(layout)
    if len(teams) < 2 or len(layout) < 3:
        return ()
    home = next((t for t in teams if t.size > 1), teams[0])
    away = next(t for t in teams if t is not home)
    inside = ((home.ranks[0], home.ranks[1]),) if home.size > 1 else ()
    return (*inside, (home.ranks[0], away.ranks[0]))


def measure_links(transport: Transport, repeats: int = REPEATS,
                  deadline: float | None = None) -> list[Sample]:
    """Time ``link_pairs`` (every rank calls; the pairs' members time ``LINK_ALGORITHMS`` at
    ``LINK_BYTES``): two-rank samples whose links all lie inside one node or all between two.

    The group's own samples mix the two link classes, each algorithm in its own
    proportion; that determines all five parameters only while every algorithm keeps
    to its formula. Real ones stray by their own factors (0.7 to 3 on 4 gloo ranks of
    2 cores), and a fit of those mixtures alone put the inter-node bandwidth 10x off
    (tests/unit/test_collective_autotune_gloo.py); samples of one class each hold it.
    The other ranks wait in the closing maximum, which hands every rank the pairs' times.
    """
    layout = node_layout(transport)
    pairs = link_pairs(layout)
    cells = [(name, nbytes) for name in LINK_ALGORITHMS for nbytes in LINK_BYTES]  # measure's order
    times = np.zeros((len(pairs), len(cells)), dtype=np.float64)
    for i, pair in enumerate(pairs):
        if transport.rank in pair:
            team = TeamTransport(transport, Team(pair))
            times[i] = [s.seconds for s in measure(team, LINK_BYTES, repeats, names=LINK_ALGORITHMS,
                                                   deadline=deadline)]
    if pairs:
        allreduce(transport, times, ReduceOp.MAX, "ring")
    return [Sample(name, 2, nbytes, float(times[i, j]), 2 if layout[a] == layout[b] else 1)
            for i, (a, b) in enumerate(pairs) for j, (name, nbytes) in enumerate(cells)]


def slowest_rank_times(transport: Transport, names: Sequence[str], nbytes: int, repeats: int,
                       warmup: int, own: Mapping[str, Run] | None = None,
                       deadline: float | None = None) -> np.ndarray:
    """``round_times`` with each entry the largest over the ranks (same on every rank)."""
    times = round_times(transport, names, nbytes, repeats, warmup, own, deadline)
    times = np.ascontiguousarray(times)
    allreduce(transport, times, ReduceOp.MAX, "ring")
    return times
