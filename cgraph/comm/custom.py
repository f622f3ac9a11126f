"""User communicators ("custom" groups): one copy per group, initialized at compile in
their actors, so a failing ``initialize`` is a compile error, not the first execution's.

    driver (setup_communicators)                     each member actor of a custom group
    as_cgraph, checked: methods, pickling
    copy_for_group: a copy of the object per group
    initialize_custom ── __ray_call__(_initialize) ─► comm.initialize(rank, n, group name)
      (every member at once: they meet each other)     kept in READY[(group name, rank)]
    ray.wait: the first error, or 60 s ─► CompileError (every member's copy dropped)
                                                     first communicator op of the loop:
                                                     open_custom ─► the same object
    teardown: CommResources.unlink ─► drop ─────────► destroy() what no loop took (never ran)

This is what Ray Compiled Graphs does for its communicators (initialized through
``__ray_call__`` at compile), so ``initialize`` runs on the actor's default
thread and the loop uses the object on its own. Without Ray handles (the
in-process test harness) the loop initializes the object itself, as before.
A member whose peers never come stays in ``initialize`` until its own timeout,
after the compile error; the actor answers other calls after that.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from cgraph._boundary import ActorHandle, UserValue
from cgraph.comm.communicator import missing_methods
from cgraph.errors import ChannelClosedError, CompileError

if TYPE_CHECKING:
    from dataclasses import Field
    from typing import ClassVar, Protocol, TypeVar

    class Member(Protocol):
        """What this module reads of a ``comm.kinds.GroupEndpoint`` (kinds imports this module),
        a dataclass (``replace``)."""

        __dataclass_fields__: ClassVar[dict[str, Field[object]]]

        @property
        def name(self) -> str: ...
        @property
        def kind(self) -> str: ...
        @property
        def rank(self) -> int: ...
        @property
        def world_size(self) -> int: ...
        @property
        def ready(self) -> bool: ...
        @property
        def payload(self) -> UserValue: ...  # a "custom" group's: the user's communicator object

    M = TypeVar("M", bound=Member)

    class Program(Protocol[M]):
        """What this module reads of a ``runtime.communicators.CommProgram`` (a layer above)."""

        @property
        def groups(self) -> dict[str, M]: ...


INIT_TIMEOUT_S = 60.0
"""How long compile waits for every member's ``initialize`` (the graph's ``get_timeout``
if longer: a short one is for results, not for connecting)."""

READY: dict[tuple[str, int], UserValue] = {}
"""In an actor process: communicators initialized at compile, until the loop takes them."""


def initialize_custom(
    handles: Mapping[str, ActorHandle], programs: Mapping[str, Program[M]], labels: Mapping[str, str],
    timeout: float | None,
) -> list[tuple[ActorHandle, tuple[str, int]]]:
    """Run ``initialize`` of every user communicator in its member actors (Ray actors only),
    and mark their ``GroupEndpoint`` s of ``programs`` (actor -> ``CommProgram``) ``ready``.

    Returns:
        What to drop at teardown: (actor handle, key in ``READY``) per member.

    Raises:
        CompileError: an ``initialize`` raised, or not all returned within ``timeout``
            or ``INIT_TIMEOUT_S``, whichever is longer.
    """
    import ray

    members = [(a, key, g) for a, p in programs.items() for key, g in p.groups.items()
               if g.kind == "custom" and isinstance(handles.get(a), ray.actor.ActorHandle)]
    calls = {handles[a].__ray_call__.remote(_initialize, g): (a, g) for a, _, g in members}
    made = [(handles[a], (g.name, g.rank)) for a, _, g in members]
    limit = max(timeout or 0.0, INIT_TIMEOUT_S)
    pending, deadline = list(calls), time.monotonic() + limit
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                late = ", ".join(f"{labels[a]} (rank {g.rank})" for a, g in (calls[r] for r in pending))
                raise CompileError(
                    f"user communicator initialize() did not return within {limit:g} s on "
                    f"{late}; cgraph initializes it in every member actor at compile, all at once: make "
                    "sure every member can reach the others (or raise get_timeout)")
            try:
                ray.get(done[0])
            except ray.exceptions.RayError as exc:
                actor, g = calls[done[0]]
                cause = getattr(exc, "cause", None) or exc
                raise CompileError(
                    f"communicator {g.name.partition('/')[2]} ({type(g.payload).__name__}) raised in "
                    f"initialize(rank={g.rank}, world_size={g.world_size}) on actor {labels[actor]}: "
                    f"{type(cause).__name__}: {cause}; cgraph initializes a user communicator in every "
                    "member actor at compile: fix initialize() or what it connects to") from cause
    except BaseException:
        drop(made)
        raise
    for actor, key, g in members:
        programs[actor].groups[key] = replace(g, ready=True)
    return made


def drop(made: list[tuple[ActorHandle, tuple[str, int]]]) -> None:
    """Destroy, in their actors, the communicators no loop took (the calls are not waited for)."""
    for handle, key in made:
        with contextlib.suppress(Exception):  # after ray.shutdown(), a dead actor: nothing to drop
            handle.__ray_call__.remote(_drop, key)


def copy_for_group(obj: object, n: int) -> list[UserValue]:
    """Every rank's payload: a copy of ``obj`` for this group alone (an actor in two groups
    of one object, an edge's and a collective's, would otherwise unpickle one object for
    both and initialize it twice)."""
    import ray.cloudpickle as cloudpickle

    return [cloudpickle.loads(cloudpickle.dumps(obj))] * n  # type: ignore[no-untyped-call]  # unannotated in Ray


def as_cgraph(name: str, obj: object, members: tuple[str, ...], handles: Mapping[str, ActorHandle]) -> object:
    """A user's communicator as cgraph runs it, checked: a subclass of Ray's ``Communicator``
    is wrapped (``RayCommunicator``: its ranks read here, from the members' handles).

    Raises:
        CompileError: Ray's ranks do not fit the members, a method is missing, or the
            object cannot be pickled.
    """
    from ray.experimental.channel.communicator import Communicator as RayBase

    if isinstance(obj, RayBase):
        from cgraph.comm.ray_communicator import RayCommunicator, ranks_of

        try:
            obj = RayCommunicator(obj, ranks_of(obj, [handles[m] for m in members], list(members)))
        except ValueError as exc:
            raise CompileError(f"communicator {name}: {exc}") from None
    _check(name, obj)
    return obj


def _check(name: str, obj: object) -> None:
    missing = missing_methods(obj)
    if missing:
        raise CompileError(
            f"communicator {name} ({type(obj).__name__}) lacks {', '.join(missing)}; subclass "
            "cgraph.Communicator and implement initialize, rank, "
            "world_size, send and recv"
        )
    import ray.cloudpickle as cloudpickle

    try:
        cloudpickle.dumps(obj)  # type: ignore[no-untyped-call]  # unannotated in Ray
    except Exception as exc:  # noqa: BLE001
        raise CompileError(
            f"communicator {name} ({type(obj).__name__}) cannot be pickled ({type(exc).__name__}: "
            f"{exc}); cgraph ships one copy to every member actor, so keep connections out of "
            "__init__ and open them in initialize()"
        ) from exc


def open_custom(group: Member) -> UserValue:
    """``Kind.open`` of "custom": this actor's communicator of ``group``, initialized at compile
    (without Ray handles, in-process tests, it is initialized here).

    Raises:
        ChannelClosedError: teardown dropped it before the loop opened it.
    """
    comm = READY.pop((group.name, group.rank), None)
    if comm is None and group.ready:
        raise ChannelClosedError(f"communicator group {group.name}: the graph was torn down before its loop opened it")
    if comm is None:
        comm = group.payload  # this actor's own unpickled copy
        comm.initialize(group.rank, group.world_size, group.name)
    return comm


def _initialize(_actor: object, group: Member) -> None:
    comm = group.payload  # this call's own unpickled copy
    comm.initialize(group.rank, group.world_size, group.name)
    READY[(group.name, group.rank)] = comm


def _drop(_actor: object, key: tuple[str, int]) -> None:
    comm = READY.pop(key, None)
    if comm is not None:
        with contextlib.suppress(Exception):
            comm.destroy()
