"""``auto``'s size-class trial: every rank picks the same measured winner."""

from __future__ import annotations

import numpy as np
import pytest

from cgraph.comm.tuning import autotune, cost_model, measurement
from tests.fabric import LocalTransport, run_ranks


def _calibration(world_size: int) -> autotune.Calibration:
    names = cost_model.candidates(world_size)
    return autotune.Calibration(
        world_size, world_size, autotune.DEFAULT_PARAMS, (1,), {a: (1.0,) for a in names}
    )


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_trial_agrees_across_ranks_and_picks_a_ranked_candidate(world_size: int) -> None:
    calibration = _calibration(world_size)
    nbytes = 256 << 10
    ranked = sorted(calibration.ratios, key=lambda a: calibration.predict(a, nbytes))
    picks = run_ranks(
        LocalTransport.create(world_size),
        lambda t: autotune.trial(t, calibration, nbytes, keep=3, repeats=1),
    )
    assert len(set(picks)) == 1, f"ranks disagree: {picks}"
    assert picks[0] in ranked[:3]


def test_trial_repeats_scale_with_the_predicted_cost() -> None:
    calibration = _calibration(4)
    names = sorted(calibration.ratios)
    counts = [autotune.trial_repeats(calibration, names, n) for n in (1 << 10, 1 << 20, 1 << 30)]
    assert counts[0] == autotune.TRIAL_MAX_REPEATS, "tiny messages: as many rounds as allowed"
    assert counts[2] == autotune.TRIAL_REPEATS, "huge messages: the fewest rounds"
    assert counts[0] >= counts[1] >= counts[2]
    one_round = sum(calibration.predict(a, 1 << 20) for a in names)
    assert counts[1] == max(autotune.TRIAL_REPEATS,
                            min(autotune.TRIAL_MAX_REPEATS, int(autotune.TRIAL_BUDGET_S / one_round)))


def _paired_best(times: np.ndarray) -> int:
    return int(np.argmin(autotune._round_scores(times)))  # what trial_arm ranks first


def test_paired_best_discounts_a_slow_round() -> None:
    # round 2 is slowed for everyone (a burst of load): per-algorithm medians would
    # tie, the per-round ratios still see that algorithm 1 is 10% faster each round
    times = np.array([[1.0, 0.9, 1.5], [5.0, 4.5, 7.5], [1.0, 0.9, 1.5]])
    assert _paired_best(times) == 1
    assert _paired_best(np.array([[1.0, 1.0], [2.0, 2.0]])) == 0, "ties: model order"


def test_trial_skips_candidates_far_behind_the_model() -> None:
    names = cost_model.candidates(4)
    ratios = {a: (1.0,) for a in names}
    ratios[names[0]] = (10.0,)  # the model puts this one far behind every other
    calibration = autotune.Calibration(4, 4, autotune.DEFAULT_PARAMS, (1,), ratios)
    timed: list[list[str]] = []
    real = measurement.round_times

    def spy(transport, names_, nbytes, repeats, warmup, *rest):  # type: ignore[no-untyped-def]
        timed.append(list(names_))
        return real(transport, names_, nbytes, repeats, warmup, *rest)

    measurement.round_times = spy
    try:
        run_ranks(LocalTransport.create(4),
                  lambda t: autotune.trial(t, calibration, 256 << 10, repeats=1))
    finally:
        measurement.round_times = real
    assert timed and all(names[0] not in group for group in timed)


@pytest.mark.parametrize("model_pick_faster", [True, False])
def test_overruling_the_model_takes_a_head_to_head(model_pick_faster: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calibration = _calibration(2)
    ranked = sorted(calibration.ratios, key=lambda a: calibration.predict(a, 1 << 20))
    calls: list[list[str]] = []

    def fake(transport, names, nbytes, repeats, warmup, *rest):  # type: ignore[no-untyped-def]
        calls.append(list(names))
        if len(calls) <= 2:  # the first trial (one call per rank): the last candidate looks fastest
            return np.array([[1.0] * (len(names) - 1) + [0.5]] * repeats)
        challenger = 0.9 if not model_pick_faster else 1.1
        return np.array([[1.0, challenger]] * repeats)

    monkeypatch.setattr(measurement, "round_times", fake)
    picks = run_ranks(LocalTransport.create(2),
                      lambda t: autotune.trial(t, calibration, 1 << 20, repeats=2))
    first, second = calls[0], calls[2]  # each rank times the same groups, first trial first
    assert second == [ranked[0], first[-1]], "head to head: the model's pick vs the winner"
    assert picks == [ranked[0] if model_pick_faster else first[-1]] * 2


# --------------------------------------------------------------------------- probes
def _probe_calls(arm: autotune.Arm, calls: int, ratio: float) -> list[int]:
    """Drive ``arm`` for ``calls`` calls, every probe measuring ``ratio``; the probe calls."""
    probes = []
    for _ in range(calls):
        if arm.due():
            probes.append(arm.calls)
            arm.record(ratio)
    return probes


def test_probes_come_after_doubling_gaps_up_to_the_cap() -> None:
    arm = autotune.Arm("ring", "chain")
    probes = _probe_calls(arm, 2000, 1.0)
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert probes[0] == autotune.PROBE_FIRST
    assert gaps[:4] == [2 * autotune.PROBE_FIRST, 4 * autotune.PROBE_FIRST,
                        8 * autotune.PROBE_FIRST, 16 * autotune.PROBE_FIRST]
    assert max(gaps) == autotune.PROBE_MAX_INTERVAL and gaps[-1] == autotune.PROBE_MAX_INTERVAL
    assert arm.history == ["ring"], "a challenger no faster than the incumbent never takes over"


def test_a_faster_challenger_takes_over_after_enough_probes() -> None:
    arm = autotune.Arm("ring", "chain")
    fourth = 15 * autotune.PROBE_FIRST  # probes on calls F, 3F, 7F and 15F
    probes = _probe_calls(arm, fourth + 1, 0.8)
    assert arm.history == ["ring", "chain"] and (arm.incumbent, arm.challenger) == ("chain", "ring")
    assert len(probes) == autotune.PROBE_MIN, "the switch comes on the PROBE_MIN-th probe"
    assert arm.ratios == [] and arm.next_probe == probes[-1] + autotune.PROBE_FIRST, \
        "probing starts over after a switch"


def test_one_stalled_probe_cannot_switch_alone() -> None:
    arm = autotune.Arm("ring", "chain")
    for ratio in (50.0, 0.5, 0.5):  # a stalled call counts at most RATIO_CLIP times
        while not arm.due():
            pass
        arm.record(ratio)
    assert arm.history == ["ring"], "the mean of (3.0, 0.5, 0.5) is above OVERRULE"
    for more in range(3):  # (3.0 + 0.5 * k) / (3 + k) < OVERRULE from k = 5 on
        while not arm.due():
            pass
        arm.record(0.5)
        assert arm.history == (["ring", "chain"] if more == 2 else ["ring"])


def test_an_arm_without_a_challenger_never_probes() -> None:
    arm = autotune.Arm("star", None)
    assert not any(arm.due() for _ in range(1000))
    assert "only close candidate" in arm.describe()


def _slow(monkeypatch: pytest.MonkeyPatch, slow: str, seconds: float) -> None:
    real = measurement.allreduce

    def delayed(transport, buf, op, name):  # type: ignore[no-untyped-def]
        if name == slow:
            import time
            time.sleep(seconds)
        return real(transport, buf, op, name)

    monkeypatch.setattr(measurement, "allreduce", delayed)


def _inputs(world_size: int, n: int) -> list[np.ndarray]:
    return [np.random.default_rng(r).random(n, dtype=np.float32) for r in range(world_size)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_probing_switches_every_rank_on_the_same_call_and_keeps_results(
        world_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from cgraph.comm.algorithms import allreduce as run
    from cgraph.comm.types import ReduceOp

    _slow(monkeypatch, "star", 0.005)  # the incumbent is the slow one
    inputs = _inputs(world_size, 1000)
    expected = np.sum(np.stack(inputs).astype(np.float64), axis=0)

    def rank(t):  # type: ignore[no-untyped-def]
        arm, seen = autotune.Arm("star", "chain"), []
        for _ in range(15 * autotune.PROBE_FIRST + 10):  # the fourth probe (call 15F) switches
            buf = inputs[t.rank].copy()
            if arm.due():
                autotune.probe(t, arm, buf, ReduceOp.SUM)
            else:
                run(t, buf, ReduceOp.SUM, arm.incumbent)
            np.testing.assert_allclose(buf, expected, rtol=1e-5)
            seen.append(arm.incumbent)
        return seen

    seen = run_ranks(LocalTransport.create(world_size), rank)
    assert all(s == seen[0] for s in seen), "every rank switches on the same call"
    assert seen[0][0] == "star" and seen[0][-1] == "chain"


def test_a_probe_gives_the_user_the_incumbents_result_bit_for_bit() -> None:
    from cgraph.comm.algorithms import allreduce as run
    from cgraph.comm.types import ReduceOp

    inputs = _inputs(3, 4099)

    def rank(t):  # type: ignore[no-untyped-def]
        alone, other = inputs[t.rank].copy(), inputs[t.rank].copy()
        run(t, alone, ReduceOp.SUM, "ring")
        run(t, other, ReduceOp.SUM, "butterfly")
        assert not np.array_equal(alone, other), "the two must round differently for this test"
        probed = [inputs[t.rank].copy() for _ in range(2)]
        arm, kept = autotune.Arm("ring", "butterfly"), []
        for buf in probed:  # both orders: incumbent first, then challenger first
            autotune.probe(t, arm, buf, ReduceOp.SUM)
            kept.append(arm.scratch)
        assert kept[0] is kept[1], "the probes' buffers are kept, not allocated per probe"
        return alone, probed

    for alone, probed in run_ranks(LocalTransport.create(3), rank):
        for buf in probed:
            assert np.array_equal(buf, alone)
