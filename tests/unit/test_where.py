"""The where-record's words (``cgraph/runtime/where.py``), no Ray: each kind of op becomes
the sentence a timeout and ``status()`` print, with the actor at the channel's other end."""

from __future__ import annotations

from cgraph.runtime import where
from cgraph.scheduler.channels import ChannelKind, ChannelSpec
from cgraph.scheduler.ops import Op, OpKind

SCHEDULE = {
    "a": (Op("a", OpKind.READ, "n0"), Op("a", OpKind.COMPUTE, "n1"), Op("a", OpKind.WRITE, "n1"),
          Op("a", OpKind.SEND, "n3", ("b",))),
    "b": (Op("b", OpKind.READ, "n1"), Op("b", OpKind.RECV, "n3", ("a",)),
          Op("b", OpKind.COLLECTIVE, "n4", ("a", "b"))),
}
CHANNELS = (
    ChannelSpec("n0.shm", "n0", ChannelKind.SHM, "driver", ("a",), "shm"),
    ChannelSpec("n1.shm", "n1", ChannelKind.SHM, "a", ("b",), "shm"),
)
DESCRIBE = where.Describer(SCHEDULE, CHANNELS, {"n1": "f", "n4": "allreduce"},
                           {"a": "a (W, node 0)", "b": "b (W, node 1)"})


def test_each_op_kind_says_what_it_runs_or_waits_for() -> None:
    said = {(actor, pos): str(DESCRIBE.describe(actor, (1, pos, 3.04)))
            for actor, ops in SCHEDULE.items() for pos in range(len(ops))}
    assert said[("a", 0)] == "a (W, node 0): waiting 3.0 s for the driver's value on channel n0.shm (execution 1, op a.R0)"
    assert said[("a", 1)] == "a (W, node 0): running f for 3.0 s (execution 1, op a.C1)"
    assert said[("a", 2)].startswith("a (W, node 0): writing n1 for 3.0 s: channel n1.shm waits for room (read by b)")
    assert said[("a", 3)].startswith("a (W, node 0): sending n3 to b for 3.0 s")
    assert said[("b", 0)] == "b (W, node 1): waiting 3.0 s for a's value on channel n1.shm (execution 1, op b.R1)"
    assert "waiting 3.0 s for a's n3 (communicator receive)" in said[("b", 1)]
    assert "in collective allreduce with a, b for 3.0 s" in said[("b", 2)]


def test_no_answer_an_ended_loop_and_a_loop_between_executions() -> None:
    assert str(DESCRIBE.describe("a", TimeoutError("no answer"))).endswith("no answer (dead, or its process is stuck)")
    assert "runs no loop of this graph" in str(DESCRIBE.describe("a", None))
    assert DESCRIBE.describe("a", (4, where.ENDED, 0.0)).state == "ended"
    assert "starting execution 0" in str(DESCRIBE.describe("a", (0, -1, 0.5)))


def test_status_prints_a_table_and_one_line() -> None:
    status = where.GraphStatus(DESCRIBE.describe(a, (2, 1, 1.0)) for a in ("a", "b"))
    lines = str(status).splitlines()
    assert lines[0].split()[:6] == ["actor", "execution", "op", "state", "for", "what"]
    assert lines[1].startswith("a (W, node 0)") and "running f for 1.0 s" in lines[1]
    assert status.line() == "; ".join(str(w) for w in status)


def test_the_actor_side_record_answers_for_its_graph_only() -> None:
    record = where.track("g-unit")
    record[0], record[1] = 7, 2
    execution, position, seconds = where.report(None, "g-unit")  # type: ignore[misc]
    assert (execution, position) == (7, 2) and seconds >= 0
    assert where.report(None, "another graph") is None
