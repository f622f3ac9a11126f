"""``auto`` with a backend's own allreduce ("native") among the candidates, and the
inter-node link class fitted on a live group; no Ray, no torch.

Ranks are threads over a ``LocalTransport``. Where a test needs known timings, a
fake clock per thread advances by what the cost model says each call costs under
``TRUE`` (cgraph's algorithms run for real, so results are checked too), and the
fake "native" is a real ring that "costs" ``factor`` times ring's model time::

    perf_counter()         this thread's fake clock
    allreduce(t, buf, a)   real, then clock += predict(a, p, nbytes, TRUE, ranks/node)
    native(buf, op)        real ring, then clock += factor * predict("ring", ...)
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable

import numpy as np
import pytest

from cgraph.comm.algorithms import allreduce as real_allreduce
from cgraph.comm.transport import Transport
from cgraph.comm.tuning import autotune, cost_model, measurement
from cgraph.comm.tuning.autotune import Tuner
from cgraph.comm.tuning.cost_model import CostParams
from cgraph.comm.types import ReduceOp
from tests.fabric import LocalTransport, run_ranks

TRUE = CostParams(alpha=1e-4, beta=1e-9, gamma=5e-10, alpha_inter=1e-3, beta_inter=8e-9)
SIZES = (4 << 10, 64 << 10, 512 << 10)
CANDIDATES = {"native", *cost_model.COST}
HOST_RATIOS = {"star": 0.74, "chain": 0.84, "tree": 1.14, "butterfly": 1.72, "ring": 2.16,
               "reduction_server": 3.09}
"""measured / model of each algorithm on 4 gloo ranks of a 2-core host, as ``explain`` showed
them once: real algorithms stray from their formulas by their own factors."""


def _model(name: str, transport: Transport, nbytes: int) -> float:
    return cost_model.predict(name, transport.world_size, nbytes, TRUE,
                              measurement.ranks_per_node(transport))


class FakeClock:
    """A clock per thread (per rank), advanced only by the modelled calls."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.slowdown: dict[str, float] = {}  # per algorithm, on groups of more than 2 ranks

    def perf_counter(self) -> float:
        return float(getattr(self._local, "now", 0.0))

    def advance(self, seconds: float) -> None:
        self._local.now = self.perf_counter() + seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()

    def modelled(transport, buf, op=ReduceOp.SUM, algorithm="ring"):  # type: ignore[no-untyped-def]
        real_allreduce(transport, buf, op, algorithm)
        factor = clock.slowdown.get(algorithm, 1.0) if transport.world_size > 2 else 1.0
        clock.advance(factor * _model(algorithm, transport, buf.nbytes))

    monkeypatch.setattr(measurement, "allreduce", modelled)
    fake_time = types.SimpleNamespace(perf_counter=clock.perf_counter)
    monkeypatch.setattr(measurement, "time", fake_time)
    monkeypatch.setattr(autotune, "time", fake_time)
    return clock


def _native(transport: Transport, clock: FakeClock | None, factor: float,
            calls: list[int] | None = None) -> Callable[[np.ndarray, ReduceOp], None]:
    """A stand-in for gloo's allreduce on this rank: a real ring, ``factor`` x ring's model time."""

    def run(buf: np.ndarray, op: ReduceOp) -> None:
        real_allreduce(transport, buf, op, "ring")
        if clock is not None:
            clock.advance(factor * _model("ring", transport, buf.nbytes))
        if calls is not None:
            calls.append(buf.nbytes)

    return run


def _approx(got: CostParams, want: CostParams) -> None:
    for field in ("alpha", "beta", "gamma", "alpha_inter", "beta_inter"):
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-6), field


# --------------------------------------------------------------------------- native as a candidate
@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_native_wins_where_it_is_faster_and_loses_where_it_is_not(clock: FakeClock,
                                                                  factor: float) -> None:
    checks = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB

    def rank(t):  # type: ignore[no-untyped-def]
        tuner = Tuner(t, {"native": _native(t, clock, factor)}, sizes=SIZES, repeats=1)
        tuner.tune()
        calibration = tuner.calibration
        return calibration, [calibration.choose(n) for n in checks]

    out = run_ranks(LocalTransport.create(4), rank)
    calibration, picks = out[0]
    assert all(o[1] == picks for o in out), "every rank picks the same, with no messages"
    assert calibration.ratios["native"] == pytest.approx((factor,) * len(SIZES))
    assert calibration.ratios["ring"] == pytest.approx((1.0,) * len(SIZES))
    assert (calibration.params.alpha, calibration.params.beta, calibration.params.gamma) == \
        pytest.approx((TRUE.alpha, TRUE.beta, TRUE.gamma), rel=1e-6), "native stays out of the fit"
    if factor < 1:
        assert picks[-1] == "native", "half ring's time: native wins the large sizes"
    else:
        assert "native" not in picks
        assert picks[-1] == "shared", \
            "twice ring's time: the model's best wins where native would have (ring's bytes, 2 barriers)"
    assert "native (ring)" in calibration.explain(1 << 20)


def test_trial_and_probes_time_native_and_the_user_gets_its_result(clock: FakeClock) -> None:
    nbytes = 256 << 10
    inputs = [np.random.default_rng(r).random(nbytes // 4, dtype=np.float32) for r in range(3)]

    def rank(t):  # type: ignore[no-untyped-def]
        calls: list[int] = []
        tuner = Tuner(t, {"native": _native(t, clock, 0.5, calls)}, sizes=SIZES, repeats=1)
        arm = tuner.arm(nbytes)  # measures, fits, then the size class's trial
        after_trial, results = len(calls), []
        for _ in range(autotune.PROBE_FIRST):
            buf = inputs[t.rank].copy()
            if arm.due():
                tuner.probe(arm, buf, ReduceOp.SUM)
            else:
                _native(t, None, 1.0)(buf, ReduceOp.SUM)  # what the backend runs for "native"
            results.append(buf)
        return arm.incumbent, arm.challenger, after_trial, len(calls), results, tuner.measured(nbytes)

    expected = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    out = run_ranks(LocalTransport.create(3), rank)
    for incumbent, challenger, after_trial, total, results, measured in out:
        assert (incumbent, challenger) == out[0][:2] and incumbent == "native"
        assert after_trial > 2 * len(SIZES), "calibration and the trial ran native"
        assert total == after_trial + 1, "the probe ran native on the user's buffer"
        for buf in results:
            np.testing.assert_allclose(buf, expected, rtol=1e-5)
        assert measured is not None and "native runs" in measured


def test_a_spent_budget_stops_the_measuring_and_keeps_the_model_s_pick(clock: FakeClock) -> None:
    """The group's timeout bounds a first auto call's measuring (``autotune.AUTO_SHARE``): past
    it, one round per size left (a warmup's counts), no trial; every rank stops alike."""
    nbytes = 256 << 10

    def rank(t):  # type: ignore[no-untyped-def]
        calls: list[int] = []
        tuner = Tuner(t, {"native": _native(t, clock, 0.5, calls)}, sizes=SIZES, repeats=3,
                      timeout_s=1e-6)  # spent by the first round
        arm = tuner.arm(nbytes)  # would measure 18 rounds, then the size class's trial
        calibration = tuner.calibration
        return arm.incumbent, arm.challenger, calibration.choose(nbytes), calibration.sizes, calls

    out = run_ranks(LocalTransport.create(3), rank)
    for incumbent, challenger, model_pick, sizes, calls in out:
        assert (incumbent, challenger) == out[0][:2]
        assert incumbent == model_pick, "no trial: the calibrated model's pick runs"
        assert challenger is not None, "...and its runner-up is probed later"
        assert sizes == SIZES, "every size is still measured"
        assert len(calls) == len(SIZES), "one round per size"


def test_real_timings_still_give_every_rank_the_same_pick() -> None:
    """No fake clock: noisy times, yet the slowest rank's numbers decide on every rank."""

    def rank(t):  # type: ignore[no-untyped-def]
        tuner = Tuner(t, {"native": _native(t, None, 1.0)}, sizes=(4 << 10, 64 << 10), repeats=1)
        return [tuner.choose(n) for n in (1 << 10, 32 << 10, 1 << 20)]

    picks = run_ranks(LocalTransport.create(3), rank)
    assert all(p == picks[0] for p in picks)
    assert set(picks[0]) <= CANDIDATES


def test_given_params_let_native_win_ring_s_ties() -> None:
    def rank(t):  # type: ignore[no-untyped-def]
        t.arena = None  # no node workspace, as over gloo: "shared" (fewer barriers) does not run
        tuner = Tuner(t, {"native": _native(t, None, 1.0)})
        tuner.set_params(CostParams(alpha=1e-5, beta=1e-9, gamma=1e-10))
        picks = (tuner.choose(64 << 20), tuner.arm(64 << 20))
        tuner.set_params(None)
        return picks, tuner.calibration, tuner.tuned

    for (pick, arm), calibration, tuned in run_ranks(LocalTransport.create(4), rank):
        assert pick == "native" and arm is None, "the user's parameters decide, no trials"
        assert calibration is None and not tuned


def test_a_team_of_the_same_ranks_inherits_the_calibration() -> None:
    def rank(t):  # type: ignore[no-untyped-def]
        parent = Tuner(t, {"native": _native(t, None, 1.0)})
        parent.set_params(CostParams(alpha=1e-5, beta=1e-9, gamma=1e-10))
        same, smaller = Tuner(t), Tuner(LocalTransport.create(2)[0])  # a team of fewer ranks
        same.inherit(parent)
        smaller.inherit(parent)
        return same.calibration is parent.calibration, smaller.calibration

    assert run_ranks(LocalTransport.create(3), rank) == [(True, None)] * 3


# --------------------------------------------------------------------------- two link classes
@pytest.mark.parametrize(("layout", "pairs"), [
    ((0, 0, 0, 0), ()),              # one node: nothing to tell apart
    ((0, 1), ()),                    # the group is the one pair
    ((0, 0, 1, 1), ((0, 1), (0, 2))),
    (("b", "a", "a"), ((1, 2), (1, 0))),  # the first node with two ranks
    ((0, 1, 2), ((0, 1),)),          # one rank per node: no pair inside a node
])
def test_link_pairs(layout: tuple[object, ...], pairs: tuple[tuple[int, int], ...]) -> None:
    assert measurement.link_pairs(layout) == pairs


def test_inter_node_params_are_recovered_on_two_nodes(clock: FakeClock) -> None:
    def rank(t):  # type: ignore[no-untyped-def]
        return autotune.calibrate(t, SIZES, 1, {"native": _native(t, clock, 0.8)})

    out = run_ranks(LocalTransport.create(4, (0, 0, 1, 1)), rank)
    assert all(c == out[0] for c in out)
    _approx(out[0].params, TRUE)
    assert out[0].ranks_per_node == 2 and set(out[0].ratios) == CANDIDATES
    assert "between nodes alpha=0.001 s" in out[0].explain(1 << 20)


def test_the_link_pairs_hold_the_fit_where_the_algorithms_stray(clock: FakeClock) -> None:
    """Why the pairs: the group's own samples on two nodes determine all five parameters
    when every algorithm keeps its formula, but real ones stray by their own factors
    (``HOST_RATIOS``), and a fit of the mixtures alone then puts the inter-node bandwidth
    several times off; the pairs' samples, each of one link class, hold it."""
    clock.slowdown = HOST_RATIOS  # the 4-rank group's calls; the pairs keep their formulas

    def rank(t):  # type: ignore[no-untyped-def]
        return measurement.measure(t, SIZES, 1), measurement.measure_links(t, 1)

    samples, links = run_ranks(LocalTransport.create(4, (0, 0, 1, 1)), rank)[0]
    assert {(s.world_size, s.ranks_per_node) for s in links} == {(2, 2), (2, 1)}
    both, alone = autotune.fit([*samples, *links]), autotune.fit(samples)
    assert (both.alpha_inter, both.beta_inter) == \
        pytest.approx((TRUE.alpha_inter, TRUE.beta_inter), rel=0.2)
    assert alone.beta_inter != pytest.approx(TRUE.beta_inter, rel=0.5)


def test_one_rank_per_node_fits_the_inter_node_class(clock: FakeClock) -> None:
    out = run_ranks(LocalTransport.create(3, (0, 1, 2)), lambda t: autotune.calibrate(t, SIZES, 1))
    params = out[0].params
    assert (params.alpha_inter, params.beta_inter, params.gamma) == \
        pytest.approx((TRUE.alpha_inter, TRUE.beta_inter, TRUE.gamma), rel=1e-6)
    assert (params.alpha, params.beta) == (params.alpha_inter, params.beta_inter)


def test_one_node_measures_no_links() -> None:
    out = run_ranks(LocalTransport.create(3), lambda t: measurement.measure_links(t))
    assert out == [[], [], []]


def test_the_reduction_server_slices_as_the_fitted_model_says() -> None:
    """Before a calibration: the algorithm's default; after: ``cost_model.slice_bytes``."""
    from cgraph.comm.tuning.autotune import Tuner
    from cgraph.comm.tuning.cost_model import CostParams, slice_bytes
    from tests.fabric import LocalTransport

    t = LocalTransport.create(4, node_of=[0, 0, 1, 1])[0]
    tuner = Tuner(t)
    assert tuner.options("reduction_server", 16 << 20) == {}
    params = CostParams(1e-4, 3e-10, 1e-10, alpha_inter=2e-4, beta_inter=7e-10)
    tuner.set_params(params)
    assert tuner.options("reduction_server", 16 << 20) == {"slice_bytes": slice_bytes(4, 16 << 20, params, 2)}
    assert tuner.options("ring", 16 << 20) == {}


def test_where_a_nodes_ranks_take_every_core_the_slices_do_not_overlap() -> None:
    """cores <= ranks per node: the model without overlap (depth 1), whose best is one slice
    as large as the choices allow (each slice only adds its messages' latency)."""
    import dataclasses

    from cgraph.comm.tuning.autotune import Tuner
    from cgraph.comm.tuning.cost_model import SLICE_CHOICES, CostParams, slice_bytes
    from tests.fabric import LocalTransport

    tuner = Tuner(LocalTransport.create(4, node_of=[0, 0, 1, 1])[0])
    params = CostParams(1e-4, 3e-10, 1e-10, alpha_inter=2e-4, beta_inter=7e-10)
    tuner.set_params(params)
    assert tuner.calibration is not None
    tuner.calibration = dataclasses.replace(tuner.calibration, cores=2)
    assert tuner.options("reduction_server", 16 << 20) == {"slice_bytes": slice_bytes(4, 16 << 20, params, 2, depth=1)}
    assert tuner.options("reduction_server", 16 << 20) == {"slice_bytes": SLICE_CHOICES[-1]}
    tuner.calibration = dataclasses.replace(tuner.calibration, cores=64)
    assert tuner.options("reduction_server", 16 << 20) == {"slice_bytes": slice_bytes(4, 16 << 20, params, 2)}
