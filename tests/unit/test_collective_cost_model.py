"""The alpha-beta-gamma cost model: shapes of the predictions, choice, fitting."""

from __future__ import annotations

import math

import pytest

from cgraph.comm.algorithms import ALGORITHMS, ALLGATHER_ALGORITHMS, REDUCESCATTER_ALGORITHMS
from cgraph.comm.tuning import cost_model
from cgraph.comm.tuning.cost_model import (
    COST,
    CostParams,
    Sample,
    choose,
    explain,
    fit,
    predict,
    terms,
)
from tests import fabric as cost_samples
from tests.fabric import LocalTransport, sample

# 10 us per message, 1 GB/s, 10 GB/s reduction: a commodity cluster.
CLUSTER = CostParams(alpha=1e-5, beta=1e-9, gamma=1e-10)


def test_every_algorithm_has_a_cost_formula() -> None:
    assert set(COST) == set(ALGORITHMS)


def test_every_reducescatter_and_allgather_algorithm_has_a_cost_row() -> None:
    assert cost_model.COLLECTIVE_COST["allreduce"] is COST
    assert set(cost_model.COLLECTIVE_COST["reducescatter"]) == set(REDUCESCATTER_ALGORITHMS)
    assert set(cost_model.COLLECTIVE_COST["allgather"]) == set(ALLGATHER_ALGORITHMS)


@pytest.mark.parametrize("world_size", [8, 16, 64])
def test_ring_wins_large_messages_at_large_world_sizes(world_size: int) -> None:
    assert choose(world_size, 256 << 20, CLUSTER) == "ring"


@pytest.mark.parametrize("world_size", [4, 7, 16, 64])
@pytest.mark.parametrize("nbytes", [4, 1024])
def test_butterfly_wins_small_messages(world_size: int, nbytes: int) -> None:
    assert choose(world_size, nbytes, CLUSTER) == "butterfly"


def test_textbook_values() -> None:
    p, n = 8, 1 << 20
    assert terms("ring", p, n) == cost_model.Terms(14, 2 * 7 / 8 * n, 7 / 8 * n)
    assert terms("tree", p, n) == cost_model.Terms(6, 6 * n, 3 * n)
    assert terms("butterfly", 8, n) == cost_model.Terms(3, 3 * n, 3 * n)
    assert terms("butterfly", 6, n) == cost_model.Terms(4, 4 * n, 3 * n)  # fold + unfold
    assert terms("star", p, n) == cost_model.Terms(14, 14 * n, 7 * n)
    rs = terms("reduction_server", 16, n, ranks_per_node=4)
    assert rs.steps + rs.steps_inter == 2 * (3 + 3) and math.isclose(rs.moved + rs.moved_inter, 2 * 15 / 16 * n)
    assert predict("ring", 1, n, CLUSTER) == 0.0 and predict("ring", 8, 0, CLUSTER) == 0.0


def test_two_nodes_split_each_algorithm_into_links_within_and_between_nodes() -> None:
    p, n, rpn = 8, 1 << 20, 4  # 2 nodes of 4 ranks
    rs = terms("reduction_server", p, n, rpn)
    assert (rs.steps, rs.steps_inter) == (6, 2)  # 2(L-1) within, 2(m-1) across
    assert math.isclose(rs.moved, 2 * 3 / 4 * n) and math.isclose(rs.moved_inter, 2 * 1 / 8 * n)
    ring = terms("ring", p, n, rpn)
    assert (ring.steps, ring.moved, ring.steps_inter) == (0, 0, 14)  # lock step: all at the slowest link
    tree, star, fly = terms("tree", p, n, rpn), terms("star", p, n, rpn), terms("butterfly", p, n, rpn)
    assert (tree.steps, tree.steps_inter) == (4, 2) and (star.steps, star.steps_inter) == (6, 8)
    assert (fly.steps, fly.steps_inter) == (2, 1)  # distances 1, 2 within a node, 4 across
    for name in ALGORITHMS:  # one node: nothing crosses
        assert terms(name, p, n, p).steps_inter == 0
    for name in set(ALGORITHMS) - {"reduction_server", "shared"}:  # equal parameters: one-class totals
        # (the two hierarchical ones change shape with the layout)
        assert math.isclose(predict(name, p, n, CLUSTER, rpn), predict(name, p, n, CLUSTER, p))


def test_slow_links_between_nodes_favour_the_hierarchical_algorithms() -> None:
    p, n = 8, 16 << 20
    slow = CostParams(alpha=2e-6, beta=1 / 100e9, gamma=1 / 50e9,  # NVLink-class within a node
                      alpha_inter=1e-5, beta_inter=1 / 25e9)  # 25 GB/s between nodes
    assert choose(p, n, slow, ranks_per_node=4) in ("reduction_server", "shared")
    assert predict("reduction_server", p, n, slow, 4) < predict("ring", p, n, slow, 4) / 1.5
    assert terms("ring", p, n, 4).dominant(slow) == "inter-node bandwidth"
    text = explain(p, n, slow, ranks_per_node=4, measured={"ring": 0.0123})
    assert "between nodes alpha=1e-05 s" in text and "inter-node bandwidth" in text and "12.300 ms" in text


def test_fit_recovers_the_parameters_between_nodes_from_two_layouts() -> None:
    truth = CostParams(alpha=3e-6, beta=2e-10, gamma=5e-11, alpha_inter=4e-5, beta_inter=1e-9)
    samples = [Sample(a, 8, n, predict(a, 8, n, truth, rpn), rpn)
               for a in ("ring", "butterfly", "tree", "reduction_server") for n in (8, 1 << 14, 1 << 20)
               for rpn in (8, 4, 2)]
    got = fit(samples)
    for field in ("alpha", "beta", "gamma", "alpha_inter", "beta_inter"):
        assert math.isclose(getattr(got, field), getattr(truth, field), rel_tol=1e-6), field


def test_reduction_server_is_a_candidate_only_with_a_layout() -> None:
    assert "reduction_server" not in cost_model.candidates()
    assert "reduction_server" in cost_model.candidates(4)
    flat = {r.split()[0]: r for r in explain(16, 1 << 20, CLUSTER).splitlines()[2:]}
    assert list(flat) == list(ALGORITHMS), "every algorithm is listed, candidate or not"
    for name in ("reduction_server", "shared"):
        assert "not a candidate" in flat[name] and "pass ranks_per_node" in flat[name]
    assert "not a candidate" not in explain(16, 1 << 20, CLUSTER, ranks_per_node=4)


def test_explain_lists_every_algorithm_and_marks_the_best() -> None:
    text = explain(16, 64 << 20, CLUSTER, ranks_per_node=4)
    rows = text.splitlines()[2:]
    assert [r.split()[0] for r in rows] == list(ALGORITHMS)
    (best,) = [r for r in rows if r.endswith("<- best")]
    assert best.split()[0] == choose(16, 64 << 20, CLUSTER, ranks_per_node=4)


def synthetic(params: CostParams) -> list[Sample]:
    return [
        Sample(a, p, n, predict(a, p, n, params))
        for a in ("ring", "butterfly", "tree")
        for p in (2, 4, 8)
        for n in (8, 1 << 12, 1 << 20)
    ]


def test_fit_recovers_known_parameters() -> None:
    truth = CostParams(alpha=3e-6, beta=2.5e-10, gamma=4e-11)
    got = fit(synthetic(truth))
    for field in ("alpha", "beta", "gamma"):
        assert math.isclose(getattr(got, field), getattr(truth, field), rel_tol=1e-6), field


def test_fit_with_noise_and_tuples() -> None:
    truth = CostParams(alpha=1e-5, beta=1e-9, gamma=2e-10)
    noisy = [
        (s.algorithm, s.world_size, s.nbytes, s.seconds * (1.03 if i % 2 else 0.97))
        for i, s in enumerate(synthetic(truth))
    ]
    got = fit(noisy)
    assert math.isclose(got.alpha, truth.alpha, rel_tol=0.1)
    assert math.isclose(got.beta, truth.beta, rel_tol=0.1)
    assert math.isclose(got.gamma, truth.gamma, rel_tol=0.5)
    assert min(got.alpha, got.beta, got.gamma) >= 0


def test_fit_refuses_samples_that_cannot_separate_beta_from_gamma() -> None:
    only_ring = [s for s in synthetic(CLUSTER) if s.algorithm == "ring"]
    with pytest.raises(ValueError, match="include butterfly"):
        fit(only_ring)


def test_sample_and_measure_on_local_threads() -> None:
    samples = sample(
        lambda p: LocalTransport.create(p), world_sizes=(2,), nbytes=(64, 4096), repeats=1
    )
    assert {s.algorithm for s in samples} == set(cost_model.candidates())
    assert all(s.seconds > 0 and s.world_size == 2 for s in samples)
    params = cost_samples.measure(world_sizes=(2, 3), nbytes=(64, 1 << 16), repeats=2)
    assert min(params.alpha, params.beta, params.gamma) >= 0


def test_the_public_explain_lists_the_reduction_server_for_a_layout_of_several_nodes() -> None:
    from cgraph import collective

    flat = collective.explain(8, 4 << 20)
    layered = collective.explain(8, 4 << 20, ranks_per_node=4)
    assert "reduction_server" in flat and "not a candidate" in flat  # listed, with why not
    assert "4 ranks/node" in layered and "not a candidate" not in layered
    assert "reduction_server" in layered and layered.count("<- best") == 1
