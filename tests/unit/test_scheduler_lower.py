"""plan_channels + lower + overlap on small DAGs, as a table in the text form.

Each case: the DAG (picture in a comment, then the IR text), the expected
channel plan, the lowered schedule and the overlapped one (``@comm`` marks the
communication stream). Every schedule also goes through the shared invariant
checks.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest

from cgraph.ir import parse_graph
from cgraph.scheduler import format_channels, format_schedule, lower, overlap, plan_channels
from tests.unit.test_scheduler_invariants import assert_overlap_ok, assert_schedule_ok, hoisted_ops


@dataclass(frozen=True)
class Case:
    name: str
    graph: str
    channels: str
    lowered: str
    overlapped: str | None = None  # None: same as lowered, with comm ops @comm


CASES = [
    # driver -> a.f -> b.g -> driver
    Case(
        "chain",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n1)
        return n2
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.shm = shm a -> b via shm
        n2.shm = shm b -> driver via shm
        """,
        "a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2",
    ),
    #            +-> b.g -+
    # -> a.f ----+        +-> driver      (b and c share one shm channel for n1)
    #            +-> c.h -+
    Case(
        "fan-out",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n1)
        n3 = c.h(n1)
        return [n2, n3]
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.shm = shm a -> b,c via shm
        n2.shm = shm b -> driver via shm
        n3.shm = shm c -> driver via shm
        """,
        "a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2 | c.R1 c.C3 c.W3",
    ),
    # -> a.f -+
    #         +-> c.h -> driver
    # -> b.g -+
    Case(
        "fan-in",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n0)
        n3 = c.h(n1, n2)
        return n3
        """,
        """
        n0.shm = shm driver -> a,b via shm
        n1.shm = shm a -> c via shm
        n2.shm = shm b -> c via shm
        n3.shm = shm c -> driver via shm
        """,
        "a.R0 a.C1 a.W1 | b.R0 b.C2 b.W2 | c.R1 c.R2 c.C3 c.W3",
    ),
    #         +-> b.g -+
    # -> a.f -+        +-> d.k -> driver
    #         +-> c.h -+
    Case(
        "diamond",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        actor c = W(gpus=0)
        actor d = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n1)
        n3 = c.h(n1)
        n4 = d.k(n2, n3)
        return n4
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.shm = shm a -> b,c via shm
        n2.shm = shm b -> d via shm
        n3.shm = shm c -> d via shm
        n4.shm = shm d -> driver via shm
        """,
        "a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2 | c.R1 c.C3 c.W3 | d.R2 d.R3 d.C4 d.W4",
    ),
    # -> a.f -> a.g -> driver              (f -> g stays inside a: intra channel)
    Case(
        "same actor twice",
        """
        actor a = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = a.g(n1)
        return n2
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.intra = intra a -> a via intra
        n2.shm = shm a -> driver via shm
        """,
        "a.R0 a.C1 a.W1 a.R1 a.C2 a.W2",
    ),
    # -> a.f -+-> b.g -> driver
    #         +-------> driver            (one shm channel: b first, the driver last)
    Case(
        "multi-output",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n1)
        return [n1, n2]
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.shm = shm a -> b,driver via shm
        n2.shm = shm b -> driver via shm
        """,
        "a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2",
    ),
    # -> a.split -[0]-> b.g -> driver
    #            -[1]-> a.h -> driver     (each return is its own value)
    Case(
        "num_returns",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        n0 = input
        n1 = a.split(n0) returns=2
        n2 = n1[0]
        n3 = n1[1]
        n4 = b.g(n2)
        n5 = a.h(n3)
        return [n4, n5]
        """,
        """
        n0.shm = shm driver -> a via shm
        n2.shm = shm a -> b via shm
        n3.intra = intra a -> a via intra
        n4.shm = shm b -> driver via shm
        n5.shm = shm a -> driver via shm
        """,
        "a.R0 a.C1 a.W2 a.W3 a.R3 a.C5 a.W5 | b.R2 b.C4 b.W4",
    ),
    # inp[0], inp.key -> a.f(inp[0], $0, k=inp.key) -> b.g(f, x=inp[0]) -> driver
    # (attributes ride on n0's channel; each actor reads n0 once)
    Case(
        "input attributes and kwargs",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        n0 = input
        n1 = n0[0]
        n2 = n0.key
        n3 = a.f(n1, $0, k=n2)
        n4 = b.g(n3, x=n1)
        return n4
        """,
        """
        n0.shm = shm driver -> a,b via shm
        n3.shm = shm a -> b via shm
        n4.shm = shm b -> driver via shm
        """,
        "a.R0 a.C3 a.W3 | b.R3 b.R0 b.C4 b.W4",
    ),
    # -> a.f ==nccl==> b.g --auto--> c.h -> driver     (c has no GPU: auto is shm)
    #      +----------------------------------> driver (to the driver: shm)
    Case(
        "nccl edges",
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0) :nccl
        n2 = b.g(n1) :auto
        n3 = c.h(n2)
        return [n1, n3]
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.shm = shm a -> driver via shm :nccl
        n1>b.comm = comm a -> b via nccl :nccl
        n2.shm = shm b -> c via shm :auto
        n3.shm = shm c -> driver via shm
        """,
        "a.R0 a.C1 a.W1 a.SEND1>b | b.RECV1<a b.C2 b.W2 | c.R2 c.C3 c.W3",
    ),
    # -> a.f ==custom:mycomm==> b.g -> driver     (no GPU needed)
    Case(
        "custom communicator",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0)
        n0 = input
        n1 = a.f(n0) :custom:mycomm
        n2 = b.g(n1)
        return n2
        """,
        """
        n0.shm = shm driver -> a via shm
        n1>b.comm = comm a -> b via custom:mycomm :custom:mycomm
        n2.shm = shm b -> driver via shm
        """,
        "a.R0 a.C1 a.SEND1>b | b.RECV1<a b.C2 b.W2",
    ),
    # host 1: driver, a, c          host node2: b
    # -> a.f -+-xnode-> b.g -xnode-+-> c.h -> driver
    #         +--shm-------------> c.h      b.g -(same crossing)-> driver
    Case(
        "cross-node hosts",
        """
        actor a = W(gpus=0)
        actor b = W(gpus=0, host=node2)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.g(n1)
        n3 = c.h(n1, n2)
        return [n2, n3]
        """,
        """
        n0.shm = shm driver -> a via shm
        n1.shm = shm a -> c via shm
        n1>b.xnode = xnode a -> b via xnode
        n2>c.xnode = xnode b -> c,driver via xnode
        n3.shm = shm c -> driver via shm
        """,
        "a.R0 a.C1 a.W1 | b.R1 b.C2 b.W2 | c.R1 c.R2 c.C3 c.W3",
    ),
    # Ray's overlap example (seed 002): three senders, one receiver, NCCL.
    # -> s1.send ==nccl==> r.recv_and_matmul -+
    # -> s2.send ==nccl==> r.recv_and_matmul -+-> driver
    # -> s3.send ==nccl==> r.recv_and_matmul -+
    Case(
        "seed overlap",
        """
        actor s1 = W(gpus=1)
        actor s2 = W(gpus=1)
        actor s3 = W(gpus=1)
        actor r = W(gpus=1)
        n0 = input
        n1 = s1.send($0, $1, n0) :nccl[static_shape,direct_return]
        n2 = s2.send($0, $1, n0) :nccl[static_shape,direct_return]
        n3 = s3.send($0, $1, n0) :nccl[static_shape,direct_return]
        n4 = r.recv_and_matmul(n1)
        n5 = r.recv_and_matmul(n2)
        n6 = r.recv_and_matmul(n3)
        return [n4, n5, n6]
        """,
        """
        n0.shm = shm driver -> s1,s2,s3 via shm
        n1>r.comm = comm s1 -> r via nccl :nccl[static_shape,direct_return]
        n2>r.comm = comm s2 -> r via nccl :nccl[static_shape,direct_return]
        n3>r.comm = comm s3 -> r via nccl :nccl[static_shape,direct_return]
        n4.shm = shm r -> driver via shm
        n5.shm = shm r -> driver via shm
        n6.shm = shm r -> driver via shm
        """,
        "s1.R0 s1.C1 s1.SEND1>r | s2.R0 s2.C2 s2.SEND2>r | s3.R0 s3.C3 s3.SEND3>r"
        " | r.RECV1<s1 r.C4 r.W4 r.RECV2<s2 r.C5 r.W5 r.RECV3<s3 r.C6 r.W6",
        "s1.R0 s1.C1 s1.SEND1>r@comm | s2.R0 s2.C2 s2.SEND2>r@comm | s3.R0 s3.C3 s3.SEND3>r@comm"
        " | r.RECV1<s1@comm r.RECV2<s2@comm r.RECV3<s3@comm r.C4 r.W4 r.C5 r.W5 r.C6 r.W6",
    ),
    # -> a.f -+                  +-[0]-+
    #         +-> allreduce(a, b)-+     +-> c.h -> driver
    # -> b.f -+                  +-[1]-+
    Case(
        "collective",
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1)
        actor c = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = b.f(n0)
        n3 = allreduce(n1, n2)
        n4 = n3[0]
        n5 = n3[1]
        n6 = c.h(n4, n5)
        return n6
        """,
        """
        n0.shm = shm driver -> a,b via shm
        n1.intra = intra a -> a via intra
        n2.intra = intra b -> b via intra
        n4.shm = shm a -> c via shm
        n5.shm = shm b -> c via shm
        n6.shm = shm c -> driver via shm
        """,
        "a.R0 a.C1 a.W1 a.R1 a.COLL3[a,b] a.W4 | b.R0 b.C2 b.W2 b.R2 b.COLL3[a,b] b.W5"
        " | c.R4 c.R5 c.C6 c.W6",
    ),
    # Both actors send first over NCCL, bound in the order f, h, g, k:
    # -> a.f ==nccl==> b.g -> driver
    # -> b.h ==nccl==> a.k -> driver
    # Naive lowering deadlocks (see test_scheduler_deadlock); b receives first.
    Case(
        "co-scheduled nccl pair",
        """
        actor a = W(gpus=1)
        actor b = W(gpus=1)
        n0 = input
        n1 = a.f(n0) :nccl
        n2 = b.h(n0) :nccl
        n3 = b.g(n1)
        n4 = a.k(n2)
        return [n3, n4]
        """,
        """
        n0.shm = shm driver -> a,b via shm
        n1>b.comm = comm a -> b via nccl :nccl
        n2>a.comm = comm b -> a via nccl :nccl
        n3.shm = shm b -> driver via shm
        n4.shm = shm a -> driver via shm
        """,
        "a.R0 a.C1 a.SEND1>b a.RECV2<b a.C4 a.W4 | b.R0 b.C2 b.RECV1<a b.SEND2>a b.C3 b.W3",
        "a.R0 a.C1 a.SEND1>b@comm a.RECV2<b@comm a.C4 a.W4"
        " | b.RECV1<a@comm b.R0 b.C2 b.SEND2>a@comm b.C3 b.W3",
    ),
]


def _text(s: str) -> str:
    return textwrap.dedent(s).strip()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lower_and_overlap(case: Case) -> None:
    graph = parse_graph(case.graph, constants=((10000, 10000), "float16"))
    plan = plan_channels(graph)
    assert format_channels(plan) == _text(case.channels)
    lowered = lower(graph, plan)
    assert format_schedule(lowered) == case.lowered
    assert_schedule_ok(graph, plan, lowered)
    overlapped = overlap(lowered)
    expected = case.overlapped
    if expected is None:
        comm = ("SEND", "RECV", "COLL")
        expected = " ".join(t + "@comm" if any(k in t for k in comm) else t for t in case.lowered.split(" "))
    assert format_schedule(overlapped) == expected
    assert_schedule_ok(graph, plan, overlapped)
    assert_overlap_ok(lowered, overlapped)


def test_seed_overlap_moves_exactly_the_receivers_recvs() -> None:
    case = next(c for c in CASES if c.name == "seed overlap")
    graph = parse_graph(case.graph)
    lowered = lower(graph, plan_channels(graph))
    after = overlap(lowered)
    assert hoisted_ops(lowered, after) == ["r.RECV2<s2", "r.RECV3<s3"]  # r.RECV1<s1 was first already
    assert [str(op) for op in after["r"][:3]] == ["r.RECV1<s1@comm", "r.RECV2<s2@comm", "r.RECV3<s3@comm"]
    assert all(after[s] != lowered[s] for s in ("s1", "s2", "s3"))  # stream only
    assert [str(op).replace("@comm", "") for op in after["s1"]] == [str(op) for op in lowered["s1"]]


def test_overlap_leaves_its_input_untouched() -> None:
    case = next(c for c in CASES if c.name == "seed overlap")
    graph = parse_graph(case.graph)
    lowered = lower(graph, plan_channels(graph))
    snapshot = dict(lowered)
    overlap(lowered)
    assert lowered == snapshot and format_schedule(lowered) == case.lowered


def test_actors_without_ops_are_left_out() -> None:
    graph = parse_graph(
        """
        actor a = W(gpus=0)
        actor idle = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        return n1
        """
    )
    assert list(lower(graph, plan_channels(graph))) == ["a"]


def test_bind_order_decides_compute_order() -> None:
    # a.g is bound before a.f (order=0); both only read the input
    graph = parse_graph(
        """
        actor a = W(gpus=0)
        n0 = input
        n1 = a.f(n0)
        n2 = a.g(n0) order=0
        return [n1, n2]
        """
    )
    plan = plan_channels(graph)
    schedule = lower(graph, plan)
    assert format_schedule(schedule) == "a.R0 a.C2 a.W2 a.C1 a.W1"
    assert_schedule_ok(graph, plan, schedule)


def test_lower_needs_the_plan_of_its_graph() -> None:
    graph = parse_graph(CASES[0].graph)
    other = parse_graph(CASES[2].graph)
    with pytest.raises(KeyError, match="no channel from n0 to a"):
        lower(graph, plan_channels(parse_graph("actor a = W(gpus=0)\nn0 = input\nn1 = a.f($0)\nreturn n1")))
    with pytest.raises(KeyError):
        lower(other, plan_channels(graph))
