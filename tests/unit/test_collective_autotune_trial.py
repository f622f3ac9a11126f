"""``auto``'s size-class trial: every rank picks the same measured winner."""

from __future__ import annotations

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
