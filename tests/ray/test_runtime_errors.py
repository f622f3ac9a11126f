"""Failures of compiled graphs: user errors, timeouts, capacity, deaths, teardown."""

from __future__ import annotations

import time

import pytest
import ray
from ray.dag import InputNode

import cgraph
from tests.ray.actors import Worker
from tests.ray.conftest import cgraph_segments


@pytest.fixture
def pair(actors):
    return actors(Worker, 1, "a")[0], actors(Worker, 1, "b")[0]


def test_user_exception_becomes_task_error_and_graph_survives(pair, no_leaks):
    a, b = pair
    with InputNode() as inp:
        dag = b.inc.bind(a.fail_if.bind(inp, bad=3))
    compiled = cgraph.compile(dag)
    try:
        assert compiled.execute(1).get(timeout=60) == 2
        with pytest.raises(cgraph.TaskError) as info:
            compiled.execute(3).get(timeout=60)
        err = info.value
        assert isinstance(err, ValueError), "the original exception type is kept"
        assert err.method == "fail_if" and "a" in err.actor and err.execution_index == 1
        assert "bad input 3" in str(err) and "Traceback" in err.traceback_str
        assert compiled.execute(4).get(timeout=60) == 5
    finally:
        compiled.teardown()


def test_ref_read_twice(pair, no_leaks):
    a, _ = pair
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = cgraph.compile(dag)
    try:
        ref = compiled.execute(1)
        assert ref.get(timeout=60) == 2
        with pytest.raises(cgraph.RefConsumedError):
            ref.get()
        with pytest.raises(ValueError, match="already read"):  # what Ray raises here
            ray.get(ref)
    finally:
        compiled.teardown()


def test_capacity_error_instead_of_hang(pair, no_leaks):
    a, _ = pair
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = cgraph.compile(dag, max_inflight_executions=2)
    try:
        refs = [compiled.execute(1), compiled.execute(2)]
        with pytest.raises(cgraph.CapacityError, match="max_inflight_executions") as info:
            compiled.execute(3)
        assert isinstance(info.value, ray.exceptions.RayCgraphCapacityExceeded)
        assert [r.get(timeout=60) for r in refs] == [2, 3]
        assert compiled.execute(4).get(timeout=60) == 5
    finally:
        compiled.teardown()


def test_get_timeout_then_result(pair, no_leaks):
    a, _ = pair
    with InputNode() as inp:
        dag = a.sleep_then.bind(inp, seconds=1.5)
    compiled = cgraph.compile(dag)
    try:
        ref = compiled.execute(7)
        with pytest.raises(cgraph.TimeoutError) as info:
            ref.get(timeout=0.1)
        # what code written for Ray Compiled Graphs (or plain ray.get) catches
        assert isinstance(info.value, ray.exceptions.RayChannelTimeoutError)
        assert isinstance(info.value, ray.exceptions.GetTimeoutError)
        assert isinstance(info.value, TimeoutError)
        with pytest.raises(ray.exceptions.RayChannelTimeoutError):
            ray.get(ref, timeout=0.1)
        assert ref.get(timeout=60) == 7
        assert compiled.execute(8).get(timeout=60) == 8
    finally:
        compiled.teardown()


def test_bad_execute_arguments_do_not_poison(pair, no_leaks):
    a, _ = pair
    with InputNode() as inp:
        dag = a.add.bind(inp[0], inp[1])
    compiled = cgraph.compile(dag)
    try:
        with pytest.raises(cgraph.ExecuteArgumentError, match="inp\\[1\\]"):
            compiled.execute(1)
        with pytest.raises(cgraph.ExecuteArgumentError, match="cannot be sent"):
            compiled.execute(1, __import__("threading").Lock())
        assert compiled.execute(1, 2).get(timeout=60) == 3
    finally:
        compiled.teardown()


def test_execute_after_teardown(pair, no_leaks):
    a, _ = pair
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = cgraph.compile(dag)
    compiled.teardown()
    compiled.teardown()  # idempotent
    with pytest.raises(cgraph.GraphTornDownError) as info:
        compiled.execute(1)
    assert isinstance(info.value, ray.exceptions.RayChannelError)


def test_teardown_with_executions_in_flight_frees_everything(pair, no_leaks):
    a, b = pair
    with InputNode() as inp:
        dag = b.inc.bind(a.sleep_then.bind(inp, seconds=0.2))
    compiled = cgraph.compile(dag)
    refs = [compiled.execute(i) for i in range(3)]
    compiled.teardown()
    with pytest.raises(cgraph.GraphTornDownError):
        refs[2].get(timeout=10)
    assert not cgraph_segments()


def test_actor_death_raises_promptly(ray_session, no_leaks):
    a, b = Worker.remote("a"), Worker.remote("b")
    try:
        with InputNode() as inp:
            dag = b.inc.bind(a.die_if.bind(inp, bad=-1))
        compiled = cgraph.compile(dag)
        assert compiled.execute(1).get(timeout=60) == 2
        start = time.monotonic()
        ref = compiled.execute(-1)
        with pytest.raises(cgraph.ActorDiedError) as info:
            ref.get(timeout=30)
        assert time.monotonic() - start < 15
        assert "a (Worker)" in str(info.value)
        said = str(info.value).split("Where each actor was: ", 1)[1]  # the survivor's where-record
        assert "a (Worker, node 0): no answer" in said and "b (Worker, node 0): waiting " in said, said
        assert isinstance(info.value, ray.exceptions.RayActorError)  # as Ray users catch it
        with pytest.raises(cgraph.ActorDiedError):
            compiled.execute(2)
        compiled.teardown()
        # the surviving actor's loop ended: it answers ordinary calls again
        assert ray.get(b.inc.remote(1), timeout=30) == 2
    finally:
        ray.kill(a)
        ray.kill(b)


def test_errors_are_also_rays_exception_types(pair, no_leaks):
    """Code written for Ray Compiled Graphs catches RayTaskError; it keeps working."""
    a, b = pair
    with InputNode() as inp:
        dag = b.inc.bind(a.fail_if.bind(inp, bad=3))
    compiled = cgraph.compile(dag)
    try:
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(compiled.execute(3))
        assert isinstance(info.value, ValueError) and isinstance(info.value, cgraph.TaskError)
    finally:
        compiled.teardown()


def test_compile_removes_segments_of_dead_drivers(pair, no_leaks):
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = f"/dev/shm/cgraph_{dead.stdout.strip()}_deadbeef_n0.shm"
    with open(stale, "wb") as f:
        f.write(b"\0" * 64)
    a, _ = pair
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = cgraph.compile(dag)
    try:
        assert not os.path.exists(stale)
        assert compiled.execute(1).get(timeout=60) == 2
    finally:
        compiled.teardown()


@ray.remote(num_cpus=0)
class SlowToStart:
    def __init__(self, seconds: float) -> None:
        import cgraph.runtime.launch  # noqa: F401  (what compile's first call imports, here and not then)

        time.sleep(seconds)  # Ray reports it PENDING_CREATION until this returns

    def inc(self, x):
        return x + 1


def test_compile_waits_for_an_actor_ray_is_still_starting(ray_session, no_leaks, monkeypatch):
    from cgraph.runtime import launch

    monkeypatch.setattr(launch, "LOCATE_TIMEOUT_S", 2.0)
    slow = SlowToStart.remote(5.0)
    try:
        with InputNode() as inp:
            dag = slow.inc.bind(inp)
        compiled = cgraph.compile(dag)  # the old wait gave up after LOCATE_TIMEOUT_S, calling it busy
        try:
            assert compiled.execute(1).get(timeout=60) == 2
        finally:
            compiled.teardown()
    finally:
        ray.kill(slow)


def test_compile_waits_for_an_actor_the_gcs_has_not_registered_yet(pair, no_leaks, monkeypatch):
    """On a loaded machine an actor's registration reaches the GCS seconds after
    ``Actor.remote()`` returns; until then the table has no entry for it. CI met this: the
    missing entry read as "started", and compile called the actor busy 60 s later."""
    from ray._private.state import state

    from cgraph.runtime import launch

    a, b = pair
    monkeypatch.setattr(launch, "LOCATE_TIMEOUT_S", 5.0)
    real_table, real_wait, hidden_until = state._connect_and_get_accessor, launch._wait_for_answers, [0.0]

    class Unregistered:  # the table as it reads before b's registration arrived
        def __init__(self, accessor):
            self._accessor = accessor

        def get_actor_info(self, actor_id):
            if actor_id == b._actor_id and time.monotonic() < hidden_until[0]:
                return None
            return self._accessor.get_actor_info(actor_id)

    def wait_for_answers(refs, handles):  # b unregistered for compile's first 8 s of waiting
        hidden_until[0] = time.monotonic() + 8.0
        real_wait(refs, handles)

    monkeypatch.setattr(state, "_connect_and_get_accessor", lambda: Unregistered(real_table()))
    monkeypatch.setattr(launch, "_wait_for_answers", wait_for_answers)
    busy = b.sleep_then.remote(1, seconds=8.0)  # b answers compile's call after about 8 s,
    # 7 s after the old code took the missing entry for "started", within 5 s of registering
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    compiled = cgraph.compile(dag)
    try:
        assert compiled.execute(1).get(timeout=60) == 3
    finally:
        compiled.teardown()
    assert ray.get(busy, timeout=60) == 1


def test_compile_names_a_started_actor_that_is_busy(pair, no_leaks, monkeypatch):
    from cgraph.runtime import launch

    a, b = pair
    monkeypatch.setattr(launch, "LOCATE_TIMEOUT_S", 0.5)
    busy = b.sleep_then.remote(1, seconds=5.0)
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    with pytest.raises(cgraph.CompileError, match=r"actor\(s\) b of this DAG did not answer within 0.5 s"):
        cgraph.compile(dag)
    assert ray.get(busy, timeout=60) == 1
