"""``auto`` on the row and column teams of a gloo group: one team's first call must not hold
the other team's members past the group's timeout (issue 28, item 7); no Ray.

Four gloo ranks live in threads of this process (one ``HashStore``), each a ``TorchComm``
split as ``split_2d(group, 2)`` does::

    0 1      rows (0 1) (2 3), columns (0 2) (1 3)
    2 3      each rank: allreduce "auto" over its row, then over its column

The row (2 3)'s first call measures (calibration, trial) with a "native" that sleeps in
every round, as on a loaded host: unbounded, ranks 0 and 1 wait in their column's
signature check for longer than the group's timeout and fail.
"""

from __future__ import annotations

import datetime
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
import torch.distributed as dist

from cgraph.comm.teams import Team
from cgraph.comm.torch import backend as torch_backend
from cgraph.comm.torch.backend import TorchComm
from cgraph.comm.torch.process_group import process_group
from cgraph.comm.types import ReduceOp

pytestmark = pytest.mark.slow  # left out of `make test-fast`

TIMEOUT_S = 8.0
ROUND_S = 0.5
"""What the slow team's "native" sleeps per run: once per measuring round."""


def _comms(store: Any, rank: int) -> tuple[TorchComm, TorchComm, TorchComm]:
    """This rank's group and its row and column teams (built as ``torch_backend.connect`` does)."""

    def make(members: Team, prefix: str) -> tuple[Any, Any]:
        prefixed = dist.PrefixStore(prefix, store)
        return process_group("gloo", prefixed, members.team_rank(rank), members.size,
                             datetime.timedelta(seconds=TIMEOUT_S), "127.0.0.1"), prefixed

    group = TorchComm(make, "g", Team((0, 1, 2, 3)), ("n",) * 4, "cpu")
    row = group.split(Team((0, 1) if rank < 2 else (2, 3)))
    column = group.split(Team((0, 2) if rank % 2 == 0 else (1, 3)))
    return group, row, column


def test_a_slow_first_auto_call_on_one_team_does_not_time_out_the_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_backend, "FIT_BYTES", (4 << 10, 64 << 10))  # cheap real work
    monkeypatch.setattr(torch_backend, "FIT_REPEATS", 8)  # unbounded: 26 rounds, 13 s asleep
    store = dist.HashStore()

    def rank(r: int) -> tuple[float, str | None]:
        group, row, column = _comms(store, r)
        if r >= 2:  # the row (2 3) measures slowly
            native = row.tuner.own["native"]

            def slow(buf: Any, op: ReduceOp) -> None:
                time.sleep(ROUND_S)
                native(buf, op)

            row.tuner.own["native"] = slow
        try:
            tensor = torch.ones(16 << 10)  # 64 KiB: calibration, then the size class's trial
            row.allreduce(tensor, ReduceOp.SUM, "auto")
            column.allreduce(tensor, ReduceOp.SUM, "auto")
            arm = row.tuner.arm(tensor.numel() * 4)
            return float(tensor.min()), None if arm is None else arm.incumbent
        finally:
            for comm in (column, row, group):
                comm.destroy()

    with ThreadPoolExecutor(4) as pool:
        out = [f.result(timeout=120) for f in [pool.submit(rank, r) for r in range(4)]]
    assert [total for total, _ in out] == [4.0] * 4, "every rank got the sum of all four"
    assert out[2][1] == out[3][1], "the slow row's ranks still agree on what auto runs"


def test_a_failure_on_one_rank_reaches_the_others_at_once_not_at_their_timeout() -> None:
    """Rank 2 leaves (its process group is dropped, as when its process dies). The rank
    that talks to it fails at once; it aborts its own process group, so the other survivor,
    blocked on it, fails too, long before the group's timeout (30 s here)."""
    timeout_s = 30.0
    store = dist.HashStore()

    def make_for(rank: int) -> Any:
        def make(members: Team, prefix: str) -> tuple[Any, Any]:
            prefixed = dist.PrefixStore(prefix, store)
            return process_group("gloo", prefixed, members.team_rank(rank), members.size,
                                 datetime.timedelta(seconds=timeout_s), "127.0.0.1"), prefixed

        return make

    def rank(r: int) -> tuple[str, float]:
        comm = TorchComm(make_for(r), "g", Team((0, 1, 2)), ("n",) * 3, "cpu")
        comm.allreduce(torch.ones(4), ReduceOp.SUM, "native")  # every pair has met
        if r == 2:
            comm.destroy()
            return "left", 0.0
        start = time.monotonic()
        try:
            for _ in range(50):
                comm.allreduce(torch.ones(1 << 12), ReduceOp.SUM, "native")
        except Exception as exc:  # noqa: BLE001 - its type and timing are the result
            return type(exc).__name__, time.monotonic() - start
        finally:
            comm.destroy()
        return "no error", time.monotonic() - start

    with ThreadPoolExecutor(3) as pool:
        out = [f.result(timeout=120) for f in [pool.submit(rank, r) for r in range(3)]]
    assert out[2] == ("left", 0.0)
    for name, seconds in out[:2]:
        assert name in ("CollectiveError", "CollectiveTimeoutError") and seconds < timeout_s / 3, out
