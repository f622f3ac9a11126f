"""SEND / RECV / COLLECTIVE handlers: whole graphs run in threads, without Ray.

    text graph ─plan_schedule─► channels (create_channel) + communicators (setup_communicators)
                                     │ one ActorProgram per actor, pickled as Ray would ship it
                                     ▼
              thread per actor: run_actor_loop(instance, program)      driver: input writer, output readers

The harness is what ``launch`` does, minus Ray: it checks the handlers, the
overlap thread, collectives, error values and user communicators on the
CPU communicator in milliseconds.
"""

from __future__ import annotations

import glob
import os
import pickle
import threading
import uuid
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.channels.opener import open_endpoint
from cgraph.comm.communicator import Communicator
from cgraph.comm.kinds import BACKENDS, KINDS
from cgraph.errors import CompileError
from cgraph.ir import DRIVER, parse_graph
from cgraph.runtime.communicators import setup_communicators
from cgraph.runtime.endpoints import create_channel
from cgraph.runtime.error_value import ErrorValue
from cgraph.runtime.executor import HANDLERS, after_overlapped_sends, run_actor_loop
from cgraph.runtime.options import CompileOptions
from cgraph.runtime.program import ActorProgram, compute_spec
from cgraph.scheduler import OpKind, format_schedule, groups, plan_schedule
from cgraph.scheduler.ahead import run_ahead
from tests.fabric import LocalTransport


@pytest.fixture(autouse=True)
def no_segments_left():  # type: ignore[no-untyped-def]
    """Every test here removes the shared-memory segments it made."""
    before = set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*"))
    yield
    assert set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*")) - before == set()


class W:
    def make(self, x: int) -> torch.Tensor:
        return torch.full((3,), float(x))

    def nested(self, x: int) -> dict[str, Any]:
        return {"t": torch.arange(abs(x) + 1.0), "k": x}

    def double(self, t: Any) -> Any:
        return t * 2

    def total(self, *ts: Any) -> float:
        return float(sum(float(t["t"].sum()) if isinstance(t, dict) else float(t.sum()) for t in ts))

    def fail_if(self, x: int) -> torch.Tensor:
        if x < 0:
            raise ValueError(f"negative {x}")
        return torch.full((2,), float(x))

    def ident(self, t: Any) -> Any:
        return t

    def pos(self, x: int) -> torch.Tensor:
        return torch.full((2,), float(abs(x)))

    def big(self, x: int) -> torch.Tensor:
        return torch.full((1 << 22,), float(x))  # 16 MiB: a send long enough to be overtaken

    def bump(self, t: torch.Tensor) -> int:
        t.add_(1000.0)  # in place, on the tensor this actor is sending
        return 0

    def spread(self, t: torch.Tensor) -> list[float]:
        return [float(t.min()), float(t.max())]


class Harness:
    """A compiled graph whose actors are threads of this process."""

    def __init__(self, text: str, *, overlap: bool = False, communicators: dict[str, Any] | None = None,
                 default: str | None = "cpu", constants: tuple[Any, ...] = (), auto: str | None = None,
                 ahead: bool = False) -> None:
        graph = parse_graph(text, constants)
        self.planned = plan_schedule(graph, overlap=bool(overlap or auto or ahead), default_communicator=default)
        if ahead:  # every leading RECV, whatever its communicator (the pipeline's pass: gloo, nccl)
            self.planned = replace(self.planned, schedule=run_ahead(self.planned.schedule),
                                   passes=(*self.planned.passes, ("ahead", run_ahead(self.planned.schedule))))
        passes = dict(self.planned.passes)
        tag = self.tag = uuid.uuid4().hex[:8]
        options = CompileOptions(max_inflight_executions=4, default_communicator=default)
        plan = self.planned.plan
        self.res = {s.id: create_channel(s, tag=tag, options=options) for s in plan.channels}
        front = SimpleNamespace(handles={}, communicators=communicators or {})
        try:
            self.comm = setup_communicators(front, self.planned, tag, options)
        except BaseException:
            for r in self.res.values():
                r.unlink()
            raise
        self.results: dict[str, Any] = {}
        self.threads = []
        for actor, ops in self.planned.schedule.items():
            program = ActorProgram(
                actor=actor, label=actor, graph_tag=tag, ops=ops,
                computes={op.node: compute_spec(graph.node(op.node), graph) for op in ops if op.kind is OpKind.COMPUTE},
                readers={op.node: self.res[plan.for_reader(op.node, actor).id].reader_handle(actor)
                         for op in ops if op.kind is OpKind.READ},
                writers={op.node: tuple(self.res[s.id].writer_handle() for s in plan.for_node(op.node)
                                        if s.kind.name != "COMM") for op in ops if op.kind is OpKind.WRITE},
                input_node="n0", comm=self.comm.program_of(actor),
            )
            if auto:  # overlap="auto": starts on schedule ``auto``, may switch (runtime/switches.py)
                both = {"without overlap": passes["lower"][actor], "with overlap": passes["overlap"][actor]}
                if ahead:
                    both["ahead"] = passes["ahead"][actor]
                program = replace(program, ops=both[auto], schedules=both)
            program = pickle.loads(pickle.dumps(program))  # each actor gets its own copy, as from Ray
            thread = threading.Thread(target=self._loop, args=(actor, program), daemon=True)
            thread.start()
            self.threads.append(thread)
        (spec,) = plan.for_node("n0")
        self.input = open_endpoint(self.res[spec.id].writer_handle())
        self.outputs = [open_endpoint(self.res[plan.for_reader(o, DRIVER).id].reader_handle(DRIVER)) for o in graph.outputs]

    def _loop(self, actor: str, program: ActorProgram) -> None:
        try:
            self.results[actor] = run_actor_loop(W(), program)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.results[actor] = exc

    def run(self, *inputs: Any) -> list[list[Any]]:
        for x in inputs:
            self.input.write(((x,), {}), timeout=10)
        out = []
        for _ in inputs:
            row = []
            for reader in self.outputs:
                row.append(pickle.loads(pickle.dumps(reader.read(timeout=20))))
                reader.release()
            out.append(row)
        return out

    def close(self) -> dict[str, Any]:
        for r in (*self.res.values(), self.comm):
            r.close()
        for thread in self.threads:
            thread.join(10)
        for r in (*self.res.values(), self.comm):
            r.unlink()
        return self.results

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        results = self.close()
        if exc[0] is None:
            assert results == {a: "closed" for a in self.planned.schedule}, results


CHAIN = """
actor a = W(gpus=0)
actor b = W(gpus=0)
actor c = W(gpus=0)
n0 = input
n1 = a.make(n0) :nccl
n2 = b.double(n1) :nccl
n3 = c.total(n2)
return n3
"""

SEED = """
actor s1 = W(gpus=0)
actor s2 = W(gpus=0)
actor s3 = W(gpus=0)
actor r = W(gpus=0)
n0 = input
n1 = s1.make(n0) :nccl[static_shape,direct_return]
n2 = s2.nested(n0) :nccl
n3 = s3.fail_if(n0) :nccl[static_shape,direct_return]
n4 = r.total(n1)
n5 = r.total(n2)
n6 = r.double(n3)
return [n4, n5, n6]
"""


def test_chain_through_two_communicator_edges() -> None:
    with Harness(CHAIN) as h:
        assert h.run(1, 2, 3) == [[6.0 * x] for x in (1, 2, 3)]


def normalise(row: list[Any]) -> list[Any]:
    return [v.message if isinstance(v, ErrorValue) else v.tolist() if isinstance(v, torch.Tensor) else v for v in row]


@pytest.mark.parametrize("overlap", [False, True])
def test_seed_shape_same_results_with_and_without_overlap(overlap: bool) -> None:
    inputs = [1, 4, -1, 2, 0, -3, 5]
    with Harness(SEED, overlap=overlap) as h:
        if overlap:
            assert "r.RECV1<s1@comm r.RECV2<s2@comm r.RECV3<s3@comm r.C4" in format_schedule(h.planned.schedule)
        got = [normalise(row) for row in h.run(*inputs)]
    for x, row in zip(inputs, got, strict=True):
        third = [2.0 * x] * 2 if x >= 0 else f"ValueError: negative {x}"
        assert row == [3.0 * x, float(sum(range(abs(x) + 1))), third]


def test_auto_switches_every_loop_at_one_execution_and_values_never_mix() -> None:
    from cgraph.runtime import switches

    inputs = [1, 4, -1, 2, 0, -3, 5, 3]
    with Harness(SEED, auto="without overlap") as h:
        first = [normalise(row) for row in h.run(*inputs[:3])]
        # the driver asks while it holds back execution 3's input: every loop switches after it
        for actor in h.planned.schedule:
            switches.request(None, h.tag, actor, 4, "with overlap", False)
        rest = [normalise(row) for row in h.run(*inputs[3:])]
        at = {actor: switches.switched_at(None, h.tag, actor) for actor in h.planned.schedule}
    assert at == dict.fromkeys(h.planned.schedule, 4)
    for x, row in zip(inputs, first + rest, strict=True):
        third = [2.0 * x] * 2 if x >= 0 else f"ValueError: negative {x}"
        assert row == [3.0 * x, float(sum(range(abs(x) + 1))), third]


def test_a_loop_that_switches_to_overlap_runs_its_comm_ops_on_a_comm_thread() -> None:
    """A loop that starts without overlap has no comm thread; after switching to the
    overlapped schedule its RECVs must run on one (they ran inline before, so the
    switch changed the order of ops and overlapped nothing)."""
    from cgraph.runtime import switches

    def comm_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("cgraph-comm")}

    with Harness(SEED, auto="without overlap") as h:
        before = comm_threads()
        h.run(1, 2)
        assert comm_threads() - before == set(), "the lowered schedule runs its comm ops inline"
        for actor in h.planned.schedule:
            switches.request(None, h.tag, actor, 3, "with overlap", False)
        h.run(3, 4, 5)
        assert len(comm_threads() - before) == 4, "every actor's comm ops now run on its comm thread"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(-3, 6), min_size=2, max_size=7), st.data())
def test_a_switch_at_any_boundary_with_any_executions_in_flight_changes_no_value(inputs: list[int], data) -> None:
    """Property: whichever execution the switch names (holding back the one before it, as the
    driver does) and however many are in flight after it, every loop switches there, in
    either direction, and every result is the one without a switch."""
    at = data.draw(st.integers(1, len(inputs) - 1), label="switch at")
    start, to = data.draw(st.permutations(["with overlap", "without overlap"]), label="from, to")
    switch_and_check(inputs, at, start, to)


def switch_and_check(inputs: list[int], at: int, start: str, to: str, ahead: bool = False) -> None:
    """Run SEED's ``inputs`` starting on schedule ``start``, every loop asked to switch to ``to``
    at execution ``at``; every loop switches there and every result is the one without a switch."""
    from cgraph.runtime import switches

    with Harness(SEED, auto=start, ahead=ahead) as h:
        first = [normalise(row) for row in h.run(*inputs[:at - 1])] if at > 1 else []
        for actor in h.planned.schedule:  # execution at - 1's input is not written yet
            switches.request(None, h.tag, actor, at, to, False)
        rest = [normalise(row) for row in h.run(*inputs[at - 1:])]
        switched = {actor: switches.switched_at(None, h.tag, actor) for actor in h.planned.schedule}
    assert switched == dict.fromkeys(h.planned.schedule, at)
    for x, row in zip(inputs, first + rest, strict=True):
        third = [2.0 * x] * 2 if x >= 0 else f"ValueError: negative {x}"
        assert row == [3.0 * x, float(sum(range(abs(x) + 1))), third]


COLLECTIVE = """
actor a = W(gpus=0)
actor b = W(gpus=0)
actor c = W(gpus=0)
n0 = input
n1 = a.fail_if(n0)
n2 = b.pos(n0)
n3 = {method}(n1, n2)
n4 = n3[0]
n5 = n3[1]
n6 = c.ident(n4)
return [n6, n5]
"""


@pytest.mark.parametrize(
    ("method", "member_a", "member_b"),
    [
        ("allreduce", [4.0, 4.0], [4.0, 4.0]),
        ("allgather", [2.0] * 4, [2.0] * 4),
        ("reducescatter", [4.0], [4.0]),
    ],
)
def test_collectives_and_an_error_on_one_member(method: str, member_a: list[float], member_b: list[float]) -> None:
    with Harness(COLLECTIVE.format(method=method)) as h:
        ok, bad, again = h.run(2, -1, 2)
    assert [v.tolist() for v in ok] == [member_a, member_b]
    assert isinstance(bad[0], ErrorValue) and bad[0].message == "ValueError: negative -1"
    assert isinstance(bad[1], ErrorValue)  # the failing member's error, on every member
    assert (bad[1].message, bad[1].method) == ("ValueError: negative -1", "fail_if")
    assert [v.tolist() for v in again] == [member_a, member_b]  # the graph keeps working


NAMED = """
actor a = W(gpus=0)
actor b = W(gpus=0)
n0 = input
n1 = a.pos(n0)
n2 = b.pos(n0)
n3 = allreduce(n1, n2, algorithm=$0)
n4 = n3[0]
n5 = n3[1]
return [n4, n5]
"""


def test_a_named_algorithm_runs_where_the_communicator_offers_it_and_fails_the_call_elsewhere() -> None:
    with Harness(NAMED, constants=("tree",)) as h:  # the CPU communicator offers cgraph's
        (ok,) = h.run(3)
    assert [v.tolist() for v in ok] == [[6.0, 6.0], [6.0, 6.0]]
    with Harness(NAMED.replace("$0)", "$0) :custom:Board"), constants=("tree",),
                 communicators={"custom:Board": BoardCommunicator()}, default=None) as h:
        refused, = h.run(3)
    assert all(isinstance(v, ErrorValue) for v in refused)  # on every member, and the graph goes on
    assert "(BoardCommunicator) offers algorithm 'auto' only, not 'tree'" in refused[0].message


class BoardCommunicator(Communicator):
    """A user communicator whose members meet on an in-memory board keyed by group name."""

    boards: dict[str, list[LocalTransport]] = {}
    lock = threading.Lock()
    sends = 0

    def initialize(self, rank: int, world_size: int, group_name: str) -> None:
        with self.lock:
            board = self.boards.setdefault(group_name, LocalTransport.create(world_size))
        self.ep = board[rank]

    rank = property(lambda self: self.ep.rank)  # type: ignore[assignment]
    world_size = property(lambda self: self.ep.world_size)  # type: ignore[assignment]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        type(self).sends += 1
        self.ep.send(np.ascontiguousarray(tensor.numpy()), dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.ep.recv(tensor.numpy(), src)

    def abort(self) -> None:
        self.ep.abort("aborted by cgraph")


def test_user_communicator_is_copied_initialised_and_used() -> None:
    text = CHAIN.replace(":nccl", ":custom:Board")
    before = BoardCommunicator.sends
    with Harness(text, communicators={"custom:Board": BoardCommunicator()}, default=None) as h:
        assert h.run(1, 2) == [[6.0], [12.0]]
    assert BoardCommunicator.sends - before == 4  # 2 edges x 2 executions, all through the user's object
    bad = SimpleNamespace(send=1)
    with pytest.raises(CompileError, match="lacks initialize, send, recv"):
        Harness(text, communicators={"custom:Board": bad}, default=None)


def test_every_group_kind_has_a_row_and_groups_are_planned_per_transport() -> None:
    assert set(KINDS) == {"cpu", "gloo", "nccl", "cuda_ipc", "custom"}
    assert set(KINDS) == set(groups.KINDS), "comm makes and opens every kind the planner plans"
    assert BACKENDS == ("cpu", "gloo", "nccl"), "the API's backends are the kinds with connect"
    graph = parse_graph(COLLECTIVE.format(method="allreduce"))
    planned = plan_schedule(graph, default_communicator="cpu")
    assert [str(g) for g in planned.plan.groups] == ["group cpu = cpu a,b via cpu for n3"]
    planned = plan_schedule(parse_graph(CHAIN), default_communicator="cpu")
    assert [str(g) for g in planned.plan.groups] == ["group cpu = cpu a,b,c via cpu"]


def test_handlers_table_covers_every_op_kind() -> None:
    assert set(HANDLERS) == set(OpKind)


SEND_THEN_BUMP = """
actor a = W(gpus=0)
actor b = W(gpus=0)
n0 = input
n1 = a.big(n0) :nccl[static_shape,direct_return]
n2 = a.bump(n1)
n3 = b.spread(n1)
return [n3, n2]
"""


def test_overlapped_send_fences_the_next_method() -> None:
    """The method after a SEND@comm waits for it: it updates the tensor being sent."""
    with Harness(SEND_THEN_BUMP, overlap=True) as h:
        assert "SEND1>b@comm" in format_schedule(h.planned.schedule)
        assert after_overlapped_sends(h.planned.schedule["a"]) == {"n2"}
        rows = [row for start in (0, 4, 8) for row in h.run(*range(start, start + 4))]
    assert [row[0] for row in rows] == [[float(x), float(x)] for x in range(12)]


def test_only_methods_after_an_overlapped_send_fence() -> None:
    plain = plan_schedule(parse_graph(SEND_THEN_BUMP), overlap=False, default_communicator="cpu").schedule
    assert after_overlapped_sends(plain["a"]) == set()
    seed = plan_schedule(parse_graph(SEED), overlap=True, default_communicator="cpu").schedule
    assert all(after_overlapped_sends(ops) == set() for ops in seed.values())  # sends last, recvs hoisted


@pytest.mark.parametrize("get_timeout", [7.5, None])
def test_a_nccl_groups_first_handshake_waits_the_graphs_get_timeout(monkeypatch, get_timeout) -> None:
    import cgraph.comm.ray_store as ray_store
    from cgraph.comm.ray_store import RENDEZVOUS_TIMEOUT_S

    monkeypatch.setattr(ray_store, "start_store_actor", lambda: "store actor")
    planned = plan_schedule(parse_graph(CHAIN), overlap=False, default_communicator="cpu")
    res = setup_communicators(SimpleNamespace(handles={}, communicators={}), planned, "t",
                              CompileOptions(get_timeout=get_timeout))
    try:
        rendezvous = res.add(KINDS["nccl"].make("t", "g", 2, None, res.rendezvous_timeout_s))
    finally:
        res.close()
        res.keep_alive.clear()
        res.unlink()
    assert [r.timeout_s for r in rendezvous] == [get_timeout or RENDEZVOUS_TIMEOUT_S] * 2


def test_a_member_stuck_making_its_group_ends_its_loop_when_the_graph_closes(monkeypatch) -> None:
    """Making a torch group waits for every rank; a rank that died before joining left the
    others waiting for the group's own timeout, and teardown waited with them. The loop now
    waits for the making or the group's control closing, whichever comes first."""
    from cgraph.runtime import comm_ops

    made_by_others, release = comm_ops.open_group, threading.Event()

    def stuck_for_rank_1(endpoint: Any) -> Any:
        if endpoint.rank == 1:
            release.wait(60)  # a peer that never comes
        return made_by_others(endpoint)

    monkeypatch.setattr(comm_ops, "open_group", stuck_for_rank_1)
    harness = Harness(CHAIN)
    try:
        results = harness.close()  # teardown: every control closes
        assert all(not t.is_alive() for t in harness.threads), "every loop ended, the stuck one too"
        assert results == {a: "closed" for a in harness.planned.schedule}, results
    finally:
        release.set()
