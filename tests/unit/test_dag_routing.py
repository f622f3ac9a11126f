"""``experimental_compile`` goes to cgraph for cgraph DAGs and to Ray for plain Ray DAGs.

Neither compiler really runs here: cgraph's ``compile`` and Ray's
``build_compiled_dag_from_ray_dag`` are replaced by recorders, so the tests
check only where each call goes and with which options.
"""

from __future__ import annotations

import pytest
import ray
import ray.dag.dag_node as ray_dag_node
from ray.dag import DAGNode
from ray.dag import InputNode as RayInputNode
from ray.dag import MultiOutputNode as RayMultiOutputNode
from ray.experimental.channel.cpu_communicator import CPUCommunicator

import cgraph.compiler
from cgraph import InputNode, MultiOutputNode
from cgraph.compat import compile_with_ray_options, install_ray_hooks, ray_context_options

RAY_DEFAULTS = {  # Ray 2.60's DAGContext with no RAY_CGRAPH_* variables set
    "submit_timeout": 10,
    "buffer_size_bytes": 1_000_000,
    "max_inflight_executions": 10,
    "max_buffered_results": 1000,
    "overlap_gpu_communication": False,
    "teardown_timeout": 30.0,
}


@ray.remote
class Worker:
    def f(self, x):
        return x


@pytest.fixture
def calls(monkeypatch):
    """Record which compiler each call reaches, instead of compiling."""
    seen: list[tuple[str, object, dict]] = []

    def cgraph_compile(dag, **options):
        seen.append(("cgraph", dag, options))
        return "cgraph-compiled"

    def ray_compile(dag, *args):
        seen.append(("ray", dag, {"args": args}))
        return "ray-compiled"

    monkeypatch.setattr(cgraph.compiler, "compile", cgraph_compile)
    monkeypatch.setattr(ray_dag_node, "build_compiled_dag_from_ray_dag", ray_compile)
    yield seen
    assert not ray.is_initialized(), "a unit test started Ray"


def test_cgraph_multi_output_node_compiles_with_cgraph(calls):
    with InputNode() as inp:
        dag = MultiOutputNode([Worker.bind().f.bind(inp)])
    assert dag.experimental_compile(_overlap_gpu_communication=True) == "cgraph-compiled"
    assert calls == [("cgraph", dag, {**RAY_DEFAULTS, "enable_asyncio": False, "overlap_gpu_communication": True})]


def test_single_output_on_cgraph_input_node_compiles_with_cgraph(calls):
    # the root is Ray's own ClassMethodNode: the hook on Ray's method routes it
    with InputNode() as inp:
        dag = Worker.bind().f.bind(inp)
    assert type(dag).experimental_compile is DAGNode.experimental_compile
    assert dag.experimental_compile() == "cgraph-compiled"
    assert [c[0] for c in calls] == ["cgraph"]
    assert not dag.is_cgraph_output_node  # Ray's compile-once flag is left alone


def test_ray_multi_output_node_on_cgraph_input_compiles_with_cgraph(calls):
    with InputNode() as inp:
        dag = RayMultiOutputNode([Worker.bind().f.bind(inp)])
    dag.experimental_compile()
    assert [c[0] for c in calls] == ["cgraph"]


def test_plain_ray_dag_still_compiles_with_ray(calls):
    with RayInputNode() as inp:
        single = Worker.bind().f.bind(inp)
    with RayInputNode() as inp:
        multi = RayMultiOutputNode([Worker.bind().f.bind(inp[0])])
    assert single.experimental_compile(_max_inflight_executions=3) == "ray-compiled"
    assert multi.experimental_compile() == "ray-compiled"
    assert [c[0] for c in calls] == ["ray", "ray"]
    # Ray got its own arguments, in its own positional order
    args = calls[0][2]["args"]
    assert (args[2], args[3], args[-1]) == (False, 3, "create")
    assert single.is_cgraph_output_node


def test_rays_keyword_names_map_to_cgraph_options(calls):
    comm = CPUCommunicator(2, [])
    with InputNode() as inp:
        dag = MultiOutputNode([Worker.bind().f.bind(inp)])
    dag.experimental_compile(
        _submit_timeout=-1,
        _buffer_size_bytes=4096,
        enable_asyncio=True,
        _max_inflight_executions=2,
        _max_buffered_results=7,
        _overlap_gpu_communication=False,
        _default_communicator=comm,
    )
    assert calls[0][2] == {
        "submit_timeout": None,  # Ray's -1: wait forever
        "buffer_size_bytes": 4096,
        "enable_asyncio": True,
        "max_inflight_executions": 2,
        "max_buffered_results": 7,
        "overlap_gpu_communication": False,
        "default_communicator": comm,
        "teardown_timeout": 30.0,
    }


def test_options_left_out_come_from_rays_dag_context(calls):
    with InputNode() as inp:
        dag = Worker.bind().f.bind(inp)
    compile_with_ray_options(dag, 5.0, None, False, None, None, None, "create")
    # Ray's untouched 10 s get_timeout is not passed: cgraph's default (no limit) stays
    assert calls[0][2] == {**RAY_DEFAULTS, "enable_asyncio": False, "submit_timeout": 5.0}


@pytest.fixture
def dag_context():
    from ray.dag.context import DAGContext

    ctx = DAGContext.get_current()
    saved = (ctx.get_timeout, ctx.max_inflight_executions, ctx.buffer_size_bytes, ctx.teardown_timeout)
    yield ctx
    ctx.get_timeout, ctx.max_inflight_executions, ctx.buffer_size_bytes, ctx.teardown_timeout = saved


def test_dag_context_settings_the_user_changed_are_honoured(calls, dag_context):
    dag_context.get_timeout = 3
    dag_context.max_inflight_executions = 2
    dag_context.buffer_size_bytes = 4096
    dag_context.teardown_timeout = 7
    with InputNode() as inp:
        dag = Worker.bind().f.bind(inp)
    dag.experimental_compile(_max_inflight_executions=5)  # an argument beats the context
    got = calls[0][2]
    assert (got["get_timeout"], got["max_inflight_executions"], got["buffer_size_bytes"]) == (3, 5, 4096)
    assert got["teardown_timeout"] == 7
    assert ray_context_options()["max_inflight_executions"] == 2


def test_hooks_install_once_and_keep_rays_method():
    before = DAGNode.experimental_compile
    install_ray_hooks()
    install_ray_hooks()
    assert DAGNode.experimental_compile is before
    assert before.__wrapped__ is not before
    assert before.__wrapped__.__qualname__ == "DAGNode.experimental_compile"
    assert callable(DAGNode.with_type_hint)


def test_rays_10_s_get_timeout_is_kept_when_the_environment_asks_for_it(monkeypatch):
    assert "get_timeout" not in ray_context_options(), "Ray's untouched default: cgraph's (no limit)"
    monkeypatch.setenv("RAY_CGRAPH_get_timeout", "10")
    assert ray_context_options()["get_timeout"] == 10

