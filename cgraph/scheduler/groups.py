"""Communicator groups: which actors share a communicator, and what kind runs it.

A *group* is one communicator. Every actor that sends or receives through a
transport joins that transport's group, ranked in the graph's actor order; a
collective whose members differ from it gets a group of its own, named after
them (``nccl[b,c]``). A collective's transport is its hint's, else "nccl" when
every member has a GPU, else the default communicator, else "cpu". What runs a
group follows from its transport and from where Ray put its members (``host``
and ``devices`` of each actor, which compile reads once from the live actors)::

    transport   kind       when
    cpu, gloo   itself
    nccl        cuda_ipc   every member on one GPU of one node (NCCL refuses two ranks on one GPU)
                nccl       each member on a GPU of its own, or not located (``cgraph.plan``)
                refused    a member without a GPU, or some members sharing a GPU and some not
    custom:x    custom     the user's communicator object named x

"cpu" and "cuda_ipc" links are the driver's shared memory, so their members
must live on the driver's node. Pure: no Ray, no communicator is made here
(the runtime makes and opens them, ``runtime.communicators``).

    group nccl = cuda_ipc a,b via nccl
    group gloo[b,c] = gloo b,c via gloo for n7
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from cgraph.errors import CompileError, TransportError
from cgraph.ir.graph import ActorId, Graph, Node, NodeId, NodeKind, Ref
from cgraph.scheduler.channels import ChannelKind, ChannelSpec, CommGroup

KINDS = ("cpu", "gloo", "nccl", "cuda_ipc", "custom")
"""Every kind of group the planner gives; the runtime makes and opens each
(``comm.kinds.KINDS``, a layer beside this one; a test holds the two together)."""


def plan_groups(graph: Graph, channels: Sequence[ChannelSpec], default: str | None,
                customs: Collection[str] | None = None) -> tuple[CommGroup, ...]:
    """The communicator groups of ``graph`` whose channels are ``channels``.

    Args:
        default: the default communicator's name ("cpu", "gloo", "custom:<name>"), or None.
        customs: the "custom:<name>" transports the compile was given objects for; None
            skips that check (planning without live actors).

    Raises:
        TransportError: a collective spans nodes without a communicator that does, or a
            "cpu" / "cuda_ipc" group has members off the driver's node.
        CompileError: an unknown communicator, or members placed so that neither NCCL
            nor CUDA IPC can run them.
    """
    order = {a.id: i for i, a in enumerate(graph.actors)}
    members: dict[str, set[ActorId]] = {}
    for spec in channels:
        if spec.kind is ChannelKind.COMM:
            members.setdefault(spec.transport, set()).update((spec.writer, *spec.readers))
    ranked = {t: tuple(sorted(m, key=order.__getitem__)) for t, m in members.items()}
    groups: dict[str, tuple[str, tuple[ActorId, ...], list[NodeId]]] = {  # name -> transport, members, collectives
        t: (t, ms, []) for t, ms in ranked.items()}
    for node in graph.nodes:
        if node.kind is not NodeKind.COLLECTIVE:
            continue
        transport = _collective_transport(graph, node, default)
        ms = tuple(graph.producer_actor(a.node) for a in node.args if isinstance(a, Ref))
        name = transport if transport not in groups or groups[transport][1] == ms else f"{transport}[{','.join(ms)}]"
        groups.setdefault(name, (transport, ms, []))[2].append(node.id)
    planned = tuple(CommGroup(name, t, _kind(graph, name, t, ms, customs), ms, tuple(cs))
                    for name, (t, ms, cs) in groups.items())
    for group in planned:
        _check_local(graph, group)
    return planned


def _collective_transport(graph: Graph, node: Node, default: str | None) -> str:
    hint = node.hint
    if hint is not None and hint.transport not in ("auto", "shm"):
        return str(hint.transport)
    members = [graph.actor(graph.producer_actor(a.node)) for a in node.args if isinstance(a, Ref)]
    if all(a.gpus > 0 for a in members):
        return "nccl"
    if default is None and len({a.host for a in members}) > 1:
        here = "the driver's node"
        where = ", ".join(f"{a.id}@{a.host or here}" for a in members)
        raise TransportError(f"collective {node.id} ({node.method}) spans hosts ({where}) without GPUs on all: "
                             "the CPU communicator joins one host's actors; give every member a GPU, put them "
                             "on one host, or compile with default_communicator=\"gloo\" (or a communicator "
                             "object; experimental_compile's _default_communicator)")
    return default if default is not None else "cpu"


def _kind(graph: Graph, name: str, transport: str, members: tuple[ActorId, ...],
          customs: Collection[str] | None) -> str:
    if transport in ("cpu", "gloo"):
        return transport
    if transport == "nccl":
        actors = [graph.actor(m) for m in members]
        if any(a.devices is None for a in actors):
            return "nccl"  # not located: what NCCL would run, were the actors on GPUs of their own
        return gpu_kind(members, [(a.host, a.devices or ()) for a in actors])
    if transport.startswith("custom:") and (customs is None or transport in customs):
        return "custom"
    raise CompileError(
        f"unknown communicator {transport!r} for actors {', '.join(members)} (group {name}); use "
        "'nccl', 'gloo' or 'cpu' (default_communicator=\"gloo\"|\"cpu\") or a communicator object"
    )


def gpu_kind(members: Sequence[ActorId], places: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    """"cuda_ipc" or "nccl" for a "nccl" group whose members sit at ``places`` (node, GPU ids).

    Raises:
        CompileError: a member has no GPU, or some members share a GPU and others do not.
    """
    without = [m for m, (_, ids) in zip(members, places, strict=True) if not ids]
    if without:
        raise CompileError(
            f"actor{'s' if len(without) > 1 else ''} {', '.join(without)} exchange tensors over "
            "NCCL but Ray assigned no GPU to them; create them with num_gpus (fractional on one "
            'GPU for CUDA IPC), or compile with default_communicator="cpu" for CPU actors'
        )
    devices = [(node, ids[0]) for node, ids in places]
    if len(devices) > 1 and len(set(devices)) == 1:
        return "cuda_ipc"
    if len(set(devices)) != len(devices):
        shared: dict[tuple[str, str], list[str]] = {}
        for member, device in zip(members, devices, strict=True):
            shared.setdefault(device, []).append(member)
        crowded = "; ".join(f"{', '.join(ms)} on GPU {gpu}" for (_, gpu), ms in shared.items() if len(ms) > 1)
        raise CompileError(
            f"actors {', '.join(members)} exchange tensors over NCCL, but some of them share a GPU "
            f"({crowded}) and others do not; NCCL needs one GPU per actor and CUDA IPC one GPU for "
            "all. Place them on distinct GPUs (num_gpus=1), or all on one GPU (fractional num_gpus)"
        )
    return "nccl"


def _check_local(graph: Graph, group: CommGroup) -> None:
    """The CPU communicator's links and CUDA IPC's are the driver's shared memory."""
    remote = [f"{m}@{graph.actor(m).host}" for m in group.members if graph.actor(m).host]
    if group.kind in ("cpu", "cuda_ipc") and remote:
        raise TransportError(
            f"the {group.kind} communicator of actors {', '.join(group.members)} joins actors on the "
            f"driver's node, but {', '.join(remote)} live on another node; compile with "
            'default_communicator="gloo" (experimental_compile\'s _default_communicator; torch\'s gloo '
            "crosses nodes), give the actors GPUs (NCCL does too), pass a communicator object that does, or "
            "place them on this node"
        )
