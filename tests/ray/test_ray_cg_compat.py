"""Behaviours that programs written for Ray Compiled Graphs rely on, run on cgraph.

Each test pins one user-visible behaviour of Ray's Compiled Graphs (Ray 2.60,
``ray.dag.compiled_dag_node`` and ``ray.experimental.compiled_dag_ref``; the
"Execution and failure semantics" and "Troubleshooting" pages of the Compiled
Graph docs) that tests/ray does not already cover. Each gap the survey found in
cgraph was first pinned here as an ``xfail(strict=True)`` test; all are closed.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import pickle
import threading
import time

import numpy as np
import pytest
import ray

import cgraph
from cgraph import InputNode, MultiOutputNode
from tests.ray.actors import Worker

pytestmark = pytest.mark.usefixtures("no_leaks")


@ray.remote(num_cpus=0)
class Acc:
    """A stateful actor: results depend on the order its methods run in."""

    def __init__(self, start: int = 0) -> None:
        self.total = start

    def add(self, x):
        self.total += x
        return self.total

    def double_add(self, x):
        self.total = self.total * 2 + x
        return self.total

    def add2(self, x, y):
        self.total += x + y
        return self.total

    def nothing(self, _x):
        return None

    def is_none(self, x):
        return x is None

    @ray.method(num_returns=2)
    def pair_or_raise(self, x):
        if x < 0:
            raise ValueError(f"negative pair {x}")
        return x, -x

    def raise_runtime(self, x):
        if x < 0:
            raise NotImplementedError(f"no negatives: {x}")
        return x

    def state(self):
        return self.total


@ray.remote(num_cpus=0)
class Replica:
    """An actor that owns a compiled graph (the Ray Serve replica pattern)."""

    def __init__(self) -> None:
        from ray.dag import InputNode as RayInputNode

        self.worker = Worker.remote("inner")
        with RayInputNode() as inp:
            dag = self.worker.inc.bind(self.worker.mul.bind(inp))
        self.compiled = cgraph.compile(dag)

    def call(self, x):
        return ray.get(self.compiled.execute(x), timeout=30)

    def close(self):
        self.compiled.teardown()
        ray.kill(self.worker)
        return True


@pytest.fixture
def make(actors):
    """``make(cls, n, *args)``: n actors of ``cls`` as if new (shared: ``actors``)."""
    return actors


def _compile(dag, **options):
    return dag.experimental_compile(**options)


# --------------------------------------------------------------------------- DAG shapes
def test_same_method_bound_thrice_on_one_input_runs_each_in_bind_order(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = MultiOutputNode([acc.add.bind(inp), acc.add.bind(inp), acc.add.bind(inp)])
    with _compile(dag) as compiled:
        # totals accumulate: each bound call runs once per execution, in bind order
        assert ray.get(compiled.execute(0)) == [0, 0, 0]
        assert ray.get(compiled.execute(1)) == [1, 2, 3]
        assert ray.get(compiled.execute(2)) == [5, 7, 9]


def test_same_input_attribute_bound_twice_to_one_actor(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = MultiOutputNode([acc.add.bind(inp[0]), acc.add.bind(inp[0]), acc.add.bind(inp[1])])
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(1, 10)) == [1, 2, 12]
        assert ray.get(compiled.execute(2, 0)) == [14, 16, 16]


def test_each_actor_runs_its_methods_in_bind_order_across_actors(make):
    """Ray sorts an actor's tasks by bind index, not by data arrival."""
    p, q = make(Acc, 2)
    with InputNode() as inp:
        left = q.double_add.bind(p.add.bind(inp))  # p: add first; q: double_add first
        right = p.double_add.bind(q.add.bind(inp))  # then q.add and p.double_add
        dag = MultiOutputNode([right, left])
    with _compile(dag) as compiled:
        # p.add(1)=1 -> q.double_add(1)=1 -> q.add(1)=2 -> p.double_add(2)=1*2+2=4
        assert ray.get(compiled.execute(1)) == [4, 1]
    assert ray.get([p.state.remote(), q.state.remote()], timeout=30) == [4, 2]


def test_constants_bound_before_and_after_the_input(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        first = acc.add2.bind(2, inp)
        dag = acc.add2.bind(first, 2)  # the same constant bound twice
    with _compile(dag) as compiled:
        # add2(2, 1): total 3; add2(3, 2): total 8
        assert ray.get(compiled.execute(1)) == 8
        # add2(2, 1): 11; add2(11, 2): 24
        assert ray.get(compiled.execute(1)) == 24


def test_method_returning_none_flows_to_the_next_method(make):
    a, b = make(Acc, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.nothing.bind(inp), b.is_none.bind(a.nothing.bind(inp))])
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(5)) == [None, True]


def test_tensor_transport_hints_on_input_and_methods_with_several_args(make):
    torch = pytest.importorskip("torch")
    a, b = make(Worker, 2)
    with InputNode() as inp:
        inp.with_tensor_transport()
        x = a.echo.bind(inp[0]).with_tensor_transport()
        y = b.echo.bind(inp[1]).with_tensor_transport()
        dag = MultiOutputNode([y, x])
    with _compile(dag) as compiled:
        t0, t1 = torch.zeros(5, dtype=torch.int64), torch.ones(5, dtype=torch.int64)
        got = ray.get(compiled.execute(t0, t1))
        assert torch.equal(got[0], t1) and torch.equal(got[1], t0)


def test_compiled_graph_owned_by_an_actor(make):
    """Ray Serve's pattern: a replica actor compiles a graph and executes it itself."""
    (replica,) = make(Replica, 1)
    try:
        assert ray.get(replica.call.remote(3), timeout=60) == 7  # mul(3)=6, inc(6)=7
        assert ray.get(replica.call.remote(10), timeout=60) == 21
    finally:
        ray.get(replica.close.remote(), timeout=60)


# --------------------------------------------------------------------------- refs and results
def test_multi_output_execute_returns_one_ref_per_output(make):
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp), b.mul.bind(inp)])
    with _compile(dag) as compiled:
        refs = compiled.execute(3)
        assert isinstance(refs, list) and len(refs) == 2
        assert ray.get(refs[1]) == 6  # single fetch, any order
        assert ray.get(refs[0]) == 4
        first, second = compiled.execute(4)
        assert ray.get([first, second]) == [5, 8]


def test_ray_get_of_refs_mixed_with_other_values_is_refused(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag) as compiled:
        ref = compiled.execute(1)
        with pytest.raises(ValueError, match="must be a list of CompiledDAGRefs"):
            ray.get([ref, 1])
        assert ray.get(ref) == 2


def test_get_with_zero_timeout_returns_a_finished_result(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag) as compiled:
        ref = compiled.execute(41)
        deadline = time.monotonic() + 30
        while True:  # poll as Ray's docs allow: timeout=0 returns at once or raises
            try:
                assert ray.get(ref, timeout=0) == 42
                break
            except ray.exceptions.RayChannelTimeoutError:
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_deleted_refs_free_their_slots(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = acc.add.bind(inp)
    with _compile(dag, _max_inflight_executions=3) as compiled:
        for _ in range(12):  # never read: deleting each must not exhaust capacity
            ref = compiled.execute(1)
            del ref
        first, second, third = (compiled.execute(1) for _ in range(3))
        del second, third
        assert ray.get(first) == 13  # an earlier ref, read after later ones were dropped
        fourth = compiled.execute(1)
        del fourth
        assert ray.get(compiled.execute(1)) == 17  # dropped ones do not count as in flight


def test_later_ref_read_after_earlier_refs_dropped(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = acc.add.bind(inp)
    with _compile(dag) as compiled:
        r1, r2, r3 = (compiled.execute(2) for _ in range(3))
        del r1, r2
        assert ray.get(r3) == 6


def test_dropped_ref_of_a_graph_that_returns_its_input(make):
    # Found by benchmarks/fault_soak.py: the dropped execution's kept inputs were let go
    # before it was read away, and building its (unwanted) outputs then raised IndexError
    # from the next get(), and from every get() after it.
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = MultiOutputNode([acc.add.bind(inp[0]), inp[1]])
    with _compile(dag) as compiled:
        dropped = compiled.execute(1, "a")
        del dropped
        assert ray.get(compiled.execute(2, "b")) == [3, "b"]
        assert ray.get(compiled.execute(3, "c")) == [6, "c"]


# --------------------------------------------------------------------------- execute() arguments
def test_wrong_execute_arguments_raise_value_error(make):
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp[0]), b.inc.bind(inp[1], by=inp.step)])
    with _compile(dag) as compiled:
        with pytest.raises(ValueError, match="positional"):
            compiled.execute(1, step=1)
        with pytest.raises(ValueError, match="step"):
            compiled.execute(1, 2)
        assert ray.get(compiled.execute(1, 2, step=3)) == [2, 5]


# --------------------------------------------------------------------------- exceptions
def test_exception_text_shows_the_failing_source_line_and_cause(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.fail_if.bind(inp, bad=3)
    with _compile(dag) as compiled:
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(compiled.execute(3))
        err = info.value
        assert 'raise ValueError(f"bad input {x}")' in str(err)  # the user's own line
        assert isinstance(err.cause, ValueError) and str(err.cause) == "bad input 3"


def test_method_with_two_returns_that_raises_fails_every_output(make):
    a, b = make(Acc, 2)
    with InputNode() as inp:
        lo, hi = a.pair_or_raise.bind(inp)
        dag = MultiOutputNode([lo, b.is_none.bind(hi)])
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(3)) == [3, False]
        for _ in range(2):
            with pytest.raises(ValueError, match="negative pair -1"):
                ray.get(compiled.execute(-1))
        assert ray.get(compiled.execute(4)) == [4, False]


def test_runtime_error_family_raised_by_a_method(make):
    (a,) = make(Acc, 1)
    with InputNode() as inp:
        dag = a.raise_runtime.bind(inp)
    with _compile(dag) as compiled:
        with pytest.raises(NotImplementedError, match="no negatives: -1") as info:
            ray.get(compiled.execute(-1))
        assert isinstance(info.value, ray.exceptions.RayTaskError)
        assert ray.get(compiled.execute(2)) == 2


def test_error_in_one_output_raises_without_waiting_for_slow_outputs(make):
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.sleep_then.bind(inp, seconds=2.5), b.fail_if.bind(inp, bad=2)])
    with _compile(dag) as compiled:
        start = time.monotonic()
        with pytest.raises(ValueError, match="bad input 2"):
            ray.get(compiled.execute(2), timeout=30)
        assert time.monotonic() - start < 1.5
        # the slow output is still drained: the next execution reads cleanly
        assert ray.get(compiled.execute(1), timeout=30) == [1, 1]
        refs = compiled.execute(2)  # as in Ray: the error is every output's result
        with pytest.raises(ValueError, match="bad input 2"):
            refs[1].get(timeout=30)
        start = time.monotonic()
        with pytest.raises(ValueError, match="bad input 2"):
            refs[0].get(timeout=30)
        assert time.monotonic() - start < 1.5, "the healthy output's ref need not wait either"
        refs = compiled.execute(2)  # the same when the healthy output is read first
        with pytest.raises(ValueError, match="bad input 2"):
            refs[0].get(timeout=30)
        with pytest.raises(ValueError, match="bad input 2"):
            refs[1].get(timeout=30)
        assert ray.get(compiled.execute(3), timeout=30) == [3, 3]
        assert not compiled._outputs._results, "nothing of the failed executions stays buffered"


def test_an_execution_that_raised_early_is_finished_while_its_other_refs_are_held(make):
    # Found by benchmarks/fault_soak.py. ray.get(refs) reads [ref.get() for ref in refs]
    # and stops at the error, so the slow output's ref stays unread (and held). As in
    # Ray, the execution no longer counts as in flight: the next execute() has room
    # (cgraph used to raise CapacityError), and the held ref raises the same error at once.
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.sleep_then.bind(inp, seconds=1.0), b.fail_if.bind(inp, bad=2)])
    with _compile(dag, _max_inflight_executions=2) as compiled:
        failed = compiled.execute(2)
        second = compiled.execute(1)
        with pytest.raises(ValueError, match="bad input 2"):
            ray.get(failed, timeout=30)  # failed[0] raised; failed[1] is unread
        third = compiled.execute(3)  # room: execution 0 is finished
        start = time.monotonic()
        with pytest.raises(ValueError, match="bad input 2"):
            failed[1].get(timeout=30)
        assert time.monotonic() - start < 0.5, "the held ref has its result already"
        assert ray.get(second, timeout=30) == [1, 1]
        assert ray.get(third, timeout=30) == [3, 3]
        assert not compiled._outputs._results, "nothing of the failed execution stays buffered"


# --------------------------------------------------------------------------- asyncio
def test_asyncio_concurrent_submitters_and_out_of_order_awaits(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.echo.bind(inp)

    async def one(i):
        fut = await compiled.execute_async(np.full(50, i))
        return int((await fut)[0])

    async def main():
        got = await asyncio.gather(*[one(i) for i in range(8)])
        f1 = await compiled.execute_async("first")
        f2 = await compiled.execute_async("second")
        return got, await f2, await f1

    with _compile(dag, enable_asyncio=True) as compiled:
        got, second, first = asyncio.run(main())
        assert got == list(range(8)) and (first, second) == ("first", "second")


def test_asyncio_exception_keeps_its_type_and_graph_stays_usable(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.fail_if.bind(inp, bad=0)

    async def main():
        for _ in range(2):
            fut = await compiled.execute_async(0)
            with pytest.raises(ValueError, match="bad input 0"):
                await fut
        return await (await compiled.execute_async(5))

    with _compile(dag, enable_asyncio=True) as compiled:
        assert asyncio.run(main()) == 5


def test_asyncio_capacity_error(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)

    async def main():
        futs = [await compiled.execute_async(i) for i in range(2)]
        with pytest.raises(ray.exceptions.RayCgraphCapacityExceeded):
            await compiled.execute_async(9)
        return [await f for f in futs]

    with _compile(dag, enable_asyncio=True, _max_inflight_executions=2) as compiled:
        assert asyncio.run(main()) == [1, 2]


def test_asyncio_a_slow_await_does_not_hold_up_other_coroutines(make, tmp_path):
    # Ray's behaviour: while one coroutine awaits a result that is not there yet,
    # another submits at once, and the event loop keeps running
    (a,) = make(Worker, 1)
    gate = tmp_path / "open"
    with InputNode() as inp:
        dag = a.when_exists.bind(inp, str(gate))
    safety = threading.Timer(30, gate.touch)  # a regression ends late, not never
    safety.start()

    async def main():
        slow = asyncio.create_task(_await_result(compiled, 1))
        await asyncio.sleep(0.3)  # the slow coroutine now waits inside get()
        fut = await compiled.execute_async(2)
        submitted_first = not gate.exists()  # (only the safety timer could have opened it)
        await asyncio.sleep(0.05)  # the loop still runs other coroutines
        ran_while_waiting = not gate.exists()
        gate.touch()
        return [await slow, await fut], submitted_first, ran_while_waiting

    try:
        with _compile(dag, enable_asyncio=True) as compiled:
            results, submitted_first, ran_while_waiting = asyncio.run(main())
    finally:
        safety.cancel()
    assert results == [1, 2]
    assert submitted_first, "execute_async waited for another coroutine's result"
    assert ran_while_waiting


async def _await_result(compiled, x):
    return await (await compiled.execute_async(x))


def test_asyncio_submit_waits_in_a_thread_when_it_would_block(make):
    # another thread is inside execute(): execute_async waits off the event loop
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)

    async def main():
        compiled._submit_lock.acquire()
        asyncio.get_running_loop().call_later(0.3, compiled._submit_lock.release)
        ticks = 0
        submit = asyncio.ensure_future(compiled.execute_async(1))
        while not submit.done():
            await asyncio.sleep(0.01)
            ticks += 1
        return await (await submit), ticks

    with _compile(dag, enable_asyncio=True) as compiled:
        value, ticks = asyncio.run(main())
    assert value == 2
    assert ticks >= 1, "the loop ran while the submit waited"


def test_asyncio_multi_output_returns_one_future_per_output(make):
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp), b.mul.bind(inp)])

    async def main():
        futs = await compiled.execute_async(3)
        assert len(futs) == 2
        return await asyncio.gather(*futs)

    with _compile(dag, enable_asyncio=True) as compiled:
        assert asyncio.run(main()) == [4, 6]


# --------------------------------------------------------------------------- lifecycle
def test_teardown_during_a_long_execution_then_recompile_same_actor(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.sleep_then.bind(inp, seconds=1.0)
    compiled = _compile(dag)
    ref = compiled.execute(1)
    compiled.teardown()
    with pytest.raises(ray.exceptions.RayChannelError):
        ray.get(ref, timeout=10)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    again = _compile(dag)
    try:
        assert ray.get(again.execute(1), timeout=30) == 2
    finally:
        again.teardown()


def test_graph_id_and_is_teardown(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag) as compiled:
        assert isinstance(compiled.get_id(), str) and compiled.get_id()
        assert compiled.is_teardown is False
    assert compiled.is_teardown is True


def test_teardown_kill_actors(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(1)) == 2
        compiled.teardown(kill_actors=True)
        deadline = time.monotonic() + 30  # ray.kill is asynchronous: a call may still slip in
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(a.inc.remote(1), timeout=30)
                time.sleep(0.1)


def test_ordinary_actor_calls_run_while_the_graph_is_live(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = acc.add.bind(inp)
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(5)) == 5
        assert ray.get(acc.state.remote(), timeout=5) == 5  # e.g. reading logs, metrics
        assert ray.get(compiled.execute(1)) == 6


def test_visualize_ascii_returns_text(make):
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    with _compile(dag) as compiled:
        text = compiled.visualize(format="ascii")
        assert isinstance(text, str) and text.strip()


def test_capacity_counts_executions_in_the_channels_and_buffered_results_apart(make):
    # as in Ray: max_inflight_executions bounds executions not yet taken from the
    # output channels; results taken but unread count against max_buffered_results
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp), b.fail_if.bind(inp)])
    with _compile(dag, _max_inflight_executions=2, _max_buffered_results=1) as compiled:
        first = compiled.execute(1)
        assert first[0].get(timeout=30) == 2  # execution 0 left the channels; its output 1 is buffered
        second = compiled.execute(2)
        third = compiled.execute(3)  # 1 and 2 fill the channels' two places
        with pytest.raises(cgraph.CapacityError, match="max_inflight_executions") as info:
            compiled.execute(4)
        assert isinstance(info.value, ray.exceptions.RayCgraphCapacityExceeded)
        with pytest.raises(cgraph.CapacityError, match="max_buffered_results"):
            third.get(timeout=30)  # would buffer execution 1 beside 0's unread output
        del first  # its unread output is dropped: nothing is buffered now
        assert third.get(timeout=30) == [4, 3], "a ref refused for room stays readable"
        assert second.get(timeout=30) == [3, 2]
        with pytest.raises(ValueError):
            compiled.execute(-1).get(timeout=30)  # the list reads both; output 1 raised
        later = [compiled.execute(5), compiled.execute(6)]
        assert [r.get(timeout=30) for r in later] == [[6, 5], [7, 6]], "capacity is all back"
        assert not compiled._outputs._results

def test_a_with_block_tears_the_graph_down(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(1)) == 2
    assert compiled.is_teardown
    assert ray.get(a.inc.remote(1), timeout=30) == 2, "the actor is free again"


# --------------------------------------------------------------------------- Ray's timeouts and capacity
def test_negative_timeout_waits_without_limit(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.sleep_then.bind(inp, seconds=0.5)
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(1), timeout=-1) == 1  # Ray: -1 blocks until done
        assert compiled.execute(2).get(timeout=-1) == 2
    with _compile(dag, _submit_timeout=-1) as compiled:
        assert compiled.options.submit_timeout is None
        assert compiled.execute(3).get() == 3


def test_results_read_out_of_order_leave_room_for_more_executions(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag, _max_inflight_executions=2) as compiled:
        r0, r1 = compiled.execute(0), compiled.execute(1)
        assert r1.get(timeout=30) == 2  # takes 0 and 1 from the channels; 0 is buffered
        r2, r3 = compiled.execute(2), compiled.execute(3)  # as in Ray: two more fit
        assert [r0.get(timeout=30), r2.get(timeout=30), r3.get(timeout=30)] == [1, 3, 4]


# --------------------------------------------------------------------------- Ray's texts and events
def test_refs_and_futures_print_and_refuse_as_rays(make):
    from ray.experimental.compiled_dag_ref import CompiledDAGFuture, CompiledDAGRef

    a, b = make(Worker, 2)
    with InputNode() as inp:
        single = a.inc.bind(inp)
    with _compile(single) as compiled:
        ref = compiled.execute(1)
        assert isinstance(ref, CompiledDAGRef)
        assert str(ref) == f"CompiledDAGRef({compiled.get_id()}, execution_index=0, channel_index=None)"
        for refuse, sentence in ((copy.copy, "copied"), (copy.deepcopy, "deep copied"),
                                 (pickle.dumps, "pickled")):
            with pytest.raises(ValueError, match=f"^CompiledDAGRef cannot be {sentence}"):
                refuse(ref)
        assert ray.get(ref) == 2
        with pytest.raises(ValueError, match=r"^ray.get\(\) can only be called once on a CompiledDAGRef, "
                                             "and it was already called"):
            ray.get(ref)
    with InputNode() as inp:
        multi = MultiOutputNode([a.inc.bind(inp), b.mul.bind(inp)])

    async def main():
        futs = await compiled.execute_async(3)
        assert all(isinstance(f, CompiledDAGFuture) for f in futs)
        assert [str(f) for f in futs] == [
            f"CompiledDAGFuture({compiled.get_id()}, execution_index=0, channel_index={k})" for k in (0, 1)]
        got = [await f for f in futs]
        with pytest.raises(ValueError, match="^CompiledDAGFuture can only be awaited upon once"):
            await futs[0]
        return got

    with _compile(multi, enable_asyncio=True) as compiled:
        assert asyncio.run(main()) == [4, 6]
        refs = compiled.execute(1)
        assert [str(r) for r in refs] == [
            f"CompiledDAGRef({compiled.get_id()}, execution_index=1, channel_index={k})" for k in (0, 1)]
        assert ray.get(refs) == [2, 2]


RAY_INFLIGHT = ("The compiled graph can't have more than 2 in-flight executions, and you currently "
                "have 2 in-flight executions. Retrieve an output using ray.get before submitting more "
                "requests or increase `_max_inflight_executions`. ")


def test_capacity_errors_lead_with_rays_sentence(make):
    (a,) = make(Worker, 1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    with _compile(dag, _max_inflight_executions=2) as compiled:
        held = [compiled.execute(i) for i in range(2)]
        with pytest.raises(ray.exceptions.RayCgraphCapacityExceeded) as info:
            compiled.execute(2)
        assert str(info.value).startswith(RAY_INFLIGHT), str(info.value)
        assert [r.get(timeout=30) for r in held] == [1, 2]

    async def main():
        held = [await compiled.execute_async(i) for i in range(2)]
        with pytest.raises(ray.exceptions.RayCgraphCapacityExceeded) as info:
            await compiled.execute_async(2)
        assert str(info.value).startswith(RAY_INFLIGHT)
        return [await f for f in held]

    with _compile(dag, enable_asyncio=True, _max_inflight_executions=2) as compiled:
        assert asyncio.run(main()) == [1, 2]
    with _compile(dag, _max_inflight_executions=3, _max_buffered_results=1) as compiled:
        refs = [compiled.execute(i) for i in range(3)]
        with pytest.raises(ray.exceptions.RayCgraphCapacityExceeded,
                           match="^The compiled graph can't have more than 1 buffered results, and you "
                                 "currently have 1 buffered results"):
            refs[2].get(timeout=30)  # would buffer executions 0 and 1
        assert [r.get(timeout=30) for r in refs] == [1, 2, 3]


def _ray_events(actor, at_least=0):
    """The actor's events, once it holds ``at_least`` of them: the loop records an op's
    WRITE just after the value is out, so the driver may read the value first."""
    deadline = time.monotonic() + 30
    while True:
        events = ray.get(actor.__ray_call__.remote(
            lambda self: list(getattr(self, "__ray_cgraph_events", []))), timeout=30)
        if len(events) >= at_least or time.monotonic() > deadline:
            return events
        time.sleep(0.01)


def test_rays_profiling_switch_records_rays_task_events(make, monkeypatch):
    """RAY_CGRAPH_ENABLE_PROFILING: per method call and execution, a READ, a COMPUTE and a
    WRITE event on the actor (``__ray_cgraph_events``), from cgraph's timeline recording."""
    monkeypatch.setattr(ray.dag.constants, "RAY_CGRAPH_ENABLE_PROFILING", True)
    a, b = make(Acc, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.add.bind(inp), b.double_add.bind(b.add.bind(inp))])
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(1)) == [1, 3]
        got_a, got_b = _ray_events(a, 3), _ray_events(b, 6)
        assert [(e.method_name, e.operation) for e in got_a] == [
            ("add", "READ"), ("add", "COMPUTE"), ("add", "WRITE")]
        assert [(e.method_name, e.operation) for e in got_b] == [
            (m, op) for m in ("add", "double_add") for op in ("READ", "COMPUTE", "WRITE")]
        for events in (got_a, got_b):
            assert all(e.actor_classname == "Acc" and e.start_t <= e.end_t for e in events)
            assert all(x.end_t <= y.start_t + 1e-6 for x, y in itertools.pairwise(events)), "in loop order"
            assert {e.actor_id for e in events} == {events[0].actor_id}
        assert [e.bind_index for e in got_b] == [0, 0, 0, 1, 1, 1]
        assert ray.get(compiled.execute(2)) == [3, 15]  # b: 3 + 2 = 5, then 5 * 2 + 5
        assert len(_ray_events(b, 12)) == 12, "each execution adds its events"
        assert compiled.timeline()["traceEvents"], "the switch records cgraph's timeline too"
    monkeypatch.setattr(ray.dag.constants, "RAY_CGRAPH_ENABLE_PROFILING", False)
    (c,) = make(Acc, 1)
    with InputNode() as inp:
        dag = c.add.bind(inp)
    with _compile(dag) as compiled:
        assert ray.get(compiled.execute(1)) == 1
        assert _ray_events(c) == [], "off by default"


# --------------------------------------------------------------------------- Ray's ref destruction
def _nothing_kept(compiled) -> bool:
    """No result buffered, no drop pending, no execution waiting to be read away."""
    out = compiled._outputs
    return not (out._results or out._discarded or out._unread or out._dropped or out._inputs_kept)


def test_a_dropped_output_of_a_later_execution_is_released_with_it(make):
    (acc,) = make(Acc, 1)
    with InputNode() as inp:
        dag = MultiOutputNode([acc.add.bind(inp), acc.add.bind(inp)])
    with _compile(dag) as compiled:
        first = compiled.execute(1)
        one, two = compiled.execute(2)
        del one  # dropped before anything was read
        assert _nothing_kept(compiled) is False, "execution 1 still waits for its other output"
        assert ray.get(two) == 6  # reads (and buffers) execution 0 first
        assert len(compiled._outputs._results) == 1, "only execution 0's results are kept, for `first`"
        assert ray.get(first) == [1, 2]
        assert _nothing_kept(compiled)
        solo = compiled.execute(3)[0]  # the other ref dropped at once, unread
        assert ray.get(solo) == 9
        assert _nothing_kept(compiled)


def test_futures_dropped_unawaited_inside_asyncio_release_their_results(make):
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = MultiOutputNode([a.echo.bind(inp), b.echo.bind(inp)])

    async def main():
        done = [asyncio.Event() for _ in range(6)]

        async def one(i):  # each submits once the one before has its value: never at capacity
            if i:
                await done[i - 1].wait()
            futs = await compiled.execute_async(i)
            value = await futs[0]
            del futs  # futs[1] is dropped unawaited, inside the event loop
            done[i].set()
            return value

        return await asyncio.gather(*[one(i) for i in range(6)])

    with _compile(dag, enable_asyncio=True, _max_inflight_executions=2) as compiled:
        assert asyncio.run(main()) == list(range(6))
        assert _nothing_kept(compiled)
        assert ray.get(compiled.execute(7)) == [7, 7]


def test_rays_torch_profiling_switch_writes_one_trace_per_actor(make, monkeypatch, tmp_path):
    """RAY_CGRAPH_ENABLE_TORCH_PROFILING: each actor's loop runs under torch's profiler and
    writes its trace into compiled_graph_torch_profiles in the driver's working directory."""
    monkeypatch.setattr(ray.dag.constants, "RAY_CGRAPH_ENABLE_TORCH_PROFILING", True)
    monkeypatch.chdir(tmp_path)
    a, b = make(Worker, 2)
    with InputNode() as inp:
        dag = b.mul.bind(a.inc.bind(inp))
    with _compile(dag) as compiled:
        assert [ray.get(compiled.execute(i)) for i in range(3)] == [2, 4, 6]
    traces = sorted((tmp_path / "compiled_graph_torch_profiles").glob("*.json"))
    assert len(traces) == 2, traces
    for trace in traces:
        assert "traceEvents" in json.loads(trace.read_text())
