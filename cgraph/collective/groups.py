"""The collective groups of this process: creation, lookup, teams and destruction.

A process keeps one ``Group`` record per group name it belongs to. Groups
come from three places::

    init_collective_group(p, r, backend, "g")   join the store of "g" as rank r
    declared by the driver                       the first lookup of "g" in a member asks
                                                 the store for this actor's rank, then joins
    split_strided / split_2d / "g:node"          a team: a new record over the parent's
                                                 comm (``comm.split``), no rendezvous

Teams live and die with their parent: destroying "g" destroys its teams in
this process. A destroyed name is remembered so that using it again says so
(instead of "unknown group"). ``<group>:world`` and ``<group>:node`` (the
ranks on this rank's Ray node) are predefined teams, made on first use.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import ray

from cgraph._boundary import ActorHandle
from cgraph.comm import rendezvous, teams
from cgraph.comm.communicator import Communicator
from cgraph.comm.kinds import Kind, backend
from cgraph.comm.ray_store import RENDEZVOUS_TIMEOUT_S
from cgraph.comm.rendezvous import GroupSpec, Hooks, Membership
from cgraph.errors import CollectiveError, CollectiveGroupError

DEFAULT_TIMEOUT_S = 30.0
"""Seconds a rank waits for a peer (any single message) before the call fails."""

PREDEFINED = {"world", "node"}
"""Team suffixes every group has: ``"<group>:world"`` and ``"<group>:node"``."""


@dataclass(eq=False)
class Group:
    """This process's membership of one group or team."""

    name: str
    backend: Kind
    comm: Communicator
    store: ActorHandle | None = None  # the store actor (None for teams)
    parent: str | None = None
    teams: list[str] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size


_GROUPS: dict[str, Group] = {}
_GONE: dict[str, str | None] = {}  # destroyed names -> id of the store left then (None: none)
_DECLARED: set[str] = set()  # groups this driver declared (rendezvous keeps their stores' handles)
_OUTSIDE: set[str] = set()  # teams this process was left out of (no need to ask Ray)
_LOCK = threading.RLock()


# --------------------------------------------------------------------------- creation
def init(world_size: int, rank: int, backend_name: str, name: str, timeout_s: float) -> Group:
    """Join (creating if needed) group ``name`` as ``rank``; see ``api.init_collective_group``."""
    row = _usable_backend(backend_name)
    _check_size_and_rank(world_size, rank, name)
    with _LOCK:
        if _still_here(name):
            raise CollectiveGroupError(
                f"group {name!r} is already initialized in this process (rank "
                f"{_GROUPS[name].rank}); destroy_collective_group({name!r}) first",
                name, rank)
        spec = GroupSpec(name, world_size, row.name, float(timeout_s))
        store = rendezvous.create_store(spec, exclusive=False)
        return _join(store, spec, rank)


def declare(actors: Sequence[ActorHandle], world_size: int, ranks: Sequence[int], backend_name: str,
            name: str, timeout_s: float) -> None:
    """Record the membership of ``actors`` in a new store (on the driver)."""
    row = _usable_backend(backend_name, check_here=False)
    if not (len(actors) == len(ranks) == world_size) or sorted(ranks) != list(range(world_size)):
        raise CollectiveGroupError(
            f"declare_collective_group({name!r}): got {len(actors)} actors and ranks "
            f"{list(ranks)} for world_size={world_size}; pass one actor per rank and the "
            f"ranks 0..{world_size - 1} in any order", name)
    members = [""] * world_size
    for actor, rank in zip(actors, ranks, strict=True):
        members[rank] = actor._actor_id.hex()
    spec = GroupSpec(name, world_size, row.name, float(timeout_s), tuple(members))
    if not _DECLARED:
        atexit.register(_destroy_declared)  # before Ray's own exit hook shuts it down
    rendezvous.create_store(spec, exclusive=True)
    _DECLARED.add(name)


def _destroy_declared() -> None:
    """At the driver's exit: tear down the groups it declared, so their links are unlinked."""
    for name in list(_DECLARED):
        with contextlib.suppress(Exception):
            if ray.is_initialized():
                _destroy_from_outside(name)


def _join(store: ActorHandle, spec: GroupSpec, rank: int) -> Group:
    node = ray.get_runtime_context().get_node_id()
    reply = rendezvous.call(store, "join", rank, spec.world_size, spec.backend, node,
                            spec.timeout_s, group=spec.name)
    membership: Membership = reply.unwrap(spec.name, rank)
    hooks = Hooks(
        spec.name,
        node,
        lambda reason: rendezvous.call(store, "report_abort", rank, reason, timeout=5.0),
        lambda: rendezvous.call(store, "abort_reason", timeout=5.0, group=spec.name),
    )
    row = backend(membership.spec.backend)
    assert row.connect is not None  # backend() returns the API's rows only
    try:
        comm = row.connect(membership, hooks)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            rendezvous.call(store, "unjoin", rank, timeout=5.0)
        if isinstance(exc, RuntimeError) and not isinstance(exc, CollectiveError):
            raise CollectiveGroupError(
                f"group {spec.name!r}, rank {rank}: connecting the {row.name} backend failed: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (did every "
                f"rank call init within {RENDEZVOUS_TIMEOUT_S:g} s?)", spec.name, rank) from exc
        raise
    group = Group(spec.name, row, comm, store)
    _GROUPS[spec.name] = group
    _GONE.pop(spec.name, None)
    return group


# --------------------------------------------------------------------------- lookup
def find(name: str) -> Group | None:
    """The group if this process belongs to it; joins a declared group on first use."""
    with _LOCK:
        group = _GROUPS.get(name)
        if group is not None:
            return group
        parent, _, suffix = name.rpartition(":")
        if parent and suffix in PREDEFINED:
            owner = find(parent)
            return None if owner is None else _predefined(owner, suffix, name)
        if name in _OUTSIDE:
            return None
        declared = _declared_rank(name)
        return None if declared is None else _join(*declared)


def peek(name: str, fresh: bool = False) -> tuple[int, int] | None:
    """(rank, world size) of this process in group ``name``, or None; unlike ``find``,
    a declared group is not joined (joining a gloo group waits for every rank).
    ``fresh``: first drop the group here if it was destroyed elsewhere (asks Ray)."""
    with _LOCK:
        group = _GROUPS.get(name)
        if group is not None and fresh and _destroyed_elsewhere(group):
            destroy(name)
            group = None
        if group is not None:
            return group.rank, group.world_size
        parent, _, suffix = name.rpartition(":")
        if name in _OUTSIDE or (suffix in PREDEFINED and parent not in _GROUPS):
            return None  # a team of a group this process has not joined yet
        if suffix in PREDEFINED:
            group = find(name)
            return None if group is None else (group.rank, group.world_size)
        declared = _declared_rank(name)
        return None if declared is None else (declared[2], declared[1].world_size)


def _still_here(name: str) -> bool:
    """Whether group ``name`` is live in this process (one another rank destroyed is left
    here first). Hold ``_LOCK``."""
    if name in _GROUPS and _destroyed_elsewhere(_GROUPS[name]):
        destroy(name)
    return name in _GROUPS


def _destroyed_elsewhere(group: Group) -> bool:
    """Whether ``group``'s store is gone or replaced: the driver destroyed the group (or its
    store died). Asks Ray (a name lookup, then a call to a store of the same id: the
    lookup may answer from this process's cache of a store just killed), so only queries
    and ``init`` ask, never a collective call."""
    if group.store is None or group.parent is not None or not ray.is_initialized():
        return False
    store = rendezvous.find_store(group.name)
    if store is None or rendezvous.store_id(store) != rendezvous.store_id(group.store):
        return True
    return not rendezvous.store_alive(store)


def lookup(name: str) -> Group:
    """The group ``name`` of this process.

    Raises:
        CollectiveGroupError: unknown, destroyed, or this process is not a member.
    """
    group = find(name)
    if group is not None:
        return group
    if name in _GONE:
        raise CollectiveGroupError(
            f"group {name!r} was destroyed in this process; call init_collective_group "
            "again to use a group of that name", name)
    known = sorted(_GROUPS) or "none"
    raise CollectiveGroupError(
        f"unknown collective group {name!r} in this process (groups here: {known}). Call "
        "init_collective_group(world_size, rank, backend, group_name) in every member, or "
        "declare_collective_group(actors, ...) on the driver first", name)


def _declared_rank(name: str) -> tuple[ActorHandle, GroupSpec, int] | None:
    """(store, spec, rank) of a group the driver declared with this actor as a member;
    None if there is none, or it is the very group this process destroyed."""
    if not ray.is_initialized():
        return None
    actor_id = ray.get_runtime_context().get_actor_id()
    store = None if actor_id is None else rendezvous.find_store(name)  # the driver is no member
    if store is None:
        return None
    if name in _GONE and _GONE[name] == rendezvous.store_id(store):
        return None  # a new declaration under the same name makes a new store: that one joins
    spec: GroupSpec = rendezvous.call(store, "spec", group=name)
    if spec.members is None or actor_id not in spec.members:
        return None
    return store, spec, spec.members.index(actor_id)


def _predefined(owner: Group, suffix: str, name: str) -> Group | None:
    if suffix == "world":
        team = teams.world_team(owner.world_size)
    else:
        team = teams.node_team(owner.comm.nodes, owner.rank)
    add_team(owner, team, name)
    return _GROUPS[name]


# --------------------------------------------------------------------------- teams
def add_team(parent: Group, team: teams.Team, name: str) -> int:
    """Register ``team`` (ranks of ``parent``) as group ``name``; this rank's team rank or -1."""
    with _LOCK:
        if _still_here(name):
            raise CollectiveGroupError(
                f"group {name!r} already exists in this process; pick another name for "
                "the team or destroy the old one first", name, parent.rank)
        if parent.rank not in team:
            _OUTSIDE.add(name)
            return -1
        comm = parent.comm.split(team)
        _GROUPS[name] = Group(name, parent.backend, comm, parent=parent.name)
        _GONE.pop(name, None)
        _OUTSIDE.discard(name)
        parent.teams.append(name)
        return comm.rank


# --------------------------------------------------------------------------- destruction
def destroy(name: str) -> None:
    """Leave group ``name`` here (its teams too); the last member out frees everything."""
    with _LOCK:
        group = _GROUPS.pop(name, None)
        if group is None:
            _destroy_from_outside(name)
            return
        _GONE[name] = None if group.store is None else rendezvous.store_id(group.store)
        for team in list(group.teams):
            destroy(team)
        if group.parent is not None:
            parent = _GROUPS.get(group.parent)
            if parent is not None and name in parent.teams:
                parent.teams.remove(name)
            return
        group.comm.destroy()
        _leave_store(group)


def _leave_store(group: Group) -> None:
    try:
        last = rendezvous.call(group.store, "leave", group.rank, timeout=10.0)
    except Exception:  # noqa: BLE001 - the store died: free this rank's links ourselves
        unlink = getattr(group.comm, "unlink", None)
        if callable(unlink):
            unlink()
        return
    if last:
        rendezvous.kill_store(group.store, group.name)


def _destroy_from_outside(name: str) -> None:
    """On the driver, destroy a group it is not in: close, unlink, kill the store.

    In an actor that never used the group this is a no-op (its membership, if
    declared, is simply never taken up).
    """
    if not ray.is_initialized():
        return
    store = rendezvous.find_store(name)
    if ray.get_runtime_context().get_actor_id() is not None:
        _GONE[name] = None if store is None else rendezvous.store_id(store)
        return
    if store is not None:
        with contextlib.suppress(Exception):
            rendezvous.call(store, "shutdown", timeout=10.0)
        rendezvous.kill_store(store, name)
    _DECLARED.discard(name)


def destroy_all() -> None:
    """Destroy every group of this process (tests, process exit)."""
    for name in [n for n, g in list(_GROUPS.items()) if g.parent is None]:
        destroy(name)


# --------------------------------------------------------------------------- checks
def _usable_backend(name: str, check_here: bool = True) -> Kind:
    row = backend(name)
    if check_here and not row.available():
        raise CollectiveGroupError(
            f"backend {row.name!r} is not available in this process "
            f"({'no CUDA device or torch without NCCL' if row.name == 'nccl' else 'torch.distributed without gloo'}); "
            "use backend='cpu' or 'gloo' on CPU actors")
    return row


def _check_size_and_rank(world_size: int, rank: int, name: str) -> None:
    if world_size < 1:
        raise CollectiveGroupError(f"group {name!r}: world_size must be at least 1, got {world_size}", name)
    if not 0 <= rank < world_size:
        raise CollectiveGroupError(
            f"rank {rank} is outside group {name!r} of world_size {world_size} (ranks 0.."
            f"{world_size - 1})", name, rank)
