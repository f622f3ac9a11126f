"""The Ray-compatible surface: experimental_compile, execute_async, visualize."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import pytest
import ray

import cgraph
from tests.ray.actors import Worker

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def pair(actors):
    return actors(Worker, 1, "a")[0], actors(Worker, 1, "b")[0]


def test_experimental_compile_with_cgraph_input_node(pair):
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = b.mul.bind(a.inc.bind(inp))  # single output: root is Ray's own node
    compiled = dag.experimental_compile(_max_inflight_executions=4)
    try:
        assert isinstance(compiled, cgraph.CompiledGraph)
        assert ray.get(compiled.execute(1)) == 4
    finally:
        compiled.teardown()


def test_multi_output_experimental_compile(pair):
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = cgraph.MultiOutputNode([a.inc.bind(inp), b.mul.bind(inp)])
    compiled = dag.experimental_compile()
    try:
        assert compiled.execute(3).get() == [4, 6]
    finally:
        compiled.teardown()


def test_execute_async(pair):
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = b.mul.bind(a.inc.bind(inp))
    compiled = dag.experimental_compile(enable_asyncio=True)

    async def main():
        futs = [await compiled.execute_async(i) for i in range(4)]
        return [await f for f in futs]

    try:
        assert asyncio.run(main()) == [2, 4, 6, 8]
    finally:
        compiled.teardown()


def test_one_thread_submits_while_another_reads(pair):
    # the pattern behind execute_async: execute() in one thread, get() in another,
    # each blocking on its own lock; every result arrives, in order, none lost
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = cgraph.MultiOutputNode([b.mul.bind(a.inc.bind(inp)), a.inc.bind(inp)])
    compiled = dag.experimental_compile(_max_inflight_executions=3)
    pending: queue.Queue = queue.Queue()
    results: list = []
    count = 200

    def produce():
        i = 0
        while i < count:
            try:
                pending.put(compiled.execute(i))
            except cgraph.CapacityError:
                time.sleep(0.001)  # the reader has not taken enough yet
                continue
            i += 1

    def consume():
        for _ in range(count):
            results.append(pending.get(timeout=60).get(timeout=60))

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert results == [[2 * (i + 1), i + 1] for i in range(count)]
        assert not compiled._outputs._results and not compiled._outputs._unread
    finally:
        compiled.teardown()


def test_visualize_writes_picture(pair, tmp_path):
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = b.mul.bind(a.inc.bind(inp))
    compiled = cgraph.compile(dag)
    try:
        picture = compiled.visualize(str(tmp_path / "sched"), format="svg")
        path = picture.path
        assert path.exists() and path.suffix in (".svg", ".dot")
        text = path.read_text()
        assert "a.C" in text and "b.C" in text
        assert isinstance(picture, str) and "a.C" in picture, "Ray's return type: the DOT source"
    finally:
        compiled.teardown()


def test_colocate_pins_loops_and_driver_then_restores(ray_session):
    import os
    import threading

    from tests.ray.actors import AffinityProbe

    probe = AffinityProbe.remote()
    try:
        allowed = sorted(os.sched_getaffinity(0))
        with cgraph.InputNode() as inp:
            dag = probe.cpus.bind(inp)
        compiled = cgraph.compile(dag, cpu_affinity="colocate")
        try:
            inside = compiled.execute(0).get(timeout=60)
            driver = sorted(os.sched_getaffinity(threading.get_native_id()))
        finally:
            compiled.teardown()
        assert inside == [max(allowed)] and driver == [max(allowed)]
        assert sorted(os.sched_getaffinity(threading.get_native_id())) == allowed
        with pytest.raises(ValueError, match="cpu_affinity"):
            cgraph.compile(dag, cpu_affinity="everywhere")
    finally:
        ray.kill(probe)


def test_on_full_wait_makes_execute_wait_for_a_slow_consumer_instead_of_raising(pair):
    """Backpressure (vllm#12747, ray#50381): 20 executions through 2 slots of a slow actor,
    never read until the end; execute waits for the oldest, nothing raises, every result
    is right and in order."""
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = b.mul.bind(a.sleep_then.bind(inp, seconds=0.02))
    compiled = cgraph.compile(dag, max_inflight_executions=2, on_full="wait")
    try:
        refs = [compiled.execute(i) for i in range(20)]
        assert [ref.get(timeout=60) for ref in refs] == [2 * i for i in range(20)]
        assert not compiled._outputs._results, "every buffered result was taken by its ref"
    finally:
        compiled.teardown()


def test_on_full_wait_gives_up_after_submit_timeout_and_the_graph_stays_usable(pair, tmp_path):
    """The oldest execution blocks (its actor waits for a file): execute at capacity waits
    submit_timeout, then raises CapacityError naming on_full; nothing was submitted. Once
    the file exists, every result comes, and the graph takes new executions."""
    a, b = pair
    gate = tmp_path / "go"
    with cgraph.InputNode() as inp:
        dag = b.inc.bind(a.when_exists.bind(inp, str(gate)))
    compiled = cgraph.compile(dag, max_inflight_executions=1, on_full="wait", submit_timeout=0.5)
    try:
        first = compiled.execute(1)
        with pytest.raises(cgraph.CapacityError, match="on_full='wait'") as info:
            compiled.execute(2)
        assert "execution 0" in str(info.value) and "submit_timeout" in str(info.value)
        gate.touch()
        assert first.get(timeout=60) == 2
        assert [compiled.execute(i).get(timeout=60) for i in (5, 6)] == [6, 7]
    finally:
        compiled.teardown()


def test_on_full_wait_with_execute_async_never_blocks_the_event_loop(pair):
    a, b = pair
    with cgraph.InputNode() as inp:
        dag = b.mul.bind(a.sleep_then.bind(inp, seconds=0.02))
    compiled = cgraph.compile(dag, max_inflight_executions=2, on_full="wait", enable_asyncio=True)

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        futs = [await compiled.execute_async(i) for i in range(10)]  # 8 of them wait for room
        while_submitting = ticks
        values = [await f for f in futs]
        ticker.cancel()
        return values, while_submitting

    try:
        values, ticks = asyncio.run(main())
        assert values == [2 * i for i in range(10)]
        assert ticks > 0, "the event loop ran while execute_async waited for room"
    finally:
        compiled.teardown()


def test_wait_returns_the_ready_refs_in_order_and_takes_no_result(pair, tmp_path):
    """``cgraph.wait`` as ``ray.wait`` (ray#51391): each execution waits for its own file;
    results come in execution order, so a later one is not ready before an earlier one."""
    a, _ = pair
    with cgraph.InputNode() as inp:
        dag = a.when_exists.bind(inp, inp)  # the input is the gate's path: returned once it exists
    compiled = cgraph.compile(dag, max_inflight_executions=3)
    gates = [tmp_path / f"g{i}" for i in range(3)]
    try:
        refs = [compiled.execute(str(g)) for g in gates]
        assert cgraph.wait(refs, timeout=0) == ([], refs)
        assert cgraph.wait(refs, num_returns=2, timeout=0.2) == ([], refs)
        gates[0].touch()
        assert cgraph.wait(refs) == ([refs[0]], refs[1:])  # no timeout: until one is ready
        gates[2].touch()  # execution 2 finishes only after 1
        assert cgraph.wait(refs[1:], timeout=0.2) == ([], refs[1:])
        gates[1].touch()
        later = [refs[2], refs[1]]
        assert cgraph.wait(later, num_returns=2) == (later, [])
        assert cgraph.wait(refs, num_returns=3, timeout=0) == (refs, [])
        assert [ref.get(timeout=0) for ref in refs] == [str(g) for g in gates], "wait took nothing"
        assert cgraph.wait(refs, num_returns=3, timeout=0) == (refs, []), "a read ref is ready"
    finally:
        compiled.teardown()


def test_wait_across_two_graphs_and_on_futures_and_errors(pair, tmp_path):
    a, b = pair
    with cgraph.InputNode() as inp:
        slow = a.when_exists.bind(inp, inp)
    with cgraph.InputNode() as inp:
        failing = b.fail_if.bind(inp, bad=3)
    g1 = cgraph.compile(slow, enable_asyncio=True)
    g2 = cgraph.compile(failing)
    gate = tmp_path / "gate"
    try:
        r1, r2 = g1.execute(str(gate)), g2.execute(3)
        assert cgraph.wait([r1, r2], timeout=30) == ([r2], [r1]), "an error is ready: get raises at once"
        with pytest.raises(ValueError, match="bad input 3"):
            r2.get(timeout=0)
        gate.touch()
        assert cgraph.wait([r1], timeout=30) == ([r1], [])
        assert r1.get(timeout=0) == str(gate)

        async def futures():
            futs = [await g1.execute_async(str(gate)) for _ in range(2)]
            ready, rest = cgraph.wait(futs, num_returns=2, timeout=30)
            return ready == futs and rest == [], [await f for f in futs]

        assert asyncio.run(futures()) == (True, [str(gate)] * 2)
        with pytest.raises(TypeError, match="list of compiled refs"):
            cgraph.wait(r1)
        with pytest.raises(TypeError, match="compiled refs or futures"):
            cgraph.wait([ray.put(1)])
        ref = g2.execute(1)
        with pytest.raises(ValueError, match="unique"):
            cgraph.wait([ref, ref])
        with pytest.raises(ValueError, match="num_returns cannot be greater"):
            cgraph.wait([ref], num_returns=2)
        with pytest.raises(ValueError, match="nonnegative"):
            cgraph.wait([ref], timeout=-1)
        assert ref.get(timeout=30) == 1
    finally:
        g1.teardown()
        g2.teardown()


@pytest.mark.parametrize("timeline", [False, True], ids=["plain-loop", "recorded-loop"])
def test_a_timeout_says_where_each_actor_is_and_status_shows_it(pair, tmp_path, timeline):
    """The most reported failure of Ray CG is a timeout that names nothing (vllm#27116):
    a sleeps in its method, b waits for a's value; get(timeout) names both, status() too.
    The loop that records a timeline keeps the record as the plain one does."""
    a, b = pair
    gate = tmp_path / "go"
    with cgraph.InputNode() as inp:
        dag = b.inc.bind(a.when_exists.bind(inp, str(gate)))
    compiled = cgraph.compile(dag, timeline=timeline)
    try:
        gate.touch()
        assert compiled.execute(1).get(timeout=60) == 2
        gate.unlink()
        ref = compiled.execute(2)
        with pytest.raises(cgraph.TimeoutError) as info:
            ref.get(timeout=1)
        text = str(info.value)
        assert "execution 1 did not finish in time" in text, text
        assert "a (Worker, node 0): running when_exists for " in text, text
        assert "b (Worker, node 0): waiting " in text and "for a's value on channel" in text, text
        assert "(execution 1, op a.C" in text and "(execution 1, op b.R" in text, text
        status = compiled.status()
        rows = {w.actor: w for w in status}
        assert rows["a"].state == "running" and rows["a"].execution == 1 and rows["a"].seconds >= 1
        assert rows["b"].state == "waiting" and rows["b"].op.startswith("b.R")
        table = str(status)
        assert table.splitlines()[0].split()[:3] == ["actor", "execution", "op"] and "when_exists" in table
        with pytest.raises(cgraph.TimeoutError, match=r"compiled.status\(\) says where"):
            ref.get(timeout=0)  # a poll does not ask every actor
        gate.touch()
        assert ref.get(timeout=60) == 3
        idle = {w.actor: w for w in compiled.status()}
        assert idle["a"].op.startswith("a.R") and "the driver's value" in idle["a"].detail, idle
    finally:
        compiled.teardown()
    assert {w.state for w in compiled.status()} <= {"ended", "no answer"}


def test_wait_counts_a_ref_whose_get_would_pass_the_buffer_as_ready(pair):
    """Ready means get answers at once: with max_buffered_results=1, reading execution 2
    would buffer two earlier results, so its get raises CapacityError at once; wait says
    ready instead of spinning to its timeout."""
    a, _ = pair
    with cgraph.InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = cgraph.compile(dag, max_inflight_executions=3, max_buffered_results=1)
    try:
        refs = [compiled.execute(i) for i in range(3)]
        assert cgraph.wait([refs[2]], timeout=30) == ([refs[2]], [])
        with pytest.raises(cgraph.CapacityError, match="max_buffered_results"):
            refs[2].get(timeout=0)
        assert [ref.get(timeout=30) for ref in refs] == [1, 2, 3]
    finally:
        compiled.teardown()
