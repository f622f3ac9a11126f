"""``algorithm="auto"`` on the gloo backend: the tuner picks among cgraph's algorithms and gloo's own.

Four member actors on the session's one-node Ray share one gloo group per test.
The tests compare values (sums, names, the same pick on every rank), never times:
which candidate wins depends on the host's load.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cgraph.collective as col
from cgraph.comm import algorithms
from cgraph.errors import CollectiveMismatchError
from tests.ray.collective_helpers import (  # noqa: F401 - no_group_segments is an autouse fixture
    destroy_everywhere,
    fresh,
    init,
    no_group_segments,
    run_all,
    spawn_members,
)

pytestmark = pytest.mark.skipif(not col.gloo_available(), reason="torch without gloo")

SIZES = (1, 1000, 30_000)
"""float32 elements: tiny, below the trial threshold (64 KiB), and one size class with a trial."""
CANDIDATES = {"native", *algorithms.ALGORITHMS}


@pytest.fixture(scope="module")
def members(ray_session):
    yield from spawn_members(4)


def _inputs(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 * rank + n).random(n, dtype=np.float32)


def auto_allreduces(name):
    """Every SIZES allreduce with "auto" (twice each: after the trial, the arm's pick),
    then explicit "native"; the results and what ``choose`` says on this rank."""
    from cgraph.collective import groups

    rank, comm = col.get_rank(name), groups.lookup(name).comm
    results = []
    for n in SIZES:
        for _ in range(2):
            t = torch.from_numpy(_inputs(rank, n))
            col.allreduce(t, name, algorithm="auto")
            results.append(t.numpy().copy())
    native = torch.full((5,), rank + 1.0)
    col.allreduce(native, name, op="max", algorithm="native")
    picks = [comm.choose(4 * n) for n in SIZES]
    candidates = sorted(comm.calibration.ratios)
    shown = col.explain(4, 4 * SIZES[-1], name)  # the API reads the comm's calibration
    return (results, native.tolist(), picks, candidates, col.get_cost_params(name) is not None,
            comm.measured(4 * SIZES[-1]), shown)


def test_auto_allreduce_on_gloo_sums_and_every_rank_picks_the_same(members):
    name = fresh("glooauto")
    try:
        run_all(members, init(4, name, backend="gloo"), per_rank=lambda i: (i,))
        out = run_all(members, auto_allreduces, name)
    finally:
        destroy_everywhere(members, name)
    expected = [np.sum([_inputs(r, n).astype(np.float64) for r in range(4)], axis=0)
                for n in SIZES for _ in range(2)]
    for results, native, picks, candidates, fitted, measured, shown in out:
        for got, want in zip(results, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5)
        assert native == [4.0] * 5
        assert set(picks) <= CANDIDATES
        assert "native" in candidates and set(candidates) <= CANDIDATES
        assert fitted and "native (ring)" in shown and "<- auto" in shown
        assert measured is not None and measured.startswith("measured: ")
    assert all(o[2] == out[0][2] for o in out), f"ranks picked differently: {[o[2] for o in out]}"


def mixed_auto_and_native(name, algorithm):
    t = torch.ones(3)
    try:
        col.allreduce(t, name, algorithm=algorithm)
        first = "ok"
    except CollectiveMismatchError as exc:
        first = str(exc)
    col.allreduce(t, name, algorithm="native")  # the group is still usable
    return first, t.tolist()


def test_auto_against_native_is_a_mismatch_and_the_group_stays_usable(members):
    name = fresh("gloomix")
    try:
        run_all(members[:2], init(2, name, backend="gloo"), per_rank=lambda i: (i,))
        out = run_all(members[:2], mixed_auto_and_native, name,
                      per_rank=lambda i: (("auto", "native")[i],))
    finally:
        destroy_everywhere(members[:2], name)
    for first, t in out:
        assert "rank 0: allreduce float32(3,) sum auto" in first
        assert "rank 1: allreduce float32(3,) sum native" in first
        assert t == [2.0] * 3
