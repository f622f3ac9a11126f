"""The fault soak across two loopback nodes, a short run (``make soak SOAK_ARGS="--nodes 3"``
runs the long one): one trial of each fault across nodes, every result right or a typed
error, no hang, nothing left on any node, and the survivors' next graph runs."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def soak(child_scripts):
    return child_scripts.get("node_soak_script.py").checks()["node_soak"]


def test_every_fault_across_nodes_ran_once(soak):
    assert sorted(soak["faults"]) == sorted(["kill9", "sigstop", "node_removed", "comm_raises",
                                             "driver_exit", "stranger"])


def test_no_hang_no_wrong_result_no_leak_on_any_node(soak):
    assert soak["problems"] == []
    total = soak["summary"]["total"]
    assert total["hangs"] == total["wrong"] == total["leaks"] == 0, total


def test_the_survivors_next_graph_ran_after_every_fault(soak):
    assert soak["summary"]["total"]["next_graph_ok"] == soak["summary"]["total"]["trials"] == 6


def test_the_faults_that_kill_gave_typed_errors_and_the_stranger_found_doors(soak):
    by_fault = soak["summary"]["by_fault"]
    assert by_fault["node_removed"]["typed_errors"] >= 1, by_fault["node_removed"]
    assert by_fault["stranger"]["typed_errors"] == 0, "a stranger changes no result"
    assert soak["stranger_doors"] and soak["stranger_doors"][0] >= 1, soak["stranger_doors"]
