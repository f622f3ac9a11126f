"""``algorithm="auto"``: the cost model, fitted to this group's transport, picks the algorithm.

The first ``allreduce(..., algorithm="auto")`` of a group (or ``tune``) runs a
short measurement on every rank together (they all make that call): each
candidate algorithm at ``FIT_BYTES``, from a fresh copy of the input each time
(as a training step's gradients are), in rounds over the algorithms, median of
``REPEATS`` (more at the cheaper sizes), largest size first after ``WARMUP``
untimed rounds. The ranks take the element-wise maximum of their timings (the
slowest rank sets the pace), so every rank fits the same numbers and later
choices agree without talking.

Two levels, as NCCL's tuner keeps a latency and a bandwidth per algorithm::

    params   = cost_model.fit(samples)            alpha, beta, gamma of the transport
    model(a, n)  = cost_model.predict(a, p, n, params)
    ratio(a, n)  = measured / model at each FIT_BYTES size, interpolated in log n
                   (the nearest measured size outside the range)
    predict(a, n) = model(a, n) * ratio(a, n)     what "auto" compares
    choose(n)     = argmin over candidates        per call, no messages

Then, the first "auto" call of each power-of-two size class (from 64 KiB) times
the model's close candidates at that very size (``trial``), and keeps the
fastest for the class: the model ranks, a measurement settles close calls, and
overruling the model's own pick takes a second, head-to-head measurement.
After that the class's calls keep probing the trial's runner-up now and then,
on a copy of the input, and swap the two when it proves faster (``Arm``).

The ratio carries what the shared parameters cannot: on a host where ranks
share few cores, algorithms that keep fewer ranks busy at once (star, chain)
lose less to contention than the critical-path model says; caches favour
smaller messages. ``explain`` prints both columns.

A backend's own allreduce ("native" on gloo and NCCL) is one more candidate:
the backend hands a callable per name (``own``), timed, tried and probed like
cgraph's algorithms; with no formula of its own it is modelled as ``STAND_IN``
times its measured ratio. A group on several nodes also times two ranks of one
node and two of two nodes (``measure_links``), from which ``fit`` tells the
links inside a node (alpha, beta) from those between (alpha_inter, beta_inter).
The timing itself is ``measurement``'s.

A ``Tuner`` (the end of this module) holds one group's results and applies them
call by call, so a communicator only says how to run its own allreduce and how
to wrap collective work in its error handling (``TunedComm``)::

    TorchComm (gloo)    Tuner(ProcessGroupTransport, own={"native": pg allreduce}, guard)
    first auto call     tune: calibrate (every candidate, "native" too) -> Calibration
    each auto call      arm(n): the size class's Arm (its trial on first use)
                        arm.due() -> probe(arm, ...)   else run choose(n)

An ``auto`` call's measuring (calibration and trial together) stops once it has
taken ``AUTO_SHARE`` of the group's timeout: meanwhile this rank's peers on its
other teams wait for it under that timeout, and load stretches the measuring.
``tune``, asked for by name, measures in full.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from cgraph._log import logger
from cgraph.comm.algorithms import allreduce, barrier, runs_on
from cgraph.comm.algorithms.reduction_server import DEPTH
from cgraph.comm.transport import Transport
from cgraph.comm.tuning import cost_model
from cgraph.comm.tuning.cost_model import CostParams, Sample
from cgraph.comm.tuning.measurement import FIT_BYTES as FIT_BYTES
from cgraph.comm.tuning.measurement import REPEATS as REPEATS
from cgraph.comm.tuning.measurement import Run as Run
from cgraph.comm.tuning.measurement import deadline, out_of_time, run_candidate, slowest_rank_times
from cgraph.comm.tuning.measurement import measure as measure
from cgraph.comm.tuning.measurement import measure_links as measure_links
from cgraph.comm.tuning.measurement import ranks_per_node as ranks_per_node
from cgraph.comm.types import ReduceOp

FALLBACK = "ring"
"""The choice without a calibration (bandwidth-optimal at any world size)."""
TRIAL_MIN_BYTES = 64 << 10
"""Smaller ``auto`` calls follow the calibrated model alone (a trial costs more than it saves)."""
TRIAL_CANDIDATES = 6
"""How many of the model's best candidates a size-class trial times (6: all of them)."""
TRIAL_WINDOW = 2.0
"""A trial times only the candidates the calibrated model puts within this factor of its best:
wider than the calibration's own error (a 1.5x window once left the best out:
docs/design-notes.md, "Numbers behind the code")."""
OVERRULE = 0.97
"""In the head-to-head, the challenger's median time ratio to the model's pick must be below
this; probes (``Arm``) use it too, for the mean of their ratios."""
RATIO_CLIP = 3.0
"""A probe counts one ratio as at most this (one stalled call cannot decide alone)."""
TRIAL_REPEATS = 3
"""Fewest timed rounds over the candidates in a trial (after one warm-up round)."""
TRIAL_MAX_REPEATS = 15
"""Most timed rounds: cheap sizes get more, since close candidates need them to separate."""
TRIAL_BUDGET_S = 1.0
"""Predicted time a trial's timed rounds aim at, which sets their number between the two."""
PROBE_FIRST = 8
"""A size class's first probe (see ``Arm``) is its ``PROBE_FIRST``-th call after the trial
(or after a switch); the gap to the next doubles after each probe, up to..."""
PROBE_MAX_INTERVAL = 256
"""...one probe every this many calls (a probe costs about 1.5 calls: 0.6% then)."""
PROBE_MIN = 4
"""Fewest probes before the challenger can take over (even: each order as often)."""
PROBE_WINDOW = 6
"""The challenger takes over when the mean of the last this many probe ratios is below
OVERRULE (checked over an even count, so that each order weighs alike)."""
DEFAULT_PARAMS = CostParams(alpha=2e-5, beta=2e-10, gamma=2e-10)
"""Shared parameters when the samples cannot be fitted (the ratios still calibrate)."""
STAND_IN = "ring"
"""The formula of a candidate without one (``own``): gloo's and NCCL's allreduces are rings (or
trees) in native code; the measured ratio at each size carries how far they differ from it."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A group's fitted model: shared parameters and per-algorithm ratios at measured sizes."""

    world_size: int
    ranks_per_node: int
    params: CostParams
    sizes: tuple[int, ...]
    ratios: dict[str, tuple[float, ...]]  # algorithm -> measured / model, per size
    cores: int = 0  # the fewest CPUs any rank may run on (0: not measured)

    @classmethod
    def of(cls, samples: Sequence[Sample], links: Sequence[Sample] = ()) -> Calibration:
        """Fit ``samples`` (one world size, every candidate at the same sizes) and ``links``
        (two-rank samples, ``measure_links``: they feed the fit, not the ratios)."""
        first = samples[0]
        rpn = first.ranks_per_node or first.world_size
        params = fit([*samples, *links])
        sizes = tuple(sorted({s.nbytes for s in samples}))
        ratios: dict[str, list[float]] = {}
        for s in sorted(samples, key=lambda s: s.nbytes):
            model = cost_model.predict(formula(s.algorithm), s.world_size, s.nbytes, params, rpn)
            ratios.setdefault(s.algorithm, []).append(s.seconds / model if model > 0 else 1.0)
        return cls(first.world_size, rpn, params, sizes, {a: tuple(r) for a, r in ratios.items()})

    def model(self, algorithm: str, nbytes: int) -> float:
        return cost_model.predict(formula(algorithm), self.world_size, nbytes, self.params,
                                  self.ranks_per_node)

    def ratio(self, algorithm: str, nbytes: int) -> float:
        """measured / model for ``algorithm``, interpolated in log(nbytes) between sizes."""
        r, x = self.ratios[algorithm], math.log(max(nbytes, 1))
        xs = [math.log(s) for s in self.sizes]
        i = bisect.bisect_left(xs, x)
        if i == 0:
            return r[0]
        if i == len(xs):
            return r[-1]
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return r[i - 1] * (1 - w) + r[i] * w

    def predict(self, algorithm: str, nbytes: int) -> float:
        return self.model(algorithm, nbytes) * self.ratio(algorithm, nbytes)

    def choose(self, nbytes: int) -> str:
        """The candidate with the lowest calibrated prediction (table order breaks ties)."""
        if self.world_size == 1 or nbytes == 0:
            return FALLBACK
        return min(self.ratios, key=lambda a: self.predict(a, nbytes))

    def explain(self, nbytes: int) -> str:
        """Every candidate's terms, model time, ratio and calibrated time; marks the choice."""
        best, p = self.choose(nbytes), self.world_size
        pr = self.params
        inter = "" if pr.alpha_inter is None else \
            f", between nodes alpha={pr.inter[0]:.3g} s, beta={pr.inter[1]:.3g} s/B"
        lines = [
            f"allreduce of {nbytes} bytes over {p} ranks ({self.ranks_per_node} per node); "
            f"alpha={pr.alpha:.3g} s, beta={pr.beta:.3g} s/B, gamma={pr.gamma:.3g} s/B{inter}; "
            f"ratios measured at {', '.join(_size(s) for s in self.sizes)}",
            f"{'algorithm':<18}{'steps':>7}{'MB moved':>10}{'MB reduced':>12}"
            f"{'model':>12}{'ratio':>8}{'calibrated':>13}",
        ]
        for name in self.ratios:
            t = cost_model.terms(formula(name), p, nbytes, self.ranks_per_node)
            mark = "  <- auto" if name == best else ""
            label = name if formula(name) == name else f"{name} ({STAND_IN})"
            lines.append(
                f"{label:<18}{t.steps + t.steps_inter:>7.0f}{(t.moved + t.moved_inter) / 1e6:>10.2f}"
                f"{t.reduced / 1e6:>12.2f}"
                f"{_ms(self.model(name, nbytes)):>12}{self.ratio(name, nbytes):>8.2f}"
                f"{_ms(self.predict(name, nbytes)):>13}{mark}"
            )
        return "\n".join(lines)


def formula(name: str) -> str:
    """The cost formula ``name`` is modelled with: its own, or ``STAND_IN``'s."""
    return name if name in cost_model.COST else STAND_IN


def fit(samples: Sequence[Sample]) -> CostParams:
    """``cost_model.fit`` of the samples with a formula of their own; ``DEFAULT_PARAMS`` when
    they cannot be fitted. With one rank per node every link crosses nodes, and each
    algorithm's inter-node terms total its one-node terms: one class is fitted, the
    inter-node one (fit cannot solve for an intra-node class no sample uses)."""
    usable = [s for s in samples if s.algorithm in cost_model.COST]
    apart = bool(usable) and all(s.ranks_per_node == 1 for s in usable)
    try:
        if not apart:
            return cost_model.fit(usable)
        one = cost_model.fit([replace(s, ranks_per_node=None) for s in usable])
    except ValueError:
        return DEFAULT_PARAMS
    return replace(one, alpha_inter=one.alpha, beta_inter=one.beta)


def size_class(nbytes: int) -> int:
    """One trial (and one ``Arm``) per power of two of the message size."""
    return max(nbytes - 1, 1).bit_length()


def calibrate(transport: Transport, sizes: Sequence[int] = FIT_BYTES, repeats: int = REPEATS,
              own: Mapping[str, Run] | None = None,
              deadline: float | None = None) -> Calibration | None:
    """Measure (``own``: the backend's allreduces, as candidates) and fit, with the
    ``measure_links`` of a group on several nodes; every rank calls. None for one rank.
    Past ``deadline`` (``measurement.out_of_time``) each size left gets one round."""
    if transport.world_size == 1:
        return None
    samples = measure(transport, sizes, repeats, own, deadline=deadline)
    calibration = Calibration.of(samples, measure_links(transport, repeats, deadline))
    cores = np.array([len(os.sched_getaffinity(0))], dtype=np.int64)
    allreduce(transport, cores, ReduceOp.MIN, "ring")  # every rank the same count
    return replace(calibration, cores=int(cores[0]))


def trial_repeats(calibration: Calibration, names: Sequence[str], nbytes: int) -> int:
    """Timed rounds for a trial of ``names``: as many as fit ``TRIAL_BUDGET_S`` by the
    model, within [``TRIAL_REPEATS``, ``TRIAL_MAX_REPEATS``]. Every rank holds the
    same calibration, so every rank gets the same number."""
    one_round = sum(calibration.predict(a, nbytes) for a in names)
    fit = int(TRIAL_BUDGET_S / one_round) if one_round > 0 else TRIAL_MAX_REPEATS
    return max(TRIAL_REPEATS, min(TRIAL_MAX_REPEATS, fit))


def trial(transport: Transport, calibration: Calibration, nbytes: int,
          keep: int = TRIAL_CANDIDATES, repeats: int | None = None,
          own: Mapping[str, Run] | None = None) -> str:
    """Time the model's ``keep`` best candidates at ``nbytes`` itself; the fastest wins.

    The calibrated model is good at ranking algorithms far apart and poor at
    separating close ones on a crowded host (it interpolates between the fitted
    sizes), so the first ``auto`` call of each power-of-two size class settles
    it by measurement:

    1. the candidates the model puts within ``TRIAL_WINDOW`` of its best run in
       rounds; each round's times are divided by that round's fastest (a burst of
       load slows a whole round, not one algorithm), and the lowest median
       ratio wins;
    2. when that winner is not the model's own pick, the two meet again head to
       head over ``2 * repeats`` rounds, and the challenger must be faster by
       ``1 - OVERRULE`` in the median of their per-round ratio: overruling the
       model takes two measurements, since one short trial on a shared host can
       be wrong by 25% and more.

    Every rank calls this with the same ``nbytes`` (they all make the same
    collective call); the slowest rank's time in each round decides, so every
    rank picks the same algorithm.
    """
    return trial_arm(transport, calibration, nbytes, keep, repeats, own).incumbent


def trial_arm(transport: Transport, calibration: Calibration, nbytes: int,
              keep: int = TRIAL_CANDIDATES, repeats: int | None = None,
              own: Mapping[str, Run] | None = None, deadline: float | None = None) -> Arm:
    """``trial``, kept as an ``Arm``: its winner runs, its runner-up is probed later.

    With a ``deadline`` (``measurement.out_of_time``: every rank agrees), the ranks
    stop measuring once it has passed. Before the trial, the model's pick runs and its
    runner-up is probed; before the head to head, the model's pick runs and the
    trial's winner is probed: the probes take the second measurement's place."""
    ranked = sorted(calibration.ratios, key=lambda a: calibration.predict(a, nbytes))
    best_pred = calibration.predict(ranked[0], nbytes)
    ranked = [a for a in ranked if calibration.predict(a, nbytes) <= TRIAL_WINDOW * best_pred]
    ranked = ranked[:keep]
    if len(ranked) == 1:
        return Arm(ranked[0], None)
    if out_of_time(transport, deadline):
        return Arm(ranked[0], ranked[1])
    if repeats is None:
        repeats = trial_repeats(calibration, ranked, nbytes)
    scores = _round_scores(slowest_rank_times(transport, ranked, nbytes, repeats, 1, own, deadline))
    order = [ranked[i] for i in np.argsort(scores, kind="stable")]
    _debug("trial", nbytes, ranked, scores)
    winner, runner_up = order[0], order[1]
    if winner == ranked[0]:
        return Arm(winner, runner_up)
    if out_of_time(transport, deadline):
        return Arm(ranked[0], winner)
    pair = [ranked[0], winner]
    times = slowest_rank_times(transport, pair, nbytes, 2 * repeats, 0, own, deadline)
    challenger = float(np.median(times[:, 1] / times[:, 0]))
    _debug("head to head", nbytes, pair, [1.0, challenger])
    return Arm(winner, ranked[0]) if challenger < OVERRULE else Arm(ranked[0], winner)


@dataclass(slots=True)
class Arm:
    """``auto``'s algorithm for one size class, kept honest over the group's life.

    A trial is a few rounds on a shared host at one moment; its verdict between
    close candidates can be wrong, or stop being right when the load changes. So
    the ``auto`` calls of the class keep a challenger (the trial's runner-up):
    now and then (``PROBE_FIRST`` calls after the trial, then after gaps that
    double up to ``PROBE_MAX_INTERVAL``) a call is a *probe*: it runs the incumbent
    on the user's tensor as usual and the challenger on a copy of the input, back
    to back in alternating order, and records the slowest rank's time ratio of
    the two (``probe``). When the mean of the last ``PROBE_WINDOW`` ratios (an
    even count, at least ``PROBE_MIN``: each order weighs alike) is below
    ``OVERRULE``, the two swap places and probing starts over. Every rank holds
    the same arm and the same (rank-maximum) ratios, so all switch on the same
    call; between switches a call's result is the incumbent's, bit for bit.
    """

    incumbent: str
    challenger: str | None
    calls: int = 0
    next_probe: int = 0
    interval: int = 0
    ratios: list[float] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    scratch: np.ndarray | None = field(default=None, repr=False)  # the probes' buffer

    def __post_init__(self) -> None:
        self.history.append(self.incumbent)
        self._restart()

    def due(self) -> bool:
        """Count one ``auto`` call of the class; True when it is a probe."""
        self.calls += 1
        return self.challenger is not None and self.calls >= self.next_probe

    def record(self, ratio: float) -> None:
        """One probe's challenger / incumbent time (the slowest rank's each)."""
        self.ratios.append(min(ratio, RATIO_CLIP))
        recent = self.ratios[-PROBE_WINDOW:]
        balanced = len(recent) % 2 == 0  # as many probes of each order
        if balanced and len(recent) >= PROBE_MIN and float(np.mean(recent)) < OVERRULE:
            assert self.challenger is not None
            self.incumbent, self.challenger = self.challenger, self.incumbent
            self.history.append(self.incumbent)
            self._restart()
            return
        self.interval = min(2 * self.interval, PROBE_MAX_INTERVAL)
        self.next_probe = self.calls + self.interval

    def describe(self) -> str:
        """One line for ``explain``: what runs, against what, and the switches so far."""
        if self.challenger is None:
            return f"measured: {self.incumbent} runs (the only close candidate; {self.calls} calls)"
        ratios = ", ".join(f"{r:.2f}" for r in self.ratios) or "none yet"
        return (f"measured: {self.incumbent} runs ({' -> '.join(self.history)}), probed against "
                f"{self.challenger} (its time ratios since the last switch: {ratios}; "
                f"{self.calls} calls, next probe at call {self.next_probe})")

    def _restart(self) -> None:
        self.ratios = []
        self.interval = PROBE_FIRST
        self.next_probe = self.calls + PROBE_FIRST


def probe(transport: Transport, arm: Arm, arr: np.ndarray, op: ReduceOp,
          own: Mapping[str, Run] | None = None) -> None:
    """One probe call (see ``Arm``): ``arr`` gets the incumbent's result.

    The incumbent runs on ``arr`` (the user's call) and the challenger on a copy
    of the input in a buffer the arm keeps (a fresh 4 MiB allocation per probe,
    and its unmapping, skewed the two timings by up to 2x on these VMs). Who goes
    first alternates: on a VM whose idle vCPUs halt, the first collective after
    a pause ran 20-30% slower than the next one, so one fixed order would favour
    the second.
    """
    assert arm.challenger is not None
    if arm.scratch is None or arm.scratch.nbytes < arr.nbytes:
        arm.scratch = np.empty(arr.nbytes, dtype=np.uint8)
    copy = arm.scratch[:arr.nbytes].view(arr.dtype).reshape(arr.shape)
    np.copyto(copy, arr)
    runs = [(arm.incumbent, arr), (arm.challenger, copy)]
    if len(arm.ratios) % 2:
        runs.reverse()
    times = np.empty(2, dtype=np.float64)
    for name, buf in runs:
        barrier(transport)
        start = time.perf_counter()
        run_candidate(transport, name, buf, op, own)
        times[0 if buf is arr else 1] = time.perf_counter() - start
    allreduce(transport, times, ReduceOp.MAX, "ring")
    before = arm.incumbent
    arm.record(float(times[1] / max(times[0], 1e-12)))
    if arm.incumbent != before:
        logger.debug("auto at %s: %s now runs instead of %s (probes %s)", _size(arr.nbytes),
                     arm.incumbent, before, arm.history)

def _debug(what: str, nbytes: int, names: Sequence[str], ratios: Iterable[float]) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("auto %s at %s: %s", what, _size(nbytes),
                     ", ".join(f"{n} {r:.2f}" for n, r in zip(names, ratios, strict=True)))


def _round_scores(times: np.ndarray) -> np.ndarray:
    """Each column's median of time / the fastest time of its round; the lowest wins
    (ties: the first, i.e. the model's order).

    The median, not the mean: some algorithms are bimodal on a shared host (a
    sequential chain is fast while the ranks' cores are free, 2x slower while
    another process holds one), and a trial lasts a fraction of a second, so
    whether a burst of load falls into it is chance; the mean let one such burst
    decide (ring kept over a chain 15-30% faster in two benchmark runs). The
    trial estimates the typical time; the long-run mean is the probes' business
    (``Arm``), which pair the two over the group's life.
    """
    return np.asarray(np.median(times / np.maximum(times.min(axis=1, keepdims=True), 1e-12), axis=0))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


# --------------------------------------------------------------------------- a group's state
AUTO_SHARE = 0.25
"""The part of the group's ``timeout_s`` after which an ``auto`` call's first-use measuring
stops, at the end of the round under way (``measurement.out_of_time``); what it leaves
unmeasured, the model's pick decides and the probes check (``autotune.trial_arm``).

Rank 0 of ``split_2d(g, 2)`` allreduces over row (0 1), then column (0 2): it waits in the
column's signature check, under gloo's timeout, while rank 2 still measures on row (2 3).
A team's first calls measured for 0.5-2 s on 2 idle cores and 7-15 s beside two busy
loops: unbounded, a busier host took them past a 30 s timeout. A quarter leaves room for
the round under way and for waits that chain through a second team."""


_T = TypeVar("_T")


class Guard(Protocol):
    """A backend's error handling around collective work: ``guard(what, work)`` returns
    ``work()``, and turns a failure in it into the group's error."""

    def __call__(self, what: str, work: Callable[[], _T], /) -> _T: ...


class Tuner:
    """One group's ``auto``: its ``Calibration``, an ``Arm`` per size class, and the backend's
    own allreduces (``own``), which compete with cgraph's algorithms.

    Every rank holds the same state and changes it on the same call: the first
    ``arm``, ``choose`` or ``tune`` measures and fits (``calibrate``), and the
    first ``arm`` of a size class from ``TRIAL_MIN_BYTES`` runs its trial. Both
    are collective; they run inside ``guard(what, work)``, the backend's error
    handling, which returns ``work()``. The backend runs the pick itself (the
    backend's own allreduce on its own tensor, where it has one).
    """

    def __init__(self, transport: Transport, own: Mapping[str, Run] | None = None,
                 guard: Guard | None = None,
                 sizes: Sequence[int] = FIT_BYTES, repeats: int = REPEATS,
                 timeout_s: float | None = None) -> None:
        self.transport, self.own = transport, dict(own or {})
        self.sizes, self.repeats = tuple(sizes), repeats  # what ``tune`` measures by default
        # an auto call's measuring stops after this (None: never; ``tune`` never does)
        self.budget_s = None if timeout_s is None else AUTO_SHARE * timeout_s
        self._guard: Guard = guard or (lambda what, work: work())
        self.calibration: Calibration | None = None
        self.tuned = False
        self.arms: dict[int, Arm] | None = {}  # size class -> its arm; None: the model alone

    @property
    def params(self) -> CostParams | None:
        return None if self.calibration is None else self.calibration.params

    def choose(self, nbytes: int) -> str:
        """The candidate ``auto`` runs for ``nbytes`` now."""
        arm = self.arm(nbytes)
        if arm is not None:
            return arm.incumbent
        return FALLBACK if self.calibration is None else self.calibration.choose(nbytes)

    def arm(self, nbytes: int) -> Arm | None:
        """The size class's trial-settled arm; None where the model alone decides."""
        until = None  # this call's measuring stops there (``AUTO_SHARE``)
        if not self.tuned and self.transport.world_size > 1:
            until = deadline(self.budget_s)
            self._calibrate(self.sizes, self.repeats, until)
        calibration = self.calibration
        if calibration is None or self.arms is None or nbytes < TRIAL_MIN_BYTES:
            return None
        key = size_class(nbytes)
        if key not in self.arms:
            until = deadline(self.budget_s) if until is None else until
            self.arms[key] = self._guard("autotune trial", lambda: trial_arm(
                self.transport, calibration, nbytes, own=self.own, deadline=until))
        return self.arms[key]

    def measured(self, nbytes: int) -> str | None:
        """What the trial and the probes of ``nbytes``'s size class found (None: no trial yet)."""
        arm = None if self.arms is None else self.arms.get(size_class(nbytes))
        return None if arm is None else arm.describe()

    def probe(self, arm: Arm, arr: np.ndarray, op: ReduceOp) -> None:
        """``probe`` on this group, ``arr`` getting the incumbent's result."""
        self._guard("allreduce auto probe", lambda: probe(self.transport, arm, arr, op, self.own))

    def tune(self, sizes: Sequence[int] | None = None, repeats: int | None = None) -> None:
        """Measure and fit now (every rank calls); the size classes' trials start over."""
        self._calibrate(sizes or self.sizes, repeats or self.repeats, None)

    def _calibrate(self, sizes: Sequence[int], repeats: int, until: float | None) -> None:
        self.calibration = self._guard("autotune", lambda: calibrate(
            self.transport, sizes, repeats, self.own, until))
        self.tuned, self.arms = True, {}

    def set_params(self, params: CostParams | None) -> None:
        """Use ``params`` (uncalibrated, every ratio 1) instead of measuring; the same on every
        rank! None: measure on the next ``auto`` call. The backend's own allreduces come
        first: each ties its ``STAND_IN``, whose work it does in native code, and wins it."""
        if params is None:
            self.calibration, self.tuned, self.arms = None, False, {}
            return
        self.arms = None  # the user's parameters decide: no measured trials
        rpn = ranks_per_node(self.transport)
        runs = runs_on(self.transport)
        names = (*self.own, *(a for a in cost_model.candidates(rpn) if a in runs))
        self.calibration = Calibration(self.transport.world_size, rpn, params, (1,),
                                       {a: (1.0,) for a in names})
        self.tuned = True

    def options(self, name: str, nbytes: int) -> dict[str, int]:
        """``name``'s options from the fitted model: the reduction server's slice size
        (``cost_model.slice_bytes``); none before a calibration (the algorithm's default).
        Every rank holds the same parameters, so every rank cuts the same slices."""
        calibration = self.calibration
        if name != "reduction_server" or calibration is None:
            return {}
        p, rpn = self.transport.world_size, ranks_per_node(self.transport)
        # Slices overlap only where a node has a core to spare for each stage in flight;
        # where its ranks take every core, each slice only adds its messages' latency.
        depth = 1 if 0 < calibration.cores <= rpn else DEPTH
        return {"slice_bytes": cost_model.slice_bytes(p, nbytes, calibration.params, rpn, depth=depth)}

    def inherit(self, parent: Tuner) -> None:
        """A team of the parent's very ranks keeps the parent's calibration."""
        if parent.transport.world_size == self.transport.world_size:
            self.calibration, self.tuned = parent.calibration, parent.tuned


class TunedComm:
    """What a backend's communicator answers for ``tuning`` (``tune``, ``choose_algorithm``,
    ``explain``, the cost parameters): its ``tuner``'s state. A subclass provides ``tuner``."""

    if TYPE_CHECKING:  # an attribute or a property
        @property
        def tuner(self) -> Tuner: ...

    @property
    def calibration(self) -> Calibration | None:
        """The group's fitted model (None before the first "auto" or ``tune``)."""
        return self.tuner.calibration

    @property
    def params(self) -> CostParams | None:
        """The fitted cost-model parameters (None before the first "auto" or ``tune``)."""
        return self.tuner.params

    def choose(self, nbytes: int) -> str:
        """What "auto" runs for ``nbytes`` now; measures (every rank calls) on first use."""
        return self.tuner.choose(nbytes)

    def measured(self, nbytes: int) -> str | None:
        """What the trial and the probes of ``nbytes``'s size class found (None: no trial yet)."""
        return self.tuner.measured(nbytes)

    def tune(self, sizes: Sequence[int] | None = None, repeats: int | None = None) -> None:
        """Measure this group (every rank calls) and calibrate the cost model."""
        self.tuner.tune(sizes, repeats)

    def set_params(self, params: CostParams | None) -> None:
        """Use ``params`` for "auto" instead of measuring (the same on every rank!)."""
        self.tuner.set_params(params)
