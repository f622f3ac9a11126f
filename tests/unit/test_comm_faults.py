"""A user communicator that raises: that execution's error, its group failed, the loop alive.

    a.make ══Flaky══► b.double ══Flaky══► c.total ─► driver     (one group: a, b, c)

Run in threads without Ray (``test_comm_ops.Harness``): the execution whose
send, recv or collective raises gets the original exception (with a note naming
the communicator, the group and the op) on every member, every later one a
``CommunicatorError`` saying so, at once, without a communicator call; the
loops end "closed" at teardown.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import torch

from cgraph.errors import CommunicatorError
from cgraph.runtime.comm_faults import FaultBoard, GroupFailure
from cgraph.runtime.error_value import ErrorValue
from tests.unit.test_comm_ops import CHAIN, COLLECTIVE, BoardCommunicator, Harness, no_segments_left  # noqa: F401


class Flaky(BoardCommunicator):
    """Raises ValueError in ``call`` on rank ``rank`` for a tensor of sum ``bad`` (calls counted)."""

    def __init__(self, call: str, rank: int, bad: float) -> None:
        self.call, self.bad_rank, self.bad = call, rank, bad
        self.calls = 0

    def _check(self, call: str, tensor: torch.Tensor) -> None:
        self.calls += 1
        if call == self.call and self.rank == self.bad_rank and float(tensor.sum()) == self.bad:
            raise ValueError(f"flaky {call} on rank {self.rank}")

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._check("send", tensor)
        super().send(tensor, dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        super().recv(tensor, src)
        self._check("recv", tensor)

    def allreduce(self, tensor: torch.Tensor, op: Any = "sum") -> None:
        if tensor.is_floating_point():
            self._check("allreduce", tensor)
        super().allreduce(tensor, op)


def run_flaky(text: str, comm: Flaky, inputs: list[int], overlap: bool = False) -> list[list[Any]]:
    text = text.replace(":nccl", ":custom:Flaky")  # keeps a [...] hint
    with Harness(text, communicators={"custom:Flaky": comm}, default=None, overlap=overlap) as h:
        start = time.monotonic()
        rows = [row for x in inputs for row in h.run(x)]  # one at a time: see docs/design-notes.md
        assert time.monotonic() - start < 10  # no communicator timeout waited for
    return rows


def message(value: Any) -> str:
    assert isinstance(value, ErrorValue), value
    return value.message


@pytest.mark.parametrize("overlap", [False, True])  # True: the ops run on the actors' comm threads
@pytest.mark.parametrize("hint", ["", "[static_shape,direct_return]"])  # the latter: no side item per value
@pytest.mark.parametrize(("call", "rank", "bad"), [("send", 0, 6.0), ("recv", 1, 6.0), ("send", 1, 12.0)])
def test_a_raising_send_or_recv_fails_its_execution_then_the_group(call: str, rank: int, bad: float,
                                                                   hint: str, overlap: bool) -> None:
    rows = run_flaky(CHAIN.replace(":nccl", ":nccl" + hint), Flaky(call, rank, bad), [1, 2, 3, 4], overlap)
    assert rows[0] == [6.0]
    first = rows[1][0]
    assert message(first) == f"ValueError: flaky {call} on rank {rank}"
    assert isinstance(first.cause, ValueError)
    assert "cgraph: communicator Flaky of group custom:Flaky raised in" in first.traceback_str
    for (later,) in rows[2:]:
        assert isinstance(later.cause, CommunicatorError), later
        assert message(later).startswith(
            "CommunicatorError: communicator group custom:Flaky failed in execution 1 on actor ")
        assert f"ValueError: flaky {call} on rank {rank}; recompile the graph" in message(later)


def test_a_raising_collective_fails_every_member_then_the_group() -> None:
    text = COLLECTIVE.format(method="allreduce").replace("n3 = allreduce(n1, n2)", "n3 = allreduce(n1, n2) :nccl")
    rows = run_flaky(text, Flaky("allreduce", 0, 4.0), [1, 2, 3])  # rank 0 holds [2, 2] in execution 1
    assert [v.tolist() for v in rows[0]] == [[2.0, 2.0], [2.0, 2.0]]
    # rank 1, woken by the abort, gives rank 0's error (from the group's fault board)
    assert [(message(v), v.actor) for v in rows[1]] == [("ValueError: flaky allreduce on rank 0", "a")] * 2
    for value in rows[2]:
        assert isinstance(value.cause, CommunicatorError)
        assert "group custom:Flaky[a,b] failed in execution 1 on actor a: ValueError: flaky allreduce" in message(value)


def test_the_fault_board_gives_the_earliest_fault_and_fits_a_huge_one() -> None:
    board = FaultBoard.create(uuid.uuid4().hex[:8], "custom:Flaky", 3)
    try:
        ends = [board.handle(rank) for rank in range(3)]
        assert ends[0].first() is None  # nothing posted
        error = ErrorValue.capture(ValueError("x" * 50_000), actor="c", method="f", execution_index=4)
        ends[2].post(GroupFailure(4, "c", error.message), error)  # too big for a slot: the record alone, cut
        failure, value = ends[0].first()
        assert (failure.execution, failure.actor, value) == (4, "c", None) and len(failure.what) < FaultBoard.SLOT
        small = ErrorValue.capture(ValueError("flaky"), actor="b", method="f", execution_index=3)
        ends[1].post(GroupFailure(3, "b", small.message), small)
        failure, value = ends[2].first()  # execution 3 came first, whoever reads
        assert (failure, value.message) == (GroupFailure(3, "b", "ValueError: flaky"), "ValueError: flaky")
    finally:
        assert board.unlink() == [board.name]
