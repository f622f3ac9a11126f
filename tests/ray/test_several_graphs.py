"""Several live compiled graphs over shared actors (runtime/hosting.py, runtime/monitor.py).

Each graph's loop runs on a thread of its own in each of its actors, so the graphs run
side by side: executed alternately or from several driver threads, torn down one at a
time, with plain Ray calls in between. On a default actor no two graphs' methods run at
once; a threaded actor keeps its own rule.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cgraph
from cgraph.runtime.monitor import WATCHER
from tests.ray.actors import AsyncWorker, Overlap, Worker
from tests.ray.random_dags import build, dag_specs, plain_ray, positional_count

pytestmark = pytest.mark.usefixtures("no_leaks")


def chain(first, second, method: str):
    """inp -> first.method -> second.method"""
    with cgraph.InputNode() as inp:
        return getattr(second, method).bind(getattr(first, method).bind(inp))


def in_threads(*jobs) -> None:
    """Run each job on a thread of its own; re-raise the first error."""
    errors: list[BaseException] = []

    def run(job) -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a driver thread did not finish: a deadlock"
    if errors:
        raise errors[0]


def test_two_graphs_over_the_same_actors_run_alternately_with_plain_calls_between(actors):
    a, b = actors(Worker, 2)
    forward = cgraph.compile(chain(a, b, "inc"))  # a then b
    backward = cgraph.compile(chain(b, a, "mul"))  # b then a
    try:
        assert WATCHER.live_actors() >= {a._actor_id.hex(), b._actor_id.hex()}
        for i in range(10):
            assert forward.execute(i).get(timeout=30) == i + 2
            assert ray.get(a.inc.remote(i, by=5), timeout=30) == i + 5  # a plain call in between
            assert backward.execute(i).get(timeout=30) == 4 * i
        refs = [forward.execute(1), backward.execute(1), forward.execute(2)]  # in flight together
        assert [r.get(timeout=30) for r in reversed(refs)] == [4, 4, 3]
        assert all(w.state == "waiting" for g in (forward, backward) for w in g.status())  # each its own record
    finally:
        forward.teardown()
        backward.teardown()
    assert not WATCHER.live_actors() & {a._actor_id.hex(), b._actor_id.hex()}


def test_three_graphs_run_from_three_driver_threads_at_once(actors):
    a, b, c = actors(Worker, 3)
    graphs = [cgraph.compile(chain(a, b, "inc")), cgraph.compile(chain(b, c, "mul")),
              cgraph.compile(chain(c, a, "inc"))]
    want = [lambda i: i + 2, lambda i: 4 * i, lambda i: i + 2]
    try:
        def drive(k: int) -> None:
            for i in range(0, 60, 3):  # three in flight, read in order
                refs = [graphs[k].execute(i + j) for j in range(3)]
                assert [r.get(timeout=60) for r in refs] == [want[k](i + j) for j in range(3)]

        in_threads(*(lambda k=k: drive(k) for k in range(3)))
    finally:
        for g in graphs:
            g.teardown()


def test_tearing_one_graph_down_leaves_the_others_running(actors):
    a, b = actors(Worker, 2)
    kept = cgraph.compile(chain(a, b, "inc"))
    dropped = cgraph.compile(chain(b, a, "mul"))
    try:
        assert dropped.execute(3).get(timeout=30) == 12
        done = threading.Event()
        results: list[int] = []

        def keep_running() -> None:
            i = 0
            while not done.is_set() or i < 50:
                results.append(kept.execute(i).get(timeout=30) - i)
                i += 1

        runner = threading.Thread(target=keep_running)
        runner.start()
        dropped.teardown()  # while the other graph executes on the same actors
        assert ray.get([a.inc.remote(1), b.inc.remote(2)], timeout=30) == [2, 3]
        again = cgraph.compile(chain(b, a, "mul"))  # the actors take a new graph
        assert again.execute(5).get(timeout=30) == 20
        again.teardown()
        done.set()
        runner.join(timeout=120)
        assert not runner.is_alive() and results and set(results) == {2}
        assert kept.execute(7).get(timeout=30) == 9
    finally:
        kept.teardown()
        dropped.teardown()


def test_no_two_graphs_run_methods_of_a_default_actor_at_once(actors):
    (shared,) = actors(Overlap, 1)
    first, second = actors(Worker, 2)
    graphs = [cgraph.compile(_through(first, shared)), cgraph.compile(_through(second, shared))]
    try:
        def drive(g) -> None:
            for i in range(40):
                assert g.execute(i).get(timeout=30) == i + 1

        in_threads(*(lambda g=g: drive(g) for g in graphs))
        assert ray.get(shared.most_at_once.remote(), timeout=30) == 1
    finally:
        for g in graphs:
            g.teardown()


def _through(worker, shared):
    """inp -> worker.inc -> shared.hold (sleeps a millisecond inside)"""
    with cgraph.InputNode() as inp:
        return shared.hold.bind(worker.inc.bind(inp))


def test_a_threaded_actor_runs_methods_of_two_graphs_at_once(ray_session):
    threaded = Overlap.options(max_concurrency=2).remote()
    graphs = []
    try:
        for _ in range(2):
            with cgraph.InputNode() as inp:
                graphs.append(cgraph.compile(threaded.meet.bind(inp)))
        refs = [g.execute(k) for k, g in enumerate(graphs)]  # each call waits until the other is in
        assert [r.get(timeout=60) for r in refs] == [(True, 0), (True, 1)]
    finally:
        for g in graphs:
            g.teardown()
        ray.kill(threaded)


def test_an_async_actor_serves_two_graphs(ray_session):
    worker = AsyncWorker.remote()
    graphs = []
    try:
        for by in (1, 10):
            with cgraph.InputNode() as inp:
                graphs.append(cgraph.compile(worker.add_later.bind(inp, by)))

        def drive(g, by: int) -> None:
            for i in range(20):
                assert g.execute(i).get(timeout=60) == i + by

        in_threads(lambda: drive(graphs[0], 1), lambda: drive(graphs[1], 10))
        assert ray.get(worker.count.remote(), timeout=30) == 40  # each call ran once
    finally:
        for g in graphs:
            g.teardown()
        ray.kill(worker)


def test_a_dead_shared_actor_fails_every_graph_on_it(ray_session):
    a, b, c = (Worker.remote(n) for n in "abc")
    on_b = [cgraph.compile(chain(a, b, "inc")), cgraph.compile(chain(b, c, "inc"))]
    try:
        assert [g.execute(1).get(timeout=60) for g in on_b] == [3, 3]
        pid = ray.get(b.getpid.remote(), timeout=30)
        ray.kill(b)
        _wait_gone(pid)  # Ray marks it dead at once; its process may still finish an execution
        outcomes = []
        for g in on_b:
            try:
                outcomes.append(g.execute(2).get(timeout=60))
            except cgraph.ActorDiedError as exc:
                outcomes.append(exc.actor)
        assert outcomes == ["b (Worker)", "a (Worker)"]  # b is the second graph's first actor, "a"
        assert ray.get(a.inc.remote(1), timeout=30) == 2  # its other actors stay usable
    finally:
        for g in on_b:
            g.teardown()
        for actor in (a, c):
            ray.kill(actor)


def _wait_gone(pid: int, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs {limit_s:.0f} s after ray.kill")


# ------------------------------------------------------------------ random graphs, random order
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(specs=st.lists(dag_specs(), min_size=2, max_size=3),
       seed=st.integers(0, 2**16), threaded=st.booleans())
def test_random_graphs_over_shared_actors_in_random_order_never_deadlock(calcs, specs, seed, threaded):
    """Every graph draws its actors from the same four: their loops share actors. Each graph
    gets 1 to 5 executions, submitted and read in an order drawn at random (up to three in
    flight per graph), all from one driver thread or one thread per graph. Every result is
    the plain Ray one, and every get answers (a deadlock would time out)."""
    rng = random.Random(seed)
    inputs = [[(rng.randint(-9, 9), rng.randint(-9, 9)) for _ in range(rng.randint(1, 5))] for _ in specs]
    graphs = [cgraph.compile(build(spec, calcs)) for spec in specs]
    got: list[list[object]] = [[] for _ in specs]
    try:
        def submit(k: int, x: int, y: int):
            return graphs[k].execute(*(x, y)[:positional_count(specs[k])], k=x - y)

        def steps(k: int) -> list[tuple[int, str]]:
            return [(k, "execute")] * len(inputs[k]) + [(k, "get")] * len(inputs[k])

        def play(order: list[tuple[int, str]]) -> None:
            pending: dict[int, list[object]] = {k: [] for k, _ in order}  # the graphs this thread drives
            sent = dict.fromkeys(pending, 0)
            for k, what in order:
                if what == "execute" and len(pending[k]) < 3:
                    pending[k].append(submit(k, *inputs[k][sent[k]]))
                    sent[k] += 1
                elif pending[k]:
                    got[k].append(pending[k].pop(0).get(timeout=60))
            for k in pending:  # what the order left: the rest, in order
                while sent[k] < len(inputs[k]) or pending[k]:
                    if sent[k] < len(inputs[k]):
                        pending[k].append(submit(k, *inputs[k][sent[k]]))
                        sent[k] += 1
                    got[k].append(pending[k].pop(0).get(timeout=60))

        if threaded:
            orders = [steps(k) for k in range(len(specs))]
            for order in orders:
                rng.shuffle(order)
            in_threads(*(lambda o=o: play(o) for o in orders))
        else:
            order = [s for k in range(len(specs)) for s in steps(k)]
            rng.shuffle(order)
            play(order)
    finally:
        for g in graphs:
            g.teardown()
    for k, spec in enumerate(specs):
        assert got[k] == [plain_ray(spec, calcs, (x, y), {"k": x - y}) for x, y in inputs[k]]


def test_an_idle_graph_beside_a_busy_one_costs_no_polling(actors):
    """Both graphs' loops block in the kernel while idle: the actor's CPU time barely moves."""
    a, b = actors(Worker, 2)
    graphs = [cgraph.compile(chain(a, b, "inc")), cgraph.compile(chain(b, a, "inc"))]
    try:
        for g in graphs:
            assert g.execute(0).get(timeout=30) == 2
        pid = ray.get(a.getpid.remote(), timeout=30)

        def cpu_seconds() -> float:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks

        before = cpu_seconds()
        time.sleep(2.0)
        assert cpu_seconds() - before < 0.5  # a spinning loop would take about 2 s of it
    finally:
        for g in graphs:
            g.teardown()
