"""Rendezvous through Ray: one small named store actor per collective group.

The members of a group find each other through a Ray actor named
``cgraph.collective:<group>``, created by the first caller (``get_if_exists``:
any rank of ``init_collective_group``, or the driver's
``declare_collective_group``). No driver has to stay in the loop::

    rank r (inside an actor)                   GroupStore "cgraph.collective:g"
    init_collective_group(4, r, "cpu", "g")    (num_cpus=0, on the first caller's node)
      store = get or create  ───────────────►  spec: world size, backend, timeout
      reply = join(r, node, pid)  ──────────►  cpu:  first join makes the shm link
                                               mesh (create_links); each rank on
                                               this node gets its LinkEnds
                                               gloo/nccl: each rank gets this actor's
                                               handle; torch's rendezvous keys live
                                               here (a KVStore, ``ray_store``)
      ... collectives run rank to rank; the store is not involved ...
    destroy_collective_group("g")
      leave(r)  ─────────────────────────────► the last member out closes and unlinks
      (last one) ray.kill(store)               every segment (the keys go with the actor)

``join`` never blocks: links are buffered and a peer that never comes makes the
first collective time out, naming it. Declared groups record which actor
holds which rank; a member's first collective call asks the store
(``membership``) and joins. A rank that hits an error (mismatch, timeout)
reports it (``report_abort``) before closing its links, so the peers it wakes
can say why. Store methods return ``Reply`` values instead of raising, so the
caller raises a clean ``CollectiveGroupError`` in its own process.

No TCP server is opened for gloo/nccl (a torch TCPStore would let anyone who
reaches the node read and write the rendezvous): ranks reach the keys by Ray
calls only. The store is an async actor because of its ``kv_`` methods, which
wait without a thread; its own methods below are quick and synchronous, so they
run one at a time on the actor's event loop, as before.

The "cpu" backend's links are files in a node's /dev/shm: a rank on the
store's node gets its ends of the store's mesh; where the ranks turn out to
span nodes, ``cpu.layout`` makes one mesh per node and gloo links between
nodes, on the first call.
"""

from __future__ import annotations

import atexit
import os
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import ray

from cgraph._boundary import ActorHandle, RayObject
from cgraph._log import logger
from cgraph.channels.segments import segment_name, unlink_channel
from cgraph.comm.ray_store import RENDEZVOUS_TIMEOUT_S, KVStore, on_this_node
from cgraph.errors import CollectiveGroupError, CollectiveTimeoutError

if TYPE_CHECKING:
    from cgraph.channels.shm_channel import ShmChannel
    from cgraph.comm.cpu.mesh import LinkEnds

STORE_PREFIX = "cgraph.collective:"
SHM_TAG_PREFIX = "col."
"""Segments of a group's links are named ``cgraph_<store pid>_col.<group>.<nonce>_...``."""


def store_name(group: str) -> str:
    """The Ray actor name of ``group``'s store."""
    return STORE_PREFIX + group


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What every member must agree on; ``members`` (actor ids by rank) for declared groups."""

    name: str
    world_size: int
    backend: str
    timeout_s: float
    members: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A store answer: ``value`` on success, or ``error`` (a message) to raise at the caller."""

    value: int | Membership | None = None
    error: str | None = None

    def unwrap(self, group: str, rank: int | None = None) -> int | Membership | None:
        if self.error is not None:
            raise CollectiveGroupError(self.error, group, rank)
        return self.value


@dataclass(frozen=True, slots=True)
class Membership:
    """What a rank needs to connect: the spec, the store's node, links or the key store."""

    spec: GroupSpec
    rank: int
    node: str
    nonce: str
    ends: LinkEnds | None = None  # cpu, on the store's node: this rank's ends of the store's mesh
    store: ActorHandle = None  # the store actor's handle (its keys: ray_store.RayStore, cpu.layout)
    secret: bytes = b""  # cpu: what its links between nodes prove they know
    arena: str = ""  # cpu, on the store's node: the base name of the node's shared workspace


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a backend may ask of the group layer: this process's node, the abort channel."""

    group: str
    node: str  # this process's Ray node id
    report_abort: Callable[[str], None]  # tell the store why this rank gives up
    abort_reason: Callable[[], str | None]  # why another rank gave up, if it said


@dataclass
class _State:
    joined: dict[int, str] = field(default_factory=dict)  # rank -> "pid@node"
    left: set[int] = field(default_factory=set)
    channels: list[ShmChannel] = field(default_factory=list)
    ends: list[LinkEnds] = field(default_factory=list)
    arena: str = ""  # the base name of the mesh's shared workspace
    abort: str | None = None


class GroupStore(KVStore):
    """The store actor of one group (see the module docstring). Its own methods are
    quick; the ``kv_`` ones (torch's rendezvous keys, gloo/nccl) are ``KVStore``'s."""

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__()
        self._spec = spec
        self._node = ray.get_runtime_context().get_node_id()
        self._nonce = uuid.uuid4().hex[:8]
        self._secret = secrets.token_bytes(32)  # reaches the members by Ray only
        self._state = _State()
        atexit.register(self.shutdown)  # a store ended without leave() still unlinks
        from cgraph.channels.segments import cleanup_stale_segments

        # links of stores that died without their exit hook (ray.shutdown() before a
        # destroy kills them outright) are freed here, as compile frees a dead driver's
        cleanup_stale_segments()

    def spec(self) -> GroupSpec:
        return self._spec

    def membership(self, actor_id: str) -> Reply:
        """The rank an actor was declared with (declared groups only)."""
        members = self._spec.members
        if members is None or actor_id not in members:
            return Reply(error=_not_declared(self._spec, members is None))
        return Reply(members.index(actor_id))

    def join(self, rank: int, world_size: int, backend: str, node: str,
             timeout_s: float | None = None) -> Reply:
        """Register ``rank`` and hand it what it needs to connect."""
        problem = self._check_join(rank, world_size, backend, node, timeout_s)
        if problem:
            return Reply(error=problem)
        self._state.joined[rank] = f"pid {os.getpid()}@{node[:8]}"
        try:
            return Reply(self._connect_info(rank, node))
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a group error
            return Reply(error=f"group {self._spec.name!r}: setting up the {backend} backend "
                         f"failed in the store actor: {type(exc).__name__}: {exc}")

    def unjoin(self, rank: int) -> None:
        """Forget a rank whose connection failed, so that it may join again."""
        self._state.joined.pop(rank, None)

    def leave(self, rank: int) -> bool:
        """Record that ``rank`` destroyed the group; True when it was the last member."""
        state = self._state
        state.left.add(rank)
        if set(state.joined) - state.left:
            return False
        self.shutdown()
        return True

    def report_abort(self, rank: int, reason: str) -> None:
        if self._state.abort is None:
            self._state.abort = f"rank {rank} reported: {reason}"

    def abort_reason(self) -> str | None:
        return self._state.abort

    def shutdown(self) -> list[str]:
        """Close every link (waking any rank blocked on one) and unlink all segments."""
        state, removed = self._state, []
        for channel in state.channels:
            channel.close()
        for channel in state.channels:
            removed += channel.unlink()
        if state.arena:
            removed += unlink_channel(state.arena)
        state.channels, state.ends, state.arena = [], [], ""
        return removed

    # ------------------------------------------------------------------ internals
    def _check_join(self, rank: int, world_size: int, backend: str, node: str,
                    timeout_s: float | None) -> str | None:
        spec, name = self._spec, self._spec.name
        timeout_s = spec.timeout_s if timeout_s is None else timeout_s
        if (world_size, backend, timeout_s) != (spec.world_size, spec.backend, spec.timeout_s):
            return (f"group {name!r} exists with world_size={spec.world_size}, "
                    f"backend={spec.backend!r}, timeout_s={spec.timeout_s:g}; this rank asked "
                    f"for world_size={world_size}, backend={backend!r}, timeout_s={timeout_s:g}. "
                    "Every rank must pass the same values.")
        if not 0 <= rank < spec.world_size:
            return (f"rank {rank} is outside group {name!r} (ranks 0..{spec.world_size - 1})")
        if rank in self._state.joined:
            how = "left it" if rank in self._state.left else f"holds it ({self._state.joined[rank]})"
            return (f"rank {rank} of group {name!r} is taken: another process {how}. Give each "
                    "process its own rank; to re-create the group, destroy it on every member first.")
        return None

    def _connect_info(self, rank: int, node: str) -> Membership:
        spec, state = self._spec, self._state
        # the ranks reach this actor's keys by Ray calls: no port to open, none to find
        me = ray.get_runtime_context().current_actor
        if spec.backend == "cpu" and node == self._node:
            if not state.ends:
                from cgraph.comm.cpu.mesh import create_links

                tag = f"{SHM_TAG_PREFIX}{spec.name}.{self._nonce}"
                state.channels, state.ends = create_links(tag, "link", spec.world_size)
                state.arena = segment_name(tag, "arena")  # made by rank 0, unlinked here
            return Membership(spec, rank, self._node, self._nonce, ends=state.ends[rank], store=me,
                              secret=self._secret, arena=state.arena)
        return Membership(spec, rank, self._node, self._nonce, store=me, secret=self._secret)


def _not_declared(spec: GroupSpec, imperative: bool) -> str:
    if imperative:
        return (f"group {spec.name!r} was created with init_collective_group, not declared: "
                "call init_collective_group(world_size, rank, ...) in this actor too")
    return (f"this actor is not a member of group {spec.name!r}: declare_collective_group "
            f"listed {len(spec.members or ())} other actors")


# --------------------------------------------------------------------------- client side
_StoreActor = ray.remote(num_cpus=0, max_restarts=0)(GroupStore)


def create_store(spec: GroupSpec, *, exclusive: bool) -> ActorHandle:
    """The store of ``spec.name``, created on this node if absent.

    Args:
        exclusive: fail if it exists (declare), instead of joining it (init).

    Raises:
        CollectiveGroupError: ``exclusive`` and the group exists.
    """
    name = store_name(spec.name)
    if exclusive and find_store(spec.name) is not None:
        raise CollectiveGroupError(
            f"group {spec.name!r} already exists; destroy_collective_group({spec.name!r}) "
            "first or pick another group_name", spec.name)
    options = dict(name=name, get_if_exists=not exclusive, lifetime="non_detached", **on_this_node())
    store = _StoreActor.options(**options).remote(spec)
    _HELD[spec.name] = store
    return store


_HELD: dict[str, ActorHandle] = {}
"""The handle ``create_store`` returned, per group. Ray ends a non-detached actor
when the process that created it drops the handle it got then (handles found by
name do not count), so the creator of a store keeps it here, even after leaving
the group, until the store is killed: the other members still need it."""


def store_id(store: ActorHandle) -> str:
    """A store actor's id: a new group of the same name has a new one."""
    return str(store._actor_id.hex())


def find_store(group: str) -> ActorHandle | None:
    """The store actor of ``group``, or None if there is none."""
    try:
        return ray.get_actor(store_name(group))
    except ValueError:
        return None


def store_alive(store: ActorHandle, timeout: float = RENDEZVOUS_TIMEOUT_S) -> bool:
    """Whether ``store`` still runs. A name lookup alone can answer with a store that was
    just killed: each process caches the actors it looked up by name and drops them only
    when Ray's notice of the death reaches it. A call to a dead actor fails instead.
    Unknown (no answer within ``timeout``) counts as alive."""
    try:
        ray.get(store.__ray_ready__.remote(), timeout=timeout)
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:
        return True
    return True


def call(store: ActorHandle, method: str, *args: object, timeout: float = RENDEZVOUS_TIMEOUT_S,
         group: str = "?") -> RayObject:
    """``ray.get(store.method.remote(*args))`` with a deadline.

    Raises:
        CollectiveTimeoutError: the store did not answer in time.
        CollectiveGroupError: the store actor died.
    """
    try:
        return ray.get(getattr(store, method).remote(*args), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise CollectiveTimeoutError(
            f"group {group!r}: its store actor did not answer {method}() within {timeout:g} s "
            "(the cluster may be out of resources to start it, or overloaded)", group) from None
    except ray.exceptions.RayActorError as exc:
        raise CollectiveGroupError(
            f"group {group!r}: its store actor is gone ({type(exc).__name__}); the group was "
            "destroyed or its creator died: create it again", group) from None


def kill_store(store: ActorHandle, group: str, wait_s: float = 60.0) -> None:
    """Kill the store and wait until Ray has freed its name, so that every member's next
    query sees the group gone and a new group can take the name. On a quiet machine that
    takes milliseconds; the bound is for a loaded GCS (CI saw more than 5 s)."""
    ray.kill(store, no_restart=True)
    if _HELD.get(group) is not None and store_id(_HELD[group]) == store_id(store):
        del _HELD[group]
    deadline = time.monotonic() + wait_s
    pause = 0.005
    while find_store(group) is not None:
        if time.monotonic() > deadline:
            logger.warning("group %r: Ray still lists its store %.0f s after it was killed",
                        group, wait_s)
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
