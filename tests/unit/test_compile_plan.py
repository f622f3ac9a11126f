"""``cgraph.compile`` up to the plan: front end + scheduler, options, debug switches, logging.

DAGs are built from ClassNodes or offline handles, so no Ray cluster starts;
the schedules are the scheduler's text form.
"""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys

import pytest
import ray
import ray._private.auto_init_hook as auto_init_hook
from ray.experimental.channel.cpu_communicator import CPUCommunicator

import cgraph
from cgraph import DeadlockError, InputNode, TransportError
from cgraph._log import logger as cgraph_logger
from cgraph.compiler import CompiledPlan
from cgraph.compiler import plan_dag as plan
from cgraph.dag import FrontEnd
from cgraph.ir import format_graph
from cgraph.scheduler import Planned, format_schedule
from tests.unit.test_dag_frontend import SEED_IR, build_seed_dag
from tests.unit.test_dag_handles import offline_handle


@ray.remote
class Worker:
    def f(self, x):
        return x

    def g(self, x):
        return x


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", False)
    for name in ("CGRAPH_DEBUG", "CGRAPH_VISUALIZE_SCHEDULE", "CGRAPH_VISUALIZE_DIR"):
        monkeypatch.delenv(name, raising=False)
    yield
    assert not ray.is_initialized(), "a unit test started Ray"


def nccl_pair_without_gpus():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = b.g.bind(a.f.bind(inp).with_tensor_transport("nccl"))
    return dag


# --------------------------------------------------------------------------- the seed
SEED_BEFORE = (
    "a.R0 a.C1 a.SEND1>d | b.R0 b.C2 b.SEND2>d | c.R0 c.C3 c.SEND3>d"
    " | d.RECV1<a d.C4 d.W4 d.RECV2<b d.C5 d.W5 d.RECV3<c d.C6 d.W6"
)
SEED_AFTER = (
    "a.R0 a.C1 a.SEND1>d@comm | b.R0 b.C2 b.SEND2>d@comm | c.R0 c.C3 c.SEND3>d@comm"
    " | d.RECV1<a@comm d.RECV2<b@comm d.RECV3<c@comm d.C4 d.W4 d.C5 d.W5 d.C6 d.W6"
)


def test_seed_compiles_with_overlap():
    compiled = cgraph.plan(build_seed_dag(), overlap_gpu_communication=True)
    assert isinstance(compiled, CompiledPlan)
    assert format_graph(compiled.graph) == SEED_IR
    assert format_schedule(compiled.planned.before_overlap) == SEED_BEFORE
    assert format_schedule(compiled.schedule) == SEED_AFTER
    assert [name for name, _ in compiled.planned.passes] == ["lower", "overlap"]
    assert compiled.options.overlap_gpu_communication


def test_seed_plans_without_overlap():
    compiled = cgraph.plan(build_seed_dag(), overlap_gpu_communication=False)
    assert format_schedule(compiled.schedule) == SEED_BEFORE
    assert compiled.planned.before_overlap is None


def test_experimental_compile_needs_live_actors():
    with pytest.raises(cgraph.CompileError, match=r"not started.*cgraph\.plan\(dag\)"):
        build_seed_dag().experimental_compile(_overlap_gpu_communication=False)


def test_text_shows_graph_channels_and_schedule():
    text = cgraph.plan(build_seed_dag(), overlap_gpu_communication=True).text()
    assert text.startswith(SEED_IR)
    assert "# channels\nn0.shm = shm driver -> a,b,c via shm" in text
    assert "n1>d.comm = comm a -> d via nccl" in text
    assert "# schedule\nstep |" in text and "d.RECV1<a@comm" in text


def test_plan_is_the_seam_for_the_runtime():
    dag = build_seed_dag()
    front, planned = plan(dag, overlap=True)
    assert isinstance(front, FrontEnd) and isinstance(planned, Planned)
    assert planned.graph is front.graph
    assert set(front.handles) == {"a", "b", "c", "d"}


# --------------------------------------------------------------------------- transports
def test_nccl_between_actors_without_gpus_is_a_transport_error():
    with pytest.raises(TransportError) as err:
        cgraph.plan(nccl_pair_without_gpus())
    message = str(err.value)
    assert "n1 = a.f(n0) :nccl -> n2 = b.g(n1)" in message
    assert "a (Worker, gpus=0) and b (Worker, gpus=0)" in message
    assert 'transport="shm"' in message and 'default_communicator="gloo"' in message and '"cpu"' in message


def test_a_default_cpu_communicator_serves_nccl_edges_without_gpus():
    compiled = cgraph.plan(nccl_pair_without_gpus(), default_communicator="cpu")
    assert "n1>b.comm = comm a -> b via cpu :nccl" in str(compiled.plan)


def test_a_default_communicator_object_is_registered_like_per_edge_ones():
    comm = CPUCommunicator(2, [])
    compiled = cgraph.plan(nccl_pair_without_gpus(), default_communicator=comm)
    assert dict(compiled.front.communicators) == {"custom:CPUCommunicator": comm}
    assert "via custom:CPUCommunicator" in str(compiled.plan)
    assert compiled.options.default_communicator is comm


# --------------------------------------------------------------------------- deadlock
def test_bind_order_that_never_runs_is_a_deadlock_error():
    # Two handle objects of one actor count binds separately (Ray 2.60): the
    # actor would run f before the second g, whose value f reads.
    h1 = offline_handle(Worker)
    h2 = offline_handle(Worker, h1._actor_id)
    with InputNode() as inp:
        dag = h1.f.bind(h2.g.bind(h2.g.bind(inp)))
    with pytest.raises(DeadlockError) as err:
        cgraph.plan(dag)
    message = str(err.value)
    assert "wait-for cycle" in message
    assert "n3 = a.f(n2) order=2" in message
    assert "bind the methods in dataflow order" in message
    assert err.value.evidence.cycle


# --------------------------------------------------------------------------- options
def test_options_are_checked():
    with pytest.raises(ValueError, match="max_inflight_executions must be >= 1"):
        cgraph.plan(build_seed_dag(), max_inflight_executions=0)
    with pytest.raises(ValueError, match="max_buffered_results must be >= 1"):
        cgraph.plan(build_seed_dag(), max_buffered_results=0)
    with pytest.raises(ValueError, match="on_full must be one of"):
        cgraph.plan(build_seed_dag(), on_full="block")
    assert cgraph.plan(build_seed_dag()).options.on_full == "raise", "Ray's behaviour by default"


def test_negative_timeouts_mean_no_limit_as_in_ray():
    options = cgraph.plan(build_seed_dag(), submit_timeout=-1, get_timeout=-1.0).options
    assert (options.submit_timeout, options.get_timeout) == (None, None)


def test_options_are_kept_for_the_runtime():
    compiled = cgraph.plan(
        build_seed_dag(), max_inflight_executions=3, buffer_size_bytes=4096, submit_timeout=None
    )
    assert (compiled.options.max_inflight_executions, compiled.options.buffer_size_bytes) == (3, 4096)
    assert compiled.options.submit_timeout is None


# --------------------------------------------------------------------------- debug switches
def test_cgraph_debug_logs_each_pass(monkeypatch, caplog):
    monkeypatch.setenv("CGRAPH_DEBUG", "1")
    caplog.set_level(logging.INFO)
    cgraph.plan(build_seed_dag(), overlap_gpu_communication=True)
    messages = [r.getMessage() for r in caplog.records if r.name == "cgraph"]
    heads = [m.split("\n", 1)[0] for m in messages]
    assert heads == ["after read_dag:", "after plan_channels:", "after lower:", "after overlap:"]
    assert messages[-1].endswith(SEED_AFTER)


def test_no_debug_output_by_default(caplog):
    caplog.set_level(logging.DEBUG, logger="cgraph")
    cgraph.plan(build_seed_dag())
    assert not [r for r in caplog.records if r.getMessage().startswith("after ")]


@pytest.mark.parametrize("switch", ["CGRAPH_VISUALIZE_SCHEDULE", "RAY_CGRAPH_VISUALIZE_SCHEDULE"])
def test_visualize_switch_writes_the_schedule_picture(monkeypatch, tmp_path, caplog, switch):
    monkeypatch.setenv(switch, "1")  # cgraph's name, or Ray's
    monkeypatch.setenv("CGRAPH_VISUALIZE_DIR", str(tmp_path))
    caplog.set_level(logging.INFO)
    cgraph.plan(build_seed_dag(), overlap_gpu_communication=True)
    (written,) = list(tmp_path.iterdir())
    assert written.name.startswith("schedule-001")
    assert str(written) in caplog.text
    if written.suffix == ".dot":  # no graphviz here: the DOT text, moved ops in red
        assert "red" in written.read_text()


def test_visualize_to_a_chosen_path(tmp_path):
    compiled = cgraph.plan(build_seed_dag(), overlap_gpu_communication=True)
    picture = compiled.visualize(tmp_path / "seed.png")
    written = picture.path
    assert written.parent == tmp_path and written.stem == "seed" and written.exists()
    assert isinstance(picture, str) and picture.startswith("digraph"), "Ray's return: the DOT source"
    assert "red" in picture, "ops the overlap pass moved are marked"


def test_visualize_takes_rays_arguments(tmp_path):
    compiled = cgraph.plan(build_seed_dag(), overlap_gpu_communication=True)
    written = compiled.visualize(filename=str(tmp_path / "ray_style"), format="svg", channel_details=True).path
    assert written.stem == "ray_style" and written.exists()
    text = compiled.visualize(format="ascii")
    assert isinstance(text, str) and "RECV" in text and "SEND" in text and text.path is None
    assert list(tmp_path.iterdir()) == [written], "ascii writes nothing"
    with pytest.raises(ValueError, match="Parameters 'channel_details' are not compatible with 'ascii' format"):
        compiled.visualize(format="ascii", channel_details=True)


def test_visualize_ascii_with_view_writes_the_grid_to_stdout(capsys):
    compiled = cgraph.plan(build_seed_dag())
    text = compiled.visualize(format="ascii", view=True)
    assert capsys.readouterr().out == text + "\n"


# --------------------------------------------------------------------------- logging
@contextlib.contextmanager
def bare_root():
    """The root logger as in a program that configured no logging (pytest adds
    its capture handlers around each test phase, so this runs inside the test)."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    try:
        yield root
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_logger_shows_info_on_stderr_when_logging_is_unconfigured(capsys):
    with bare_root():
        cgraph_logger.info("hello from cgraph")
    assert "[cgraph] INFO hello from cgraph" in capsys.readouterr().err


def test_logger_follows_the_users_configuration(capsys):
    stream = io.StringIO()
    with bare_root() as root:
        root.addHandler(logging.StreamHandler(stream))  # as logging.basicConfig() does
        cgraph_logger.info("quiet")
        cgraph_logger.warning("loud")
    assert stream.getvalue() == "loud\n"
    assert capsys.readouterr().err == ""  # cgraph's own handler stands back


def test_a_level_the_user_sets_on_cgraph_wins(capsys):
    stream = io.StringIO()
    with bare_root() as root:
        root.addHandler(logging.StreamHandler(stream))
        cgraph_logger.setLevel(logging.INFO)
        try:
            cgraph_logger.info("asked for")
        finally:
            cgraph_logger.setLevel(logging.INFO - 1)
    assert stream.getvalue() == "asked for\n"


def test_import_cgraph_stays_light():
    code = "import sys, cgraph; assert 'ray' not in sys.modules; cgraph.TorchTensorType; assert 'ray' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
