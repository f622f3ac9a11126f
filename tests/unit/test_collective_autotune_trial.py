"""``auto``'s size-class trial: every rank picks the same measured winner."""

from __future__ import annotations

import numpy as np
import pytest

from cgraph.collective import autotune, cost_model
from cgraph.collective.transport import LocalTransport, run_ranks


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


def test_paired_best_discounts_a_slow_round() -> None:
    # round 2 is slowed for everyone (a burst of load): per-algorithm medians would
    # tie, the per-round ratios still see that algorithm 1 is 10% faster each round
    times = np.array([[1.0, 0.9, 1.5], [5.0, 4.5, 7.5], [1.0, 0.9, 1.5]])
    assert autotune._paired_best(times) == 1
    assert autotune._paired_best(np.array([[1.0, 1.0], [2.0, 2.0]])) == 0, "ties: model order"


def test_trial_skips_candidates_far_behind_the_model() -> None:
    names = cost_model.candidates(4)
    ratios = {a: (1.0,) for a in names}
    ratios[names[0]] = (10.0,)  # the model puts this one far behind every other
    calibration = autotune.Calibration(4, 4, autotune.DEFAULT_PARAMS, (1,), ratios)
    timed: list[list[str]] = []
    real = autotune._round_times

    def spy(transport, names_, nbytes, repeats, warmup):  # type: ignore[no-untyped-def]
        timed.append(list(names_))
        return real(transport, names_, nbytes, repeats, warmup)

    autotune._round_times = spy
    try:
        run_ranks(LocalTransport.create(4),
                  lambda t: autotune.trial(t, calibration, 256 << 10, repeats=1))
    finally:
        autotune._round_times = real
    assert timed and all(names[0] not in group for group in timed)


@pytest.mark.parametrize("model_pick_faster", [True, False])
def test_overruling_the_model_takes_a_head_to_head(model_pick_faster: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calibration = _calibration(2)
    ranked = sorted(calibration.ratios, key=lambda a: calibration.predict(a, 1 << 20))
    calls: list[list[str]] = []

    def fake(transport, names, nbytes, repeats, warmup):  # type: ignore[no-untyped-def]
        calls.append(list(names))
        if len(calls) <= 2:  # the first trial (one call per rank): the last candidate looks fastest
            return np.array([[1.0] * (len(names) - 1) + [0.5]] * repeats)
        challenger = 0.9 if not model_pick_faster else 1.1
        return np.array([[1.0, challenger]] * repeats)

    monkeypatch.setattr(autotune, "_round_times", fake)
    picks = run_ranks(LocalTransport.create(2),
                      lambda t: autotune.trial(t, calibration, 1 << 20, repeats=2))
    first, second = calls[0], calls[2]  # each rank times the same groups, first trial first
    assert second == [ranked[0], first[-1]], "head to head: the model's pick vs the winner"
    assert picks == [ranked[0] if model_pick_faster else first[-1]] * 2
