"""The examples run, small, on the session's Ray (each leaves Ray as it found it)."""

from __future__ import annotations

import importlib

import pytest


def load(name: str):
    """``examples/<name>.py`` as the module ``examples.<name>``, which the actors import too
    (Ray pickles the example's actor classes by reference)."""
    return importlib.import_module(f"examples.{name}")


@pytest.mark.usefixtures("no_leaks")
def test_the_rl_loop_alternates_its_two_graphs_and_learns(ray_session, tmp_path, capsys):
    rl_loop = load("rl_loop")
    curve = rl_loop.main(["--steps", "12", "--batch", "128", "--pictures", str(tmp_path)])
    out = capsys.readouterr().out
    assert len(curve) == 12 and all(0.0 <= r <= 1.0 for r in curve)
    # the policy starts uniform (1/4 right) and learns: the last steps beat the first ones
    assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3 + 0.1, out
    assert "weights v12" in out  # every training execution broadcast new weights
    assert {p.stem for p in tmp_path.iterdir()} >= {"rollout", "training"}
