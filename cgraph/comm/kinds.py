"""Every kind of communicator group, one row each: the one table of cgraph's backends.

A kind serves the compiled graph (its groups: made on the driver, opened in each
member actor) and, where it has ``connect``, the imperative API too (a backend of
``cgraph.collective``: a ``Membership`` from the group's store becomes the rank's
``Communicator``, the same interface a graph's members open).

    kind      tensors      made for a graph (driver)          opened in the actor          API backend
    cpu       numpy/host   one shm link per ordered rank pair  CpuCommunicator(links)       yes: shm links, TCP between nodes
    gloo      torch CPU    a key store actor (ray_store)       ProcessGroupCommunicator     yes: ProcessGroupGloo
    nccl      torch CUDA   a key store actor (ray_store)       ProcessGroupCommunicator     yes: ProcessGroupNCCL
    cuda_ipc  torch CUDA   data + ack shm links                CudaIpcCommunicator(links)   no (graph edges on one GPU)
    custom    the user's   a copy of the user's object         initialized at compile       no (the user's object)

The API converts the caller's tensors (numpy, torch, cupy) to the kind's ``tensor``
(in place where it can, copying back where it must). The planner names the kinds it
plans (``scheduler.groups.KINDS``, a layer beside this one; a test holds the two equal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from cgraph._boundary import ActorHandle, UserValue
from cgraph.comm.communicator import Communicator
from cgraph.comm.gpu_placement import bind_assigned_gpu
from cgraph.comm.torch.process_group import backend_available

if TYPE_CHECKING:
    from typing import TypeAlias

    from cgraph.channels.shm_channel import ShmChannel, ShmHandle
    from cgraph.channels.socket_endpoint import SocketHandle
    from cgraph.comm.cpu.mesh import LinkEnds
    from cgraph.comm.rendezvous import Hooks, Membership
    from cgraph.comm.torch.process_group import StoreRendezvous

    Payload: TypeAlias = "LinkEnds | tuple[LinkEnds, LinkEnds] | StoreRendezvous | UserValue"
    """A member's part of a group, by kind: cpu its link ends, cuda_ipc its (data, acks) ends,
    gloo/nccl the rendezvous, custom its copy of the user's communicator object."""


@dataclass(frozen=True)
class GroupEndpoint:
    """What one actor needs to open its communicator of one group of a graph (picklable)."""

    name: str
    kind: str  # a key of KINDS
    rank: int
    world_size: int
    payload: Payload  # kind-specific: link ends, a rendezvous, the user's object
    control: ShmHandle | SocketHandle | None = None  # a reader handle closed to abort the group (shm: any member may; socket: the driver)
    nodes: tuple[str, ...] = ()  # each member's Ray node ("" for the driver's), by rank
    ready: bool = False  # a user communicator initialized at compile (``comm.custom``)
    # this member's end of the group's fault board (``runtime.comm_faults``; one node only): a
    # ``BoardHandle`` of the layer above, which this layer carries without looking inside
    board: UserValue = None


@dataclass
class Made:
    """What the driver made for one group: a payload per rank, and what to release at teardown."""

    payloads: list[Payload]
    channels: list[ShmChannel] = field(default_factory=list)  # shm links: close, then unlink
    keep_alive: list[ActorHandle] = field(default_factory=list)  # store actors serving the rendezvous


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind's row: where it runs, its tensors, and how each side makes or opens it."""

    name: str
    tensor: str  # "numpy" or "torch": what its Communicator takes (API)
    device: str  # "cpu" or "cuda": where torch tensors must live
    available: Callable[[], bool]  # whether this process can run it
    make: Callable[[str, str, int, object, float | None], Made]  # graph, on the driver: (tag, group, n, obj, timeout)
    open: Callable[[GroupEndpoint], Communicator]  # graph, in the member actor
    connect: Callable[[Membership, Hooks], Communicator] | None = None  # API backend, in the rank's process


# --------------------------------------------------------------------------- made on the driver
def _make_cpu(tag: str, name: str, n: int, obj: object, timeout: float | None) -> Made:
    from cgraph.comm.cpu.mesh import create_links

    channels, ends = create_links(tag, name, n)
    return Made(list(ends), list(channels))


def _make_ipc(tag: str, name: str, n: int, obj: object, timeout: float | None) -> Made:
    from cgraph.comm.cuda_ipc import create_ipc_links

    channels, ends = create_ipc_links(tag, name, n)
    return Made(list(ends), list(channels))


def _make_store(tag: str, name: str, n: int, obj: object, timeout: float | None) -> Made:
    """A rendezvous riding on a store actor; it waits ``timeout`` (None: its default) for every rank."""
    from cgraph.comm.torch.process_group import StoreRendezvous

    prefix = f"cgraph/{tag}/{name}"
    rendezvous, store = StoreRendezvous.create(prefix) if timeout is None else StoreRendezvous.create(prefix, timeout)
    return Made([rendezvous] * n, keep_alive=[store])


def _make_custom(tag: str, name: str, n: int, obj: object, timeout: float | None) -> Made:
    from cgraph.comm.custom import copy_for_group

    return Made(copy_for_group(obj, n))


# --------------------------------------------------------------------------- opened in the actor
def _open_cpu(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.cpu.mesh import CpuCommunicator

    return CpuCommunicator(cast("LinkEnds", g.payload))


def _open_ipc(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.cuda_ipc import CudaIpcCommunicator

    bind_assigned_gpu()
    return CudaIpcCommunicator(cast("tuple[LinkEnds, LinkEnds]", g.payload))


def _open_nccl(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.torch.process_group import ProcessGroupCommunicator

    bind_assigned_gpu()
    return ProcessGroupCommunicator(cast("StoreRendezvous", g.payload), g.rank, g.world_size, "nccl")


def _open_gloo(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.torch.process_group import ProcessGroupCommunicator

    return ProcessGroupCommunicator(cast("StoreRendezvous", g.payload), g.rank, g.world_size, "gloo", nodes=g.nodes)


def _open_custom(g: GroupEndpoint) -> Communicator:
    from cgraph.comm.custom import open_custom

    comm: Communicator = open_custom(g)
    return comm


# --------------------------------------------------------------------------- API backends
def _cpu_connect(membership: Membership, hooks: Hooks) -> Communicator:
    from cgraph.comm.cpu.backend import connect

    return connect(membership, hooks)


def _torch_connect(membership: Membership, hooks: Hooks) -> Communicator:
    from cgraph.comm.torch.backend import connect

    return connect(membership, hooks)


def gloo_available() -> bool:
    """True when torch.distributed has the gloo backend."""
    return backend_available("gloo")


def nccl_available() -> bool:
    """True when torch.distributed has NCCL and this process sees a CUDA device."""
    return backend_available("nccl")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


KINDS: dict[str, Kind] = {
    "cpu": Kind("cpu", "numpy", "cpu", lambda: True, _make_cpu, _open_cpu, _cpu_connect),
    "gloo": Kind("gloo", "torch", "cpu", gloo_available, _make_store, _open_gloo, _torch_connect),
    "nccl": Kind("nccl", "torch", "cuda", nccl_available, _make_store, _open_nccl, _torch_connect),
    "cuda_ipc": Kind("cuda_ipc", "torch", "cuda", _cuda_available, _make_ipc, _open_ipc),
    "custom": Kind("custom", "torch", "cpu", lambda: True, _make_custom, _open_custom),
}
"""Every kind of group by name (a test checks each row, and that the planner plans exactly these)."""

BACKENDS: tuple[str, ...] = tuple(name for name, row in KINDS.items() if row.connect is not None)
"""The kinds the imperative API runs: those with ``connect``."""


def backend(name: str) -> Kind:
    """The row of the API backend ``name``.

    Raises:
        ValueError: an unknown name, or a kind only a compiled graph runs.
    """
    row = KINDS.get(str(name).lower())
    if row is None or row.connect is None:
        why = f"{name!r} is a compiled graph's transport only" if row else f"unknown collective backend {name!r}"
        raise ValueError(f"{why}; choose one of {list(BACKENDS)}")
    return row


def open_group(endpoint: GroupEndpoint) -> Communicator:
    """Open this actor's communicator of a graph's group (in the member actor)."""
    return KINDS[endpoint.kind].open(endpoint)
