"""Recorded timelines of running graphs: a chain and the seed's overlap shape (3 senders -> 1).

Checked on the trace itself: it is trace-event JSON, every actor has exactly one event
per op per execution, the events of one track never overlap, and every send starts
before its receive ends on the shared axis. Off, nothing is recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import ray
import torch
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.runtime.recording import fetch

EXECUTIONS = 6


@ray.remote(num_cpus=0)
class Stage:
    def make(self, x: int) -> torch.Tensor:
        return torch.full((64, 64), float(x))

    def work(self, t: torch.Tensor) -> torch.Tensor:
        return t @ torch.eye(64) + 1

    def total(self, *ts: torch.Tensor) -> float:
        return float(sum(t.sum() for t in ts))


@pytest.fixture(scope="module")
def stages(ray_session: Any) -> Any:
    actors = [Stage.remote() for _ in range(4)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    yield actors
    for a in actors:
        ray.kill(a)


def chain(s: list[Any]) -> Any:
    with InputNode() as inp:
        x = s[0].make.bind(inp).with_tensor_transport("nccl")
        return s[2].total.bind(s[1].work.bind(x).with_tensor_transport("nccl"))


def seed_shape(s: list[Any]) -> Any:
    """Three senders, one receiver that computes on each tensor (seed 002)."""
    with InputNode() as inp:
        sent = [a.make.bind(inp).with_tensor_transport("nccl", _static_shape=True, _direct_return=True)
                for a in s[:3]]
        return MultiOutputNode([s[3].work.bind(t) for t in sent])


def recorded(dag: Any, overlap: bool, folder: Any) -> tuple[Any, dict[str, Any]]:
    compiled = cgraph.compile(dag, default_communicator="cpu", overlap_gpu_communication=overlap, timeline=True)
    try:
        for i in range(EXECUTIONS):
            compiled.execute(i).get(timeout=60)
        trace = json.loads(json.dumps(compiled.timeline()))
        summary = compiled.timeline_summary()
        picture = compiled.timeline(folder / "timeline.png", executions=2)
        return compiled, {"trace": trace, "summary": summary, "picture": picture}
    finally:
        compiled.teardown()


@pytest.mark.parametrize("shape", [chain, seed_shape])
@pytest.mark.parametrize("overlap", [False, True])
def test_one_event_per_op_per_execution_on_separate_tracks(stages: list[Any], shape: Any, overlap: bool,
                                                           tmp_path: Any) -> None:
    compiled, got = recorded(shape(stages), overlap, tmp_path)
    events = [e for e in got["trace"]["traceEvents"] if e["ph"] == "X"]
    names = {e["pid"]: e["args"]["name"] for e in got["trace"]["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    per_op = Counter((names[e["pid"]], e["args"]["op"], e["args"]["execution"]) for e in events)
    for actor, ops in compiled.schedule.items():
        label = compiled._labels[actor]
        for op in ops:
            counts = [per_op[(label, str(op), i)] for i in range(EXECUTIONS)]
            assert counts == [1] * EXECUTIONS, (str(op), counts)
    assert sum(per_op[("driver", "execute", i)] for i in range(EXECUTIONS)) == EXECUTIONS
    waits = {e["name"] for e in events if e["name"].startswith("wait ")}
    if overlap and shape is seed_shape:  # the receiver's methods wait for the overlapped RECVs
        assert waits == {"wait d.C4", "wait d.C5", "wait d.C6"}, waits
    elif not overlap:
        assert waits == set(), waits  # nothing is ever in flight for a method

    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for track, spans in by_track.items():
        spans.sort()
        assert all(end <= nxt + 1e-3 for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False)), track

    # A receive cannot end before its send began: on one axis, every send starts before its
    # receive ends. (Its *end* may come later: a buffered send returns after its data is
    # visible, and on 2 cores the sender may wait to be scheduled in between: 82 us seen.)
    ends = {(e["name"], e["args"]["execution"]): (e["ts"], e["ts"] + e["dur"])
            for e in events if ".SEND" in e["name"] or ".RECV" in e["name"]}
    pairs = []
    for name, execution in ends:
        if ".SEND" in name:  # a.SEND1>b pairs with b.RECV1<a
            sender, rest = name.split(".SEND")
            node, receiver = rest.split(">")
            pairs.append(((name, execution), (f"{receiver}.RECV{node}<{sender}", execution)))
    assert len(pairs) == EXECUTIONS * (2 if shape is chain else 3)
    for send, recv in pairs:
        assert ends[send][0] <= ends[recv][1], (send, ends[send], recv, ends[recv])
    summary = got["summary"]
    assert set(summary) == {"driver", *compiled._labels.values()}
    assert summary.executions == EXECUTIONS and summary.makespan > 0
    path = [op for op, _ in summary.critical_path]  # from the first actor's read to the last write
    last = "c.W3" if shape is chain else path[-1]
    assert path[0].endswith(".R0") and path[-1] == last and last.startswith(("c.W", "d.W")), path
    assert {mode for mode, _ in summary.predicted} == {"without overlap", "with overlap"}
    assert all(t > 0 for t in summary.predicted.values())
    assert got["picture"].read_bytes().startswith(b"\x89PNG")


def test_events_carry_bytes_and_a_collective_its_algorithm(stages: list[Any]) -> None:
    from cgraph.collective import allreduce

    with InputNode() as inp:
        sent = stages[0].make.bind(inp).with_tensor_transport("nccl")
        summed = allreduce.bind([stages[1].work.bind(sent), stages[2].make.bind(inp)], algorithm="ring")
        dag = MultiOutputNode([stages[1].total.bind(summed[0]), stages[2].total.bind(summed[1])])
    compiled = cgraph.compile(dag, default_communicator="cpu", overlap_gpu_communication=True, timeline=True)
    try:
        for i in range(3):
            assert compiled.execute(i).get(timeout=60) == [64.0 * 64 * (2 * i + 1)] * 2  # (i + 1) + i
        events = [e for e in compiled.timeline()["traceEvents"] if e["ph"] == "X"]
    finally:
        compiled.teardown()
    tensor = 64 * 64 * 4  # float32
    last = [e for e in events if e["args"]["execution"] == 2]
    pair = [e["args"].get("bytes") for e in last if e["cat"] in ("SEND", "RECV")]
    assert pair == [tensor, tensor], last
    collectives = [e for e in events if e["cat"] == "COLLECTIVE"]
    assert len(collectives) == 2 * 3 and all(e["args"]["bytes"] == tensor for e in collectives), collectives
    assert {e["args"]["what"] for e in collectives} == {"allreduce(op='sum', algorithm='ring')"}
    # a compute moves nothing; the input (an int) has no buffer to count
    assert all("bytes" not in e["args"] for e in last if e["cat"] == "COMPUTE" or e["name"].endswith(".R0"))


@ray.remote(num_cpus=0)
class Trainer:
    def join(self, world_size: int, rank: int, name: str) -> None:
        import cgraph.collective as col

        col.init_collective_group(world_size, rank, backend="cpu", group_name=name)

    def step(self, x: int, name: str) -> float:
        import cgraph.collective as col

        grad = torch.full((256,), float(x))
        col.allreduce(grad, group_name=name, algorithm="ring")
        return float(grad[0])


def test_a_collective_called_inside_a_method_is_an_event_with_its_group_and_algorithm(ray_session: Any) -> None:
    import cgraph.collective as col
    from tests.ray.collective_helpers import fresh

    name = fresh("timeline")
    trainers = [Trainer.remote() for _ in range(2)]
    ray.get([t.join.remote(2, rank, name) for rank, t in enumerate(trainers)], timeout=60)
    try:
        with InputNode() as inp:
            dag = MultiOutputNode([t.step.bind(inp, name) for t in trainers])
        compiled = cgraph.compile(dag, timeline=True)
        try:
            for i in range(3):
                assert compiled.execute(i).get(timeout=60) == [2.0 * i] * 2
            events = [e for e in compiled.timeline()["traceEvents"] if e["ph"] == "X"]
        finally:
            compiled.teardown()
    finally:
        ray.get([t.__ray_call__.remote(lambda _: col.destroy_collective_group(name)) for t in trainers])
        col.destroy_collective_group(name)  # the driver's side: what the group left behind
        for t in trainers:
            ray.kill(t)
    calls = [e for e in events if e["tid"] == 3]  # the "collective" track
    assert len(calls) == 2 * 3, calls
    assert {e["name"] for e in calls} == {f"allreduce(group_name={name!r}, algorithm='ring')"}
    assert all(e["args"]["bytes"] == 256 * 4 for e in calls)
    for e in calls:  # inside its method's event, on the same process
        (method,) = [m for m in events if m["pid"] == e["pid"] and m["cat"] == "COMPUTE"
                     and m["args"]["execution"] == e["args"]["execution"]]
        assert method["ts"] <= e["ts"] and e["ts"] + e["dur"] <= method["ts"] + method["dur"] + 1e-3


def test_nothing_is_recorded_when_the_timeline_is_off(stages: list[Any]) -> None:
    compiled = cgraph.compile(chain(stages), default_communicator="cpu", overlap_gpu_communication=True)
    try:
        for i in range(3):
            compiled.execute(i).get(timeout=60)
        fetched = ray.get([h.__ray_call__.remote(fetch, compiled._tag) for h in compiled._handles.values()])
        assert [f.events for f in fetched] == [[], [], []]
        with pytest.raises(RuntimeError, match="records no timeline"):
            compiled.timeline()
    finally:
        compiled.teardown()


def test_cgraph_timeline_writes_the_trace_at_teardown(stages: list[Any], tmp_path: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "timeline.json"
    monkeypatch.setenv("CGRAPH_TIMELINE", str(path))
    compiled = cgraph.compile(chain(stages), default_communicator="cpu")
    compiled.execute(1).get(timeout=60)
    compiled.teardown()
    written = json.loads(path.read_text())
    assert {e["name"] for e in written["traceEvents"] if e["ph"] == "X"} >= {"a.C1", "b.C2", "execute", "get"}
