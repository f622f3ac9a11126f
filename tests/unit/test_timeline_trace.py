"""Recorded events into a Chrome trace and a summary; the recorder's ring (no Ray)."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
import torch

from cgraph.runtime import recording
from cgraph.runtime.recording import At, Recorder
from cgraph.scheduler.simulate import Machine, compute_reads, simulate
from cgraph.visualize import draw_timeline, explain
from cgraph.visualize.explain import durations, executions
from cgraph.visualize.trace import summarize, trace_of

MS = 1_000_000  # ns

# a sends n1 to d on its comm thread; d receives it on its comm thread while computing n4
TRACKS = [
    ("driver", "driver", [("execute", "driver", 0, 0, 1 * MS), ("get", "driver", 0, 1 * MS, 20 * MS)], 0, 0),
    ("a", "a (W)", [
        ("a.R0", "loop", 0, 1 * MS, 2 * MS),
        ("a.C1", "loop", 0, 2 * MS, 6 * MS),
        ("a.SEND1>d@comm", "comm", 0, 6 * MS, 9 * MS),
    ], 0, 0),
    ("d", "d (W)", [  # on another node: its clock runs 5 ms ahead of the driver's
        ("d.RECV1<a@comm", "comm", 0, 11 * MS, 15 * MS),
        ("d.C4", "loop", 0, 13 * MS, 17 * MS),
        ("wait d.C5", "loop", 0, 17 * MS, 18 * MS),
        ("d.C5", "loop", 0, 18 * MS, 19 * MS),
        ("d.W5", "loop", 0, 19 * MS, 20 * MS),
    ], 5 * MS, 300_000),
]


def test_the_trace_names_processes_and_threads_and_puts_every_clock_on_the_drivers() -> None:
    trace = json.loads(json.dumps(trace_of(TRACKS)))  # plain JSON all the way down
    meta = {(e["pid"], e["tid"], e["name"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[(1, 0, "process_name")] == {"name": "a (W)"}
    assert meta[(1, 2, "thread_name")] == {"name": "comm"} and meta[(2, 1, "thread_name")] == {"name": "loop"}
    slices = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(slices) == 10
    assert slices["execute"]["ts"] == 0 and slices["a.C1"]["ts"] == 2000 and slices["a.C1"]["dur"] == 4000
    assert slices["d.RECV1<a"]["ts"] == 6000  # 11 ms on d's clock, 5 ms ahead
    assert slices["d.RECV1<a"]["cat"] == "RECV" and slices["d.RECV1<a"]["args"] == {"op": "d.RECV1<a@comm",
                                                                                      "execution": 0}
    assert trace["otherData"]["clocks"]["d (W)"] == {"offset_us": 5000.0, "uncertainty_us": 300.0}


def test_a_flow_arrow_runs_from_each_send_to_its_recv() -> None:
    flows = [e for e in trace_of(TRACKS)["traceEvents"] if e["ph"] in ("s", "f")]
    assert [(e["ph"], e["pid"], e["tid"], e["ts"]) for e in flows] == [("s", 1, 2, 6000.0), ("f", 2, 2, 10000.0)]
    assert flows[0]["id"] == flows[1]["id"] and flows[1]["bp"] == "e"


def test_a_recv_without_its_send_gets_no_arrow_and_an_empty_record_is_an_empty_trace() -> None:
    alone = [("d", "d", [("d.RECV1<a", "loop", 3, 0, 5)], 0, 0)]
    assert [e for e in trace_of(alone)["traceEvents"] if e["ph"] in ("s", "f")] == []
    assert [e for e in trace_of([])["traceEvents"] if e["ph"] == "X"] == []


def test_the_summary_measures_busy_compute_comm_and_overlap() -> None:
    summary = summarize(TRACKS)
    d = summary["d (W)"]
    assert d.executions == 1 and d.span == pytest.approx(9e-3)
    assert d.busy == pytest.approx(8e-3)  # 11-17 and 18-20; the wait 17-18 is not busy
    assert d.compute == pytest.approx(5e-3) and d.comm == pytest.approx(4e-3)
    assert d.overlapped == pytest.approx(2e-3) and d.overlap_fraction == pytest.approx(0.5)  # 13-15
    assert d.idle == pytest.approx(1e-3)
    a = summary["a (W)"]
    assert a.overlap_fraction == 0.0 and a.comm == pytest.approx(3e-3)
    assert summary["driver"].comm == 0 and summary["driver"].overlap_fraction == 0.0
    assert "overlapped 50% of comm" in str(d)


def test_the_recorder_keeps_the_latest_events_and_a_step_that_raises_adds_none() -> None:
    rec = Recorder(3)
    for i in range(5):
        rec.add("a.C1", "loop", i, i, i + 1)
    assert [e[2] for e in rec.snapshot()] == [2, 3, 4]
    owner = At(7)
    rec.timed("a.C2", "loop", owner, lambda: None)()
    owner.execution = 8  # read when the call starts

    def boom() -> None:
        raise ValueError("the loop ends")

    with pytest.raises(ValueError):
        rec.timed("a.C3", "loop", owner, boom)()
    op, track, execution, start, end, nbytes = rec.snapshot()[-1]
    assert (op, track, execution, nbytes) == ("a.C2", "loop", 7, None) and start <= end
    rec.timed("a.R0", "loop", owner, lambda: np.zeros(3), lambda value: value.nbytes)()
    assert rec.snapshot()[-1][5] == 24


def test_a_loops_runs_expand_into_events_and_only_the_latest_are_kept() -> None:
    rec = Recorder(4, runs=2)
    rec.add("a.SEND1>b@comm", "comm", 0, 5, 9, 16)
    for execution in range(3):
        base = 100 * execution
        rec.add_run(execution, ("a.R0", None, "a.C1"), [base, base + 1, base + 2, base + 7], [8, None, None])
    assert sorted(rec.snapshot()) == [
        ("a.C1", "loop", 1, 102, 107, None), ("a.C1", "loop", 2, 202, 207, None),
        ("a.R0", "loop", 1, 100, 101, 8), ("a.R0", "loop", 2, 200, 201, 8),
        ("a.SEND1>b@comm", "comm", 0, 5, 9, 16)]


def test_nbytes_counts_buffers_and_not_pickled_objects() -> None:
    assert recording.nbytes(np.zeros((2, 3))) == 48 and recording.nbytes(torch.zeros(4)) == 16
    assert recording.nbytes([torch.zeros(2), {"k": np.zeros(1), "x": 3}, b"abc"]) == 8 + 8 + 3
    assert recording.nbytes(3) is None and recording.nbytes([object()]) is None
    assert recording.nbytes([[[np.zeros(1)]]]) is None  # two levels deep at most


def test_events_bytes_and_notes_land_in_the_trace_args() -> None:
    tracks = [("a", "a", [("a.COLL3[a,b]@comm", "comm", 0, 0, 5, 64), ("a.C1", "loop", 0, 0, 5, None)], 0, 0)]
    slices = {e["name"]: e["args"] for e in trace_of(tracks, {"n3": "allreduce(algorithm='ring')"})["traceEvents"]
              if e["ph"] == "X"}
    assert slices == {"a.COLL3[a,b]": {"op": "a.COLL3[a,b]@comm", "execution": 0, "bytes": 64,
                                       "what": "allreduce(algorithm='ring')"},
                      "a.C1": {"op": "a.C1", "execution": 0}}


def test_appends_from_two_threads_and_snapshots_do_not_race() -> None:
    rec = Recorder(10_000)
    stop = threading.Event()

    def append() -> None:
        for i in range(20_000):
            rec.add("a.C1", "comm", i, i, i)
        stop.set()

    thread = threading.Thread(target=append)
    thread.start()
    while not stop.is_set():
        rec.snapshot()
    thread.join()
    assert len(rec.snapshot()) == 10_000


def test_a_process_keeps_the_recorders_of_its_latest_graphs_only() -> None:
    made = [recording.register(f"unit-{i}", 4) for i in range(recording._KEEP_GRAPHS + 2)]
    assert recording.register(f"unit-{recording._KEEP_GRAPHS + 1}", 4) is made[-1]
    assert "unit-0" not in recording._RECORDERS and "unit-1" not in recording._RECORDERS


def _seed_tracks(overlap: bool) -> tuple[Any, list[Any]]:
    """The seed DAG planned, and two recorded executions of it made up from SEED_TIMES (ms)."""
    from cgraph.scheduler import plan_schedule
    from tests.unit.test_scheduler_simulate import SEED, SEED_TIMES

    planned = plan_schedule(SEED, overlap=overlap)
    prediction = simulate(planned.schedule, SEED_TIMES, reads=compute_reads(SEED))
    tracks: list[Any] = [("driver", "driver", [("execute", "driver", 0, 0, 1)], 0, 0)]
    for actor, spans in prediction.tracks.items():
        events = [(str(s.op), s.track, e, int((s.start + 100 * e) * MS), int((s.end + 100 * e) * MS))
                  for e in (0, 1) for s in spans]
        tracks.append((actor, f"{actor} (W)", events, 0, 0))
    return planned, tracks


def test_explain_measures_the_makespan_and_critical_path_and_predicts_both_modes() -> None:
    planned, tracks = _seed_tracks(overlap=True)
    summary = explain(tracks, planned)
    assert summary.executions == 2 and summary.makespan == pytest.approx(75e-3)
    assert [op for op, _ in summary.critical_path] == [
        "s1.R0", "s1.C1", "r.RECV1<s1", "r.C4", "r.W4", "r.C5", "r.W5", "r.C6", "r.W6"]
    assert dict(summary.critical_path)["r.C4"] == pytest.approx(20e-3)
    assert summary.predicted[("without overlap", Machine.OWN_ENGINE)] == pytest.approx(85e-3)
    assert summary.predicted[("with overlap", Machine.OWN_ENGINE)] == pytest.approx(75e-3)
    assert summary.predicted[("with overlap", Machine.SHARED_CORES)] == pytest.approx(85e-3)
    assert summary.speedup(Machine.OWN_ENGINE) == pytest.approx(85 / 75)
    assert summary["r (W)"].compute == pytest.approx(120e-3)  # a mapping of per-process summaries
    text = str(summary)
    assert "critical path: s1.R0 0.00 > s1.C1 10.00" in text and "(1.13x)" in text
    # GPU actors: comm on its own engine, where the overlapped schedule it runs is best
    assert summary.decision is not None and summary.decision.machine is Machine.OWN_ENGINE
    assert summary.decision.choice == "with overlap" and not summary.decision.switches
    assert "overlap_gpu_communication='auto' would run with overlap: predicted 75 ms" in text


def test_explain_without_overlap_predicts_what_the_overlap_pass_would_give() -> None:
    planned, tracks = _seed_tracks(overlap=False)
    summary = explain(tracks, planned)
    assert summary.makespan == pytest.approx(85e-3)
    assert summary.predicted[("with overlap", Machine.OWN_ENGINE)] == pytest.approx(75e-3)
    assert summary.decision is not None and summary.decision.switches  # 75 ms is 12% under 85
    assert summary.decision.choice == "with overlap"
    assert explain([]).executions == 0 and str(explain(TRACKS)).startswith("measured")


def test_explain_on_cpu_actors_decides_on_the_cores_they_share() -> None:
    from dataclasses import replace

    planned, tracks = _seed_tracks(overlap=True)
    cpu = replace(planned, graph=replace(planned.graph, actors=tuple(replace(a, gpus=0) for a in planned.graph.actors)))
    summary = explain(tracks, cpu, cores=1)
    decision = summary.decision
    assert decision is not None and decision.machine is Machine.SHARED_CORES and decision.cores == 1
    # on one core for four actors every op runs in turn: overlap saves nothing, so "auto" keeps
    # the schedule it runs (the overlapped one) and says why
    assert decision.predicted["with overlap"] == decision.predicted["without overlap"]
    assert decision.choice == "with overlap" and "kept" in str(decision)


def test_durations_take_a_blocking_ops_least_waited_sample() -> None:
    tracks = [("d", "d", [("d.RECV1<a@comm", "comm", 0, 0, 9 * MS), ("d.RECV1<a@comm", "comm", 1, 0, 2 * MS),
                          ("d.C2", "loop", 0, 0, 1 * MS), ("d.C2", "loop", 1, 0, 3 * MS),
                          ("d.C2", "loop", 2, 0, 8 * MS), ("wait d.C2", "loop", 0, 0, 5 * MS)], 0, 0)]
    assert durations(tracks) == {"d.RECV1<a": pytest.approx(2e-3), "d.C2": pytest.approx(3e-3)}


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_gantt_picture_is_written(tmp_path: Any, suffix: str) -> None:
    _, tracks = _seed_tracks(overlap=True)
    path = draw_timeline(tracks, tmp_path / f"t{suffix}", executions=1)
    head = path.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in path.read_bytes()
    with pytest.raises(ValueError, match="no recorded event"):
        draw_timeline([], tmp_path / "empty.png")


def test_an_actor_waiting_for_the_input_is_idle_until_the_driver_submitted() -> None:
    tracks = [("driver", "driver", [("execute", "driver", 3, 5 * MS, 6 * MS)], 0, 0),
              ("a", "a", [("a.R0", "loop", 3, 0, 7 * MS), ("a.C1", "loop", 3, 7 * MS, 9 * MS)], 0, 0)]
    assert executions(tracks) == {3: {"a.R0": (pytest.approx(6e-3), pytest.approx(7e-3)),
                                      "a.C1": (pytest.approx(7e-3), pytest.approx(9e-3))}}
    assert durations(tracks)["a.R0"] == pytest.approx(1e-3)
    assert explain(tracks).makespan == pytest.approx(3e-3)
