"""What the driver ships to each actor: its ops and how to run each COMPUTE.

An ``ActorProgram`` is plain data (picklable): the actor's ops from the
schedule, a ``ComputeSpec`` per node it runs, and the channel endpoints it reads
and writes. The executor (``executor.py``) interprets it.

Argument specs are tuples, resolved once on the driver:

    (ARG_VALUE, "n3")     the value of node n3 obtained in this execution
    (ARG_CONST, value)    a constant bound in the DAG
    (ARG_INPUT, None)     the whole InputNode value (execute's single argument)
    (ARG_INPUT, 0)        inp[0]: execute's positional argument 0
    (ARG_INPUT, "k")      inp.k:  execute's keyword argument k
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cgraph._boundary import UserValue
from cgraph.ir import Const, Graph, Node, NodeKind, Ref
from cgraph.scheduler.ops import Op

if TYPE_CHECKING:
    from cgraph.channels.base import ChannelHandle
    from cgraph.runtime.communicators import CommProgram
    from cgraph.runtime.node_channels import NodeWatch

ARG_VALUE = 0
ARG_CONST = 1
ARG_INPUT = 2

ArgSpec = tuple[int, UserValue]  # (ARG_*, a node id, a constant of the DAG, an input's index or key)


@dataclass(frozen=True, slots=True)
class ComputeSpec:
    node: str
    method: str
    args: tuple[ArgSpec, ...]
    kwargs: tuple[tuple[str, ArgSpec], ...]
    num_returns: int = 1
    items: tuple[str, ...] = ()  # ITEM node ids by return index (num_returns > 1)


@dataclass(frozen=True)
class ActorProgram:
    actor: str  # the actor's id in the graph ("a")
    label: str  # for errors: "a (Worker)"
    graph_tag: str
    ops: tuple[Op, ...]
    computes: dict[str, ComputeSpec]
    readers: dict[str, ChannelHandle]  # node -> reader endpoint handle
    writers: dict[str, tuple[ChannelHandle, ...]]  # node -> writer endpoint handles
    input_node: str | None = None
    comm: CommProgram | None = None  # its communicator groups and ops, if it has any
    node_watch: NodeWatch | None = None  # off the driver's node: what closes that node's channels
    cpu_affinity: set[int] | None = None  # CPUs to pin the loop thread to (runtime/affinity.py)
    serialize_methods: bool = False  # a default actor: methods under its method lock (hosting.py)
    timeline: int | None = None  # record op events, keeping this many executions (recording.py)
    ray_events: bool = False  # also append Ray's task events to the actor (RAY_CGRAPH_ENABLE_PROFILING)
    torch_profiles: str | None = None  # run the loop under torch's profiler, traces here (Ray's switch)
    schedules: dict[str, tuple[Op, ...]] | None = None  # overlap="auto": each candidate's ops (switch.py)


def _arg_spec(arg: Ref | Const, graph: Graph) -> ArgSpec:
    if isinstance(arg, Const):
        return (ARG_CONST, graph.constants[arg.index])
    node = graph.node(arg.node)
    if node.kind is NodeKind.INPUT:
        return (ARG_INPUT, None)
    if node.kind is NodeKind.INPUT_ATTR:
        return (ARG_INPUT, node.key)
    return (ARG_VALUE, node.id)


def compute_spec(node: Node, graph: Graph) -> ComputeSpec:
    """Resolve one CALL node's arguments for the executor."""
    assert node.kind is NodeKind.CALL and node.method is not None, node
    items: tuple[str, ...] = ()
    if node.num_returns > 1:
        by_key = {
            n.key: n.id
            for n in graph.nodes
            if n.kind is NodeKind.ITEM and n.args and n.args[0] == Ref(node.id)
        }
        items = tuple(by_key.get(i, "") for i in range(node.num_returns))
    return ComputeSpec(
        node=node.id,
        method=node.method,
        args=tuple(_arg_spec(a, graph) for a in node.args),
        kwargs=tuple((k, _arg_spec(a, graph)) for k, a in node.kwargs),
        num_returns=node.num_returns,
        items=items,
    )
