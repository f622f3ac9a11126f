"""cgraph.visualize: DOT text of graphs and schedules, the renderer, the timeline.

The checks read DOT text, not pixels; one test runs the real `dot` program on
it (skipped when graphviz is not installed).
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgraph.ir.graph import NodeKind
from cgraph.ir.text import parse_graph
from cgraph.scheduler.ops import Op, OpKind, Stream, parse_schedule
from cgraph.visualize import (
    DOT_STYLE,
    NODE_STYLE,
    dag_to_dot,
    moved_ops,
    moved_positions,
    render,
    schedule_to_dot,
    write_dag_picture,
    write_schedule_picture,
)
from cgraph.visualize.dag_dot import quote

# The seed overlap case (seeds/002_*): three senders, one receiver; overlap hoists
# the receiver's RECVs to the front and puts every communicator op on the comm stream.
SEED_BEFORE = parse_schedule(
    "s1.R0 s1.C1 s1.SEND1>r | s2.R0 s2.C2 s2.SEND2>r | s3.R0 s3.C3 s3.SEND3>r | "
    "r.RECV1<s1 r.C4 r.W4 r.RECV2<s2 r.C5 r.W5 r.RECV3<s3 r.C6 r.W6"
)
SEED_AFTER = parse_schedule(
    "s1.R0 s1.C1 s1.SEND1>r@comm | s2.R0 s2.C2 s2.SEND2>r@comm | s3.R0 s3.C3 s3.SEND3>r@comm | "
    "r.RECV1<s1@comm r.RECV2<s2@comm r.RECV3<s3@comm r.C4 r.W4 r.C5 r.W5 r.C6 r.W6"
)

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not installed")


# --------------------------------------------------------------------------- DOT reading
_STMT = re.compile(r'^\s*("(?:[^"\\]|\\.)*")\s*(?:->\s*("(?:[^"\\]|\\.)*")\s*)?\[(.*)\];$')
_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|<.*>)')


@dataclass
class Dot:
    """The node and edge statements of our generated DOT text, ids unquoted."""

    nodes: dict[str, dict[str, str]]
    edges: list[tuple[str, str, dict[str, str]]]
    clusters: dict[str, list[str]]  # cluster name -> node ids declared in it


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), s[1:-1])


def read_dot(text: str) -> Dot:
    nodes: dict[str, dict[str, str]] = {}
    edges: list[tuple[str, str, dict[str, str]]] = []
    clusters: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := re.match(r'\s*subgraph ("(?:[^"\\]|\\.)*") \{', line):
            current = _unquote(m.group(1))
            clusters[current] = []
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _STMT.match(line)
        if m is None:
            continue
        attrs = {k: (_unquote(v) if v.startswith('"') else v) for k, v in _ATTR.findall(m.group(3))}
        if m.group(2) is None:
            nodes[_unquote(m.group(1))] = attrs
            if current is not None:
                clusters[current].append(_unquote(m.group(1)))
        else:
            edges.append((_unquote(m.group(1)), _unquote(m.group(2)), attrs))
    return Dot(nodes, edges, clusters)


def red_nodes(dot: Dot) -> set[str]:
    return {n for n, a in dot.nodes.items() if a.get("color") == "#d62728"}


def run_dot(text: str) -> str:
    done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "Error" not in done.stderr, done.stderr
    return done.stdout


# --------------------------------------------------------------------------- tables
def test_every_op_kind_has_a_dot_style_row() -> None:
    assert set(DOT_STYLE) == set(OpKind)


def test_every_node_kind_has_a_node_style_row() -> None:
    assert set(NODE_STYLE) == set(NodeKind)


# --------------------------------------------------------------------------- moved ops
def test_moved_ops_seed_case_marks_only_the_hoisted_recvs() -> None:
    moved = moved_ops(SEED_BEFORE, SEED_AFTER)
    assert sorted(map(str, moved)) == ["r.RECV2<s2@comm", "r.RECV3<s3@comm"]


@pytest.mark.parametrize(
    ("before", "after", "moved"),
    [
        ("a.R0 a.C1 a.W1", "a.R0 a.C1 a.W1", []),
        ("a.R0 a.C1 a.W1", "a.R0@comm a.C1 a.W1", []),  # a stream change alone is no move
        ("a.C1 a.C2 a.C3 a.RECV4<b", "a.RECV4<b a.C1 a.C2 a.C3", ["a.RECV4<b"]),  # one hoist
        ("a.C1 a.C2", "a.C2 a.C1", ["a.C2"]),  # a swap: the op that moved earlier
        ("a.C1", "a.C1 a.C2", ["a.C2"]),  # a new op counts as moved
        ("a.C1 a.C2", "a.C1", []),  # a dropped op leaves nothing to mark
    ],
)
def test_moved_ops_is_the_minimal_set(before: str, after: str, moved: list[str]) -> None:
    assert sorted(map(str, moved_ops(parse_schedule(before), parse_schedule(after)))) == moved


def test_moved_ops_a_lane_new_to_the_schedule_is_all_moved() -> None:
    after = parse_schedule("a.C1 | b.C2 b.W2")
    assert sorted(map(str, moved_ops(parse_schedule("a.C1"), after))) == ["b.C2", "b.W2"]


# --------------------------------------------------------------------------- schedule_to_dot
def test_schedule_dot_has_a_lane_per_actor_and_every_op_once() -> None:
    text = schedule_to_dot(SEED_AFTER)
    dot = read_dot(text)
    assert set(dot.clusters) == {f"cluster_lane_{a}" for a in SEED_AFTER}
    for actor, ops in SEED_AFTER.items():
        assert dot.clusters[f"cluster_lane_{actor}"] == [str(op) for op in ops]
    all_ops = [str(op) for ops in SEED_AFTER.values() for op in ops]
    assert sorted(n for n in dot.nodes if n != "legend") == sorted(all_ops)
    for op in all_ops:  # declared once
        assert text.count(f"  {quote(op)} [") == 1


def test_schedule_dot_links_ops_in_lane_order() -> None:
    dot = read_dot(schedule_to_dot(SEED_AFTER))
    order = {(s, d) for s, d, a in dot.edges if a.get("weight") == "10"}
    for ops in SEED_AFTER.values():
        assert {(str(x), str(y)) for x, y in pairwise(ops)} <= order


def test_schedule_dot_links_send_to_recv_across_lanes() -> None:
    dot = read_dot(schedule_to_dot(SEED_AFTER))
    links = {(s, d, a["label"]) for s, d, a in dot.edges if a.get("style") == "dashed"}
    assert links == {
        ("s1.SEND1>r@comm", "r.RECV1<s1@comm", "n1"),
        ("s2.SEND2>r@comm", "r.RECV2<s2@comm", "n2"),
        ("s3.SEND3>r@comm", "r.RECV3<s3@comm", "n3"),
    }


def test_schedule_dot_links_collective_members() -> None:
    sched = parse_schedule("a.C1 a.COLL2[a,b,c] | b.C1 b.COLL2[a,b,c] | c.COLL2[a,b,c]")
    dot = read_dot(schedule_to_dot(sched))
    links = [(s, d) for s, d, a in dot.edges if a.get("style") == "dashed"]
    assert links == [("a.COLL2[a,b,c]", "b.COLL2[a,b,c]"), ("b.COLL2[a,b,c]", "c.COLL2[a,b,c]")]


def test_schedule_dot_seed_case_marks_exactly_the_moved_recvs_red() -> None:
    dot = read_dot(schedule_to_dot(SEED_AFTER, SEED_BEFORE, title="overlap"))
    assert red_nodes(dot) == {"r.RECV2<s2@comm", "r.RECV3<s3@comm"}
    assert "moved" in dot.nodes["r.RECV2<s2@comm"]["label"]


def test_schedule_dot_without_before_has_no_red() -> None:
    assert red_nodes(read_dot(schedule_to_dot(SEED_AFTER))) == set()


def test_schedule_dot_comm_stream_ops_are_distinct() -> None:
    dot = read_dot(schedule_to_dot(SEED_AFTER))
    for ops in SEED_AFTER.values():
        for op in ops:
            attrs = dot.nodes[str(op)]
            comm = op.stream is Stream.COMM
            assert (attrs.get("peripheries") == "2") is comm
            assert ("comm stream" in attrs["label"]) is comm


def test_schedule_dot_has_a_legend_with_every_kind_and_red() -> None:
    text = schedule_to_dot(SEED_AFTER, SEED_BEFORE)
    legend = next(line for line in text.splitlines() if line.strip().startswith("legend ["))
    for style in DOT_STYLE.values():
        assert style.fill in legend
        assert style.legend.split(":")[0] in legend
    assert "#d62728" in legend and "position changed" in legend
    assert "comm stream" in legend


def test_schedule_dot_shows_actors_with_no_ops() -> None:
    dot = read_dot(schedule_to_dot({"a": (Op("a", OpKind.COMPUTE, "n1"),), "b": ()}))
    assert dot.clusters["cluster_lane_b"] == ["empty:b"]


def test_schedule_dot_title() -> None:
    assert 'label="after overlap"' in schedule_to_dot(SEED_AFTER, title="after overlap")


def test_schedule_dot_repeated_op_gets_distinct_ids_and_marks() -> None:
    op, other = Op("a", OpKind.READ, "n0"), Op("a", OpKind.COMPUTE, "n1")
    dot = read_dot(schedule_to_dot({"a": (op, other, op)}, before={"a": (op, other)}))
    assert dot.clusters["cluster_lane_a"] == ["a.R0", "a.C1", "a.R0#2"]
    assert red_nodes(dot) == {"a.R0#2"}  # only the repeat is new, not both copies


@needs_dot
def test_seed_schedule_dot_parses_with_graphviz() -> None:
    svg = run_dot(schedule_to_dot(SEED_AFTER, SEED_BEFORE, title="overlap <pass> & co"))
    assert "r.RECV2&lt;s2" in svg


# --------------------------------------------------------------------------- escaping
ODD = 'x"y\\z<w>&@[a,b]{c}\nnext'


def test_quote_escapes_quotes_backslashes_and_newlines() -> None:
    assert quote('a"b') == '"a\\"b"'
    assert quote("a\\b") == '"a\\\\b"'
    assert quote("a\nb") == '"a\\nb"'
    assert quote("a<b>@[c,d]") == '"a<b>@[c,d]"'


def test_odd_node_names_survive_in_schedule_dot() -> None:
    weird = Op("a", OpKind.SEND, ODD, ("b",), Stream.COMM)
    recv = Op("b", OpKind.RECV, ODD, ("a",))
    dot = read_dot(schedule_to_dot({"a": (weird,), "b": (recv,)}))
    assert str(weird) in dot.nodes and str(recv) in dot.nodes
    assert [(s, d) for s, d, a in dot.edges if a.get("style") == "dashed"] == [(str(weird), str(recv))]


@needs_dot
def test_odd_names_parse_with_graphviz() -> None:
    weird = Op("a", OpKind.SEND, ODD, ("b",), Stream.COMM)
    recv = Op("b", OpKind.RECV, ODD, ("a",))
    coll = Op("graph", OpKind.COLLECTIVE, "node", ("graph", "b"))
    run_dot(schedule_to_dot({"graph": (weird, coll), "b": (recv,)}, before={}, title=ODD))
    graph = parse_graph("actor node = A(gpus=0)\nactor edge = B(gpus=0)\n"
                        "n0 = input\nn1 = n0['a \"b\" <c>']\nn2 = node.f(n1)\nn3 = edge.g(n2)\nreturn n3")
    run_dot(dag_to_dot(graph))


# --------------------------------------------------------------------------- dag_to_dot
GRAPH = parse_graph(
    """
    actor a = Worker(gpus=1)
    actor b = Worker(gpus=1)
    actor c = Worker(gpus=0, host=node2)
    n0 = input
    n1 = n0[0]
    n2 = a.send($0, n1) :nccl[static_shape]
    n3 = a.twice(n2)
    n4 = b.recv(n2)
    n5 = c.tail(n4)
    n6 = b.user(n3) :custom:mine
    n7 = c.last(n6)
    return [n5, n3]
    """
)


def _edge_labels(dot: Dot) -> dict[tuple[str, str], str]:
    return {(s, d): a["label"] for s, d, a in dot.edges}


def test_dag_dot_labels_edges_with_transports_from_hints() -> None:
    labels = _edge_labels(read_dot(dag_to_dot(GRAPH)))
    assert labels[("n2", "n4")] == "nccl"  # cross-actor, nccl hint
    assert labels[("n2", "n3")] == "intra"  # same actor: the hint does not apply
    assert labels[("n1", "n2")] == "shm"  # driver input to an actor
    assert labels[("n4", "n5")] == "cross-node"  # c lives on another host
    assert labels[("n6", "n7")] == "custom:mine"
    assert labels[("n5", "driver.output")] == "cross-node"
    assert labels[("n3", "driver.output")] == "shm"


def test_dag_dot_clusters_per_actor_with_driver_nodes_outside() -> None:
    dot = read_dot(dag_to_dot(GRAPH))
    assert dot.clusters == {"cluster_a": ["n2", "n3"], "cluster_b": ["n4", "n6"], "cluster_c": ["n5", "n7"]}
    assert {"n0", "n1", "driver.output"} <= set(dot.nodes)
    assert dot.nodes["n2"]["label"] == "n2 = a.send($0, n1) :nccl[static_shape]"
    assert "return [n5, n3]" in dot.nodes["driver.output"]["label"]
    text = dag_to_dot(GRAPH)
    assert 'label="a = Worker(gpus=1)"' in text and 'label="c = Worker(gpus=0, host=node2)"' in text


@dataclass(frozen=True)
class _Kind:
    name: str


@dataclass(frozen=True)
class _Spec:
    id: str
    node: str
    kind: _Kind
    writer: str
    readers: tuple[str, ...]
    transport: str


class _Plan:
    """Duck-typed stand-in for cgraph.scheduler.channels.ChannelPlan."""

    def __init__(self, *channels: _Spec) -> None:
        self.channels = channels

    def for_node(self, node: str) -> tuple[_Spec, ...]:
        return tuple(c for c in self.channels if c.node == node)


def test_dag_dot_takes_transports_from_a_plan() -> None:
    plan = _Plan(
        _Spec("ch0", "n0", _Kind("SHM"), "driver", ("a",), "shm"),
        _Spec("ch1", "n2", _Kind("COMM"), "a", ("b",), "cpu"),
        _Spec("ch2", "n2", _Kind("INTRA"), "a", ("a",), "intra"),
        _Spec("ch3", "n4", _Kind("CROSS_NODE"), "b", ("c",), "tcp"),
    )
    labels = _edge_labels(read_dot(dag_to_dot(GRAPH, plan)))
    assert labels[("n2", "n4")] == "cpu"  # the plan wins over the nccl hint
    assert labels[("n2", "n3")] == "intra"
    assert labels[("n1", "n2")] == "shm"  # n1 = n0[0] rides on n0's channel
    assert labels[("n4", "n5")] == "cross-node"
    assert labels[("n6", "n7")] == "custom:mine"  # no channel in the plan: from the hint


def test_dag_dot_agrees_with_the_real_channel_plan() -> None:
    channels = pytest.importorskip("cgraph.scheduler.channels")
    from_plan = _edge_labels(read_dot(dag_to_dot(GRAPH, channels.plan_channels(GRAPH))))
    assert from_plan == _edge_labels(read_dot(dag_to_dot(GRAPH)))
    cpu = parse_graph("actor a = W(gpus=0)\nactor b = W(gpus=0)\nn0 = input\n"
                      "n1 = a.f(n0) :nccl\nn2 = b.g(n1)\nreturn n2")
    plan = channels.plan_channels(cpu, default_communicator="cpu")
    assert _edge_labels(read_dot(dag_to_dot(cpu, plan)))[("n1", "n2")] == "cpu"


def test_dag_dot_auto_between_gpu_actors_is_nccl_and_collectives_are_drawn() -> None:
    graph = parse_graph(
        "actor a = W(gpus=1)\nactor b = W(gpus=1)\nn0 = input\nn1 = a.f(n0) :auto\n"
        "n2 = b.g(n1)\nn3 = allreduce(n1, n2) :nccl\nn4 = n3[0]\nn5 = n3[1]\nreturn [n4, n5]"
    )
    dot = read_dot(dag_to_dot(graph))
    labels = _edge_labels(dot)
    assert labels[("n1", "n2")] == "nccl"
    assert labels[("n1", "n3")] == labels[("n3", "n4")] == "nccl"
    assert dot.nodes["n3"]["shape"] == NODE_STYLE[NodeKind.COLLECTIVE].shape
    assert "n3" not in dot.clusters["cluster_a"] + dot.clusters["cluster_b"]


@needs_dot
def test_dag_dot_parses_with_graphviz() -> None:
    assert "n2 = a.send($0, n1)" in run_dot(dag_to_dot(GRAPH))


# --------------------------------------------------------------------------- render
def test_render_falls_back_to_dot_file_when_graphviz_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    text = schedule_to_dot(SEED_AFTER)
    with caplog.at_level(logging.WARNING, logger="cgraph"):
        out = render(text, tmp_path / "pic", "png")
    assert out == tmp_path / "pic.dot"
    assert out.read_text() == text
    assert list(tmp_path.iterdir()) == [out]
    message = caplog.text
    assert "apt-get install graphviz" in message and "brew install graphviz" in message
    assert "conda install graphviz" in message and str(out) in message


def test_render_falls_back_with_an_empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert render("digraph {}", tmp_path / "x.svg", "svg") == tmp_path / "x.dot"


def test_render_rejects_unknown_formats(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="png"):
        render("digraph {}", tmp_path / "x", "bmp")


@needs_dot
@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_render_writes_a_picture(tmp_path: Path, fmt: str) -> None:
    out = render(schedule_to_dot(SEED_AFTER, SEED_BEFORE), tmp_path / f"seed.{fmt}", fmt)
    assert out == tmp_path / f"seed.{fmt}"
    head = out.read_bytes()[:64]
    assert head.startswith(b"\x89PNG") if fmt == "png" else b"<svg" in out.read_bytes()


@needs_dot
def test_render_reports_dot_errors(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="dot -Tpng"):
        render("digraph { a -> }", tmp_path / "bad")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_write_schedule_picture_honours_the_directory_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CGRAPH_VISUALIZE_DIR", str(tmp_path / "from-env"))
    target = tmp_path / "pics" / "deep"
    with caplog.at_level(logging.INFO, logger="cgraph"):
        first = write_schedule_picture(SEED_AFTER, SEED_BEFORE, directory=target, format="svg")
        second = write_schedule_picture(SEED_AFTER, directory=target, format="svg")
    assert first.parent == second.parent == target
    assert first != second and first.name.startswith("schedule-001.")
    assert second.name.startswith("schedule-002.")
    assert _files(tmp_path) == sorted([first, second])  # nowhere else, not the cwd
    assert first.name in caplog.text and second.name in caplog.text


def test_write_schedule_picture_uses_the_env_dir_then_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CGRAPH_VISUALIZE_DIR", str(tmp_path / "env"))
    from_env = write_schedule_picture(SEED_AFTER, name="overlap")
    assert from_env == tmp_path / "env" / "overlap-001.dot"
    monkeypatch.delenv("CGRAPH_VISUALIZE_DIR")
    default = write_schedule_picture(SEED_AFTER)
    assert default == tmp_path / "cgraph-schedules" / "schedule-001.dot"
    assert _files(tmp_path) == sorted([from_env, default])


def test_write_picture_rejects_names_with_directories(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        write_schedule_picture(SEED_AFTER, directory=tmp_path, name="../escape")
    assert _files(tmp_path) == []


def test_write_dag_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    out = write_dag_picture(GRAPH, directory=tmp_path)
    assert out == tmp_path / "dag-001.dot"
    assert '"n2" -> "n4" [label="nccl"]' in out.read_text()


# --------------------------------------------------------------------------- property
def _is_subsequence(small: list[object], big: list[object]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def _lcs_len_brute(a: list[object], b: list[object]) -> int:
    from itertools import combinations

    for size in range(len(b), -1, -1):
        if any(_is_subsequence(list(c), a) for c in combinations(b, size)):
            return size
    return 0


@given(st.lists(st.sampled_from("RCWS"), max_size=6), st.booleans(), st.randoms(use_true_random=False))
def test_moved_steps_are_a_minimal_complement_of_a_common_subsequence(
    kinds: list[str], repeats: bool, rnd: random.Random
) -> None:
    kind = {"R": OpKind.READ, "C": OpKind.COMPUTE, "W": OpKind.WRITE, "S": OpKind.SEND}
    node = (lambda i: f"n{i % 2}") if repeats else (lambda i: f"n{i}")
    before = [Op("a", kind[k], node(i), ("b",) if k == "S" else ()) for i, k in enumerate(kinds)]
    after = before[:]
    rnd.shuffle(after)
    steps = moved_positions({"a": tuple(before)}, {"a": tuple(after)})["a"]
    kept = [op for i, op in enumerate(after) if i not in steps]
    assert _is_subsequence(kept, before)
    assert len(kept) == _lcs_len_brute(before, after)
    if not repeats:
        assert moved_ops({"a": tuple(before)}, {"a": tuple(after)}) == {after[i] for i in steps}
