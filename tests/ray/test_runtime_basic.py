"""Compiled graphs on a local CPU Ray cluster: shapes of DAGs and their values."""

from __future__ import annotations

import numpy as np
import pytest
import ray
from ray.dag import InputNode, MultiOutputNode

import cgraph
from tests.ray.actors import Worker

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def workers(actors):
    """``workers(n, prefix)``: n Workers named prefix0.. (shared, as new: ``actors``)."""
    return lambda n, prefix="w": [actors(Worker, 1, f"{prefix}{i}")[0] for i in range(n)]


def run(dag, *inputs, **options):
    compiled = cgraph.compile(dag, **options)
    try:
        return [compiled.execute(x).get(timeout=60) for x in inputs]
    finally:
        compiled.teardown()


def test_echo(workers):
    (a,) = workers(1)
    with InputNode() as inp:
        dag = a.echo.bind(inp)
    assert run(dag, 1, "two", [3], {"four": 4}) == [1, "two", [3], {"four": 4}]


def test_chain(workers):
    a, b, c = workers(3)
    with InputNode() as inp:
        dag = c.inc.bind(b.inc.bind(a.inc.bind(inp)))
    assert run(dag, 0, 10) == [3, 13]


def test_fan_out_multi_output(workers):
    a, b, c = workers(3)
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp), b.mul.bind(inp), c.tag.bind(inp)])
    assert run(dag, 5) == [[6, 10, "w2(5)"]]


def test_fan_in(workers):
    a, b, c, d = workers(4)
    with InputNode() as inp:
        dag = d.add.bind(a.inc.bind(inp), b.mul.bind(inp), c.echo.bind(inp))
    assert run(dag, 3) == [4 + 6 + 3]


def test_diamond(workers):
    a, b, c, d = workers(4)
    with InputNode() as inp:
        x = a.inc.bind(inp)
        dag = d.add.bind(b.mul.bind(x), c.inc.bind(x, by=10))
    assert run(dag, 1, 2) == [2 * 2 + 12, 3 * 2 + 13]


def test_same_actor_several_nodes(workers):
    a, b = workers(2)
    with InputNode() as inp:
        x = a.inc.bind(inp)
        y = b.mul.bind(x)
        z = a.add.bind(x, y)  # a reads its own x (intra-process) and b's y
        dag = MultiOutputNode([z, a.tag.bind(z)])
    assert run(dag, 1) == [[2 + 4, "w0(6)"]]


def test_input_attributes_and_kwargs(workers):
    a, b = workers(2)
    with InputNode() as inp:
        x = a.add.bind(inp[0], inp[1])
        dag = b.inc.bind(x, by=inp.step)
    compiled = cgraph.compile(dag)
    try:
        assert compiled.execute(1, 2, step=100).get(timeout=60) == 103
        assert compiled.execute(5, 5, step=0).get(timeout=60) == 10
    finally:
        compiled.teardown()


def test_num_returns(workers):
    a, b = workers(2)
    with InputNode() as inp:
        lo, hi = a.split.options(num_returns=2).bind(inp)
        dag = MultiOutputNode([b.mul.bind(lo), b.inc.bind(hi), hi])
    assert run(dag, 10) == [[20, 12, 11]]


def test_numpy_zero_copy_and_larger_than_buffer(workers):
    a, b = workers(2)
    with InputNode() as inp:
        dag = b.zero_copy.bind(a.echo.bind(inp))
    small = np.ones(1000)
    big = np.ones(3 << 20)  # 24 MiB, far above the 1 MiB initial buffer
    compiled = cgraph.compile(dag, buffer_size_bytes=1 << 20)
    try:
        for arr in (small, big, small, big):
            shm, total, shape = compiled.execute(arr).get(timeout=120)
            assert shm, "the reader got a copy, not a view of shared memory"
            assert total == arr.sum() and shape == arr.shape
    finally:
        compiled.teardown()


def test_pass_through_stages_forward_the_drivers_slot_without_a_copy(workers):
    # each echo's WRITE is its lane's last op: it hands on the slot it read, so the last
    # stage reads the array in the input channel's slot (n0), written once by the driver
    a, b, c, d = workers(4)
    with InputNode() as inp:
        dag = d.segment_of.bind(c.echo.bind(b.echo.bind(a.echo.bind(inp))))
    compiled = cgraph.compile(dag, buffer_size_bytes=1 << 16)
    try:
        arrays = [np.full(1 << 17, float(i)) for i in range(6)]  # 1 MiB each, above the buffer
        refs = [compiled.execute(arr) for arr in arrays[:3]]  # several in flight
        got = [ref.get(timeout=60) for ref in refs] + [compiled.execute(arr).get(timeout=60) for arr in arrays[3:]]
    finally:
        compiled.teardown()
    for (segment, total), arr in zip(got, arrays, strict=True):
        assert total == arr.sum()
        assert segment is not None and "_n0.shm_" in segment, segment  # the driver's input slot


def test_a_stage_that_reads_after_its_write_copies(workers):
    # b writes n2, then runs another method on what it read: no forwarding (b's slot
    # must stay its own until its execution ends), so c reads b's channel
    a, b, c = workers(3)
    with InputNode() as inp:
        x = a.echo.bind(inp)
        y = b.echo.bind(x)
        dag = MultiOutputNode([c.segment_of.bind(y), b.zero_copy.bind(x)])
    compiled = cgraph.compile(dag)
    try:
        (segment, total), (shm, other, _) = compiled.execute(np.ones(1 << 17)).get(timeout=60)
    finally:
        compiled.teardown()
    assert total == other == 1 << 17 and shm
    assert segment is not None and "_n2.shm_" in segment, segment


def test_torch_zero_copy(workers):
    torch = pytest.importorskip("torch")
    a, b = workers(2)
    with InputNode() as inp:
        dag = b.tensor_info.bind(a.echo.bind(inp))
    compiled = cgraph.compile(dag)
    try:
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            t = torch.arange(1000).to(dtype)
            shm, total, dt, is_tensor = compiled.execute(t).get(timeout=60)
            assert shm and is_tensor and dt == str(dtype)
            assert total == pytest.approx(float(t.float().sum()), rel=1e-2)
    finally:
        compiled.teardown()


def test_thousand_executions(workers):
    a, b = workers(2)
    with InputNode() as inp:
        dag = b.mul.bind(a.inc.bind(inp))
    compiled = cgraph.compile(dag)
    try:
        for i in range(1000):
            assert compiled.execute(i).get(timeout=60) == (i + 1) * 2
    finally:
        compiled.teardown()


def test_pipelined_and_out_of_order(workers):
    a, b = workers(2)
    with InputNode() as inp:
        dag = b.mul.bind(a.inc.bind(inp))
    compiled = cgraph.compile(dag, max_inflight_executions=5)
    try:
        refs = [compiled.execute(i) for i in range(5)]
        assert refs[4].get(timeout=60) == 10  # buffers 0..3
        assert [r.get(timeout=60) for r in refs[:4]] == [2, 4, 6, 8]
        refs = [compiled.execute(i) for i in range(5)]
        assert ray.get(refs) == [2, 4, 6, 8, 10]
    finally:
        compiled.teardown()


def test_ray_get_on_refs(workers):
    (a,) = workers(1)
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = cgraph.compile(dag)
    try:
        assert ray.get(compiled.execute(1)) == 2
        assert ray.get([compiled.execute(2), compiled.execute(3)]) == [3, 4]
    finally:
        compiled.teardown()


def test_recompile_same_actors(workers):
    a, b = workers(2)
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    for _ in range(3):
        assert run(dag, 1) == [3]
    # the actors answer ordinary calls again after teardown
    assert ray.get(a.inc.remote(1)) == 2


def test_driver_results_are_private_copies(workers):
    (a,) = workers(1)
    with InputNode() as inp:
        dag = a.make_array.bind(inp)
    compiled = cgraph.compile(dag, max_inflight_executions=2)
    try:
        first = compiled.execute(4).get(timeout=60)
        for n in (4, 4, 4):
            compiled.execute(n).get(timeout=60)  # reuse every output slot
        assert first.tolist() == [0.0, 1.0, 2.0, 3.0]
        first[0] = 7.0  # writable: the driver owns it
    finally:
        compiled.teardown()


def test_async_actor_methods(ray_session):
    """``async def`` methods return coroutines; the loop runs them to their value."""
    from tests.ray.actors import AsyncWorker

    a, b = AsyncWorker.remote(), AsyncWorker.remote()
    try:
        with InputNode() as inp:
            dag = b.fail_on.bind(a.add_later.bind(inp, y=10), bad=13)
        compiled = cgraph.compile(dag)
        try:
            assert compiled.execute(1).get(timeout=60) == 11
            with pytest.raises(KeyError, match="bad key 13"):
                compiled.execute(3).get(timeout=60)
            assert compiled.execute(5).get(timeout=60) == 15
        finally:
            compiled.teardown()
        assert ray.get(a.count.remote(), timeout=30) == 3
    finally:
        ray.kill(a)
        ray.kill(b)
