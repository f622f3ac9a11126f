"""Compiled graphs across two Ray nodes (``ray.cluster_utils.Cluster`` on this machine).

The cluster runs in a child process (``multinode_script.py``) so that this
session's shared one-node Ray instance stays as it is.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def checks(child_scripts):
    return child_scripts.get("multinode_script.py").checks()


def test_actors_sit_on_two_nodes(checks):
    place = checks["placement"]
    assert place["b"] == place["c"] != place["head"]


def test_chain_across_nodes_uses_sockets(checks):
    chain = checks["chain"]
    assert chain["ok"], "200 executions, each value right"
    # driver -> b and b -> a leave or enter node2: sockets; a -> driver stays on the head: shm
    assert chain["kinds"] == ["CROSS_NODE", "SHM"], chain
    first, second, third = chain["channels"]  # graph actor ids follow bind order: b is "a"
    assert first == "n0>a.xnode = xnode driver -> a via xnode"
    assert second == "n1>b.xnode = xnode a -> b via xnode"
    assert third == "n2.shm = shm b -> driver via shm"
    assert "xnode" not in chain["planned"], "without locations the planner sees one node"


def test_large_arrays_fan_out_across_and_within_node2(checks):
    assert checks["arrays"] == {"ok": True, "writable": True}


def test_driver_results_that_a_relay_lands_outlive_the_executions_after_them(checks):
    """An output the driver reads beside an actor of its node crosses once, into a relay's
    shared memory: the driver's values are copies, not views of a slot reused later."""
    entry = checks["relay_to_driver"]
    assert "CROSS_NODE" in entry["kinds"], entry
    assert entry["ok"] and entry["later"], entry


def test_two_actors_of_a_worker_node_share_memory_made_there(checks):
    entry = checks["node_shm"]
    assert entry["kinds"] == {"n0>a.xnode": "CROSS_NODE", "n1.shm": "SHM",
                              "n2>driver.xnode": "CROSS_NODE"}, entry
    assert entry["got"] == entry["want"], "c read b's arrays as views of node2's shared memory"
    assert entry["made_on_node2"], "the segments were made by an actor of node2"
    assert entry["left"] == [], "teardown removed them"


def test_a_value_read_by_two_actors_of_another_node_crosses_once(checks):
    entry = checks["relay"]
    assert entry["channels"][0] == "n1>b.xnode = xnode a -> b,c via xnode", entry
    assert entry["got"] == entry["want"], "both read every value, from node2's shared memory"
    assert entry["left"] == []


def test_tls_carries_every_socket_of_a_graph_that_asks(checks):
    entry = checks["tls"]
    assert entry["sockets"] >= 3 and entry["all_tls"], entry
    assert entry["got"] == entry["want"], "a's values crossed (private copies), c shares node2's"


def test_user_errors_cross_nodes_and_the_graph_survives(checks):
    errors = checks["errors"]
    assert errors["first"] == 3 and errors["after"] == 9
    assert errors["error"] == ["TaskError(ValueError)", True, True]
    assert errors["usable"] == [2, 2], "after teardown the actors answer ordinary calls"


def test_cpu_communicator_off_the_drivers_node_is_refused(checks):
    entry = checks["cpu_communicator_off_node"]
    assert entry["refused"] is not None and "another node" in entry["refused"], entry
    assert entry["free"] == [2, 2], "a refused compile leaves the actors usable"


def test_an_input_read_on_both_nodes_goes_out_on_one_channel_per_node(checks):
    entry = checks["input_on_two_nodes"]
    assert entry == {"ok": True, "kinds": ["CROSS_NODE", "SHM"]}, entry


def test_gloo_carries_communicator_edges_and_a_collective_across_nodes(checks):
    entry = checks["gloo_across_nodes"]
    assert entry["got"] == {"False": entry["expected"], "True": entry["expected"]}, entry
    assert entry["free"] == [2, 2, 2], "the actors' loops ended at teardown"


@pytest.mark.parametrize("backend", ["gloo", "cpu"])
def test_every_algorithm_across_nodes_equals_numpy(checks, backend):
    """2 actors per node; allreduce SUM/MAX with every algorithm (hierarchical one included),
    reducescatter and allgather; sizes 0, 1, 7 and 2 MiB; numpy and torch. On "cpu" the
    ranks of a node share memory and the nodes talk through gloo."""
    got = checks[f"collectives_across_nodes_{backend}"]["got"]
    assert [g["rank"] for g in got] == [0, 1, 2, 3]
    assert got[0]["node"] == got[1]["node"] != got[2]["node"] == got[3]["node"]
    assert all(g["wrong"] == [] for g in got), [g["wrong"] for g in got]
    assert len({g["calls"] for g in got}) == 1 and got[0]["calls"] > 100
    if backend == "cpu":  # 16 MiB "shared" asked each node once whether its ranks may read each other
        assert all(g["peer_reads"] is not None for g in got), got
        assert got[0]["peer_reads"] == got[1]["peer_reads"] and got[2]["peer_reads"] == got[3]["peer_reads"]


@pytest.mark.parametrize("backend", ["gloo", "cpu"])
def test_a_rank_killed_on_the_other_node_raises_on_the_survivors(checks, backend):
    for outcome in checks[f"collectives_across_nodes_{backend}"]["after_death"]:
        assert outcome.startswith(("CollectiveError", "CollectiveTimeoutError", "CollectiveGroupError")), outcome
        assert f"xnode-{backend}" in outcome and " on node " in outcome and "ranks by node:" in outcome, outcome
        # timeout_s is 20: a rank that sees the death aborts its group, which wakes the rest
        assert float(outcome.split(" after ")[1].split("s:")[0]) < 5, outcome


def test_a_communicator_fault_on_one_node_fails_the_group_on_the_other_at_once(checks):
    """Before, the rank on node2 waited inside the allreduce for its communicator's own
    timeout (600 s here): execution 3 timed out on get and the actors stayed busy."""
    entry = checks["group_fault_across_nodes"]
    assert entry["first"] == [8.0, 8.0], entry
    assert entry["2"].startswith("TaskError(ValueError)") and "flaky allreduce" in entry["2"], entry
    assert entry["3"].startswith("TaskError(CommunicatorError)") and "did not run" in entry["3"], entry
    assert entry["free"] == [2, 2], "both actors answer calls after teardown"


def test_two_ranks_on_two_nodes_talk_first_while_the_others_are_idle(checks):
    """A "cpu" group's pairs connect when a call first needs them: rank 1 sends to rank 3
    before ranks 0 and 2 make any call; the group then allreduces and is destroyed clean."""
    entry = checks["pair_first"]
    assert entry["sent"] == "send" and entry["got"] == [2.0 * i for i in range(6)], entry
    assert entry["summed"] == [[10.0] * 4] * 4, entry
    assert entry["left"] == [], "destroy on every rank unlinks the group's segments"


def test_actor_death_on_the_other_node_is_reported(checks):
    death = checks["death"]
    assert death["error"] is not None, "the graph kept answering after an actor died"
    assert death["error"].startswith("actor ") and "(Node) died" in death["error"], death
    assert death["seconds"] < 30
    # the survivors' where-records, on both nodes (labels are the graph's: b -> c -> a is a -> b -> c)
    said = death["error"].split("Where each actor was: ", 1)[1]
    assert "b (Node, node 1): no answer" in said, said
    for survivor in ("a (Node, node 1): ", "c (Node, node 0): "):  # waiting to read, or to write
        assert survivor in said and survivor + "no answer" not in said, said


def test_a_cross_node_output_lost_under_a_living_actor_is_a_lost_channel(checks):
    lost = checks["lost_output"]["error"]
    assert lost is not None and lost.startswith("ChannelLostError: "), lost
    assert "torn down" not in lost


def test_an_actor_dying_under_a_cross_node_output_is_reported_as_its_death(checks):
    death = checks["death_at_output"]
    assert death["error"] is not None and death["error"].startswith("ActorDiedError: actor "), death
    assert "(Node) died" in death["error"], death
    assert death["seconds"] < 30


def test_teardown_leaves_nothing(checks):
    teardown = checks["teardown"]
    assert teardown["survivors"] == [2, 2]
    assert teardown["segments"] == []


def test_a_timeout_across_nodes_says_where_each_actor_is(checks):
    """The node-2 actor naps in its method; the head's actor waits for its value."""
    said = checks["where"]["said"]
    assert said is not None and "execution 1 did not finish in time" in said, said
    assert "(Node, node 1): running nap for " in said, said
    assert "(Node, node 0): waiting " in said and "'s value on channel" in said, said
    assert any("node 1" in line and "running nap" in line for line in checks["where"]["status"])


def test_a_killed_driver_leaves_no_segment_on_either_node(checks):
    """kill -9 of a driver whose graph has shared memory on both nodes: each process that
    made segments (the driver on the head, its agent actor on node2) has a reaper that
    removes them when it dies; before, they stayed until the next compile on that node."""
    entry = checks["killed_driver"]
    assert len(entry["creators"]) == 2 and entry["driver"] in entry["creators"], entry  # both nodes made some
    assert entry["left"] == [], entry
    assert entry["seconds"] < 30


def test_a_node_lost_mid_execution_is_named_and_its_graph_frees_everything(checks):
    """Before, the waiter got the actor's ActorDiedError in Ray's words ("temporarily
    unavailable: RpcError"), no node named (Ray's GCS declares the node dead some 15 s
    later), and the graph's segments stayed until teardown."""
    entry = checks["node_death"]
    assert entry["first"] == [3, 2], entry
    assert entry["error"] and entry["error"].startswith("NodeDiedError: node 1 (Ray node "), entry
    assert entry["node"] == entry["lost"] and entry["lost"] in entry["error"], entry
    assert "was lost while the compiled graph was running" in entry["error"] and "died with it: b (Node)." in entry["error"]
    assert entry["types"] == ["cgraph.NodeDiedError", "cgraph.ActorDiedError", "ray.NodeDiedError",
                              "ray.ActorDiedError"], entry
    assert entry["left"] == [], "the failed graph's segments went before its teardown"
    assert entry["seconds"] < 20, entry  # the raylet's port answers at once; Ray's GCS takes ~15 s
    assert entry["survivors"] == 3, entry

