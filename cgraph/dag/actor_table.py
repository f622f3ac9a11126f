"""What Ray's GCS knows of an actor: the resources it asked for and whether it has started.

One home for the one private Ray API cgraph reads at compile (``ray._private.state``): the
adapter asks an actor's GPUs, and compile asks whether an actor that has not answered is
still being created (a worker starting, a runtime environment being set up) or started
and busy. Every read degrades to "unknown" (``None``) rather than fail a compile.
"""

from __future__ import annotations

import time

import ray

from cgraph._boundary import ActorHandle, RayObject

UNREGISTERED = "UNREGISTERED"
"""Not in the GCS actor table yet: ``Actor.remote()`` returned, and the actor's registration
with the GCS (asynchronous; seconds on a loaded machine) has not arrived."""
STARTING = frozenset({UNREGISTERED, "DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING"})
"""The states of an actor that cannot answer a call yet, and will."""


class _Unreadable(Exception):  # noqa: N818 - never leaves this module
    """The table could not be read (Ray not connected, the private API changed)."""


def _read(handle: ActorHandle, wait_s: float) -> RayObject:
    """The actor's entry, or None if it is not in the table within ``wait_s``.

    Raises:
        _Unreadable: the table could not be read.
    """
    if not ray.is_initialized():
        raise _Unreadable("Ray is not connected")
    try:  # a private API: degrade to unknown rather than fail the compile
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        accessor, deadline = state._connect_and_get_accessor(), time.monotonic() + wait_s
        info = accessor.get_actor_info(handle._actor_id)
        while info is None and time.monotonic() < deadline:
            time.sleep(0.05)
            info = accessor.get_actor_info(handle._actor_id)
        return None if info is None else gcs_pb2.ActorTableData.FromString(info)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001
        raise _Unreadable(f"the GCS actor table is unreadable: {e}") from e


def actor_entry(handle: ActorHandle, wait_s: float = 0.0) -> tuple[RayObject, str]:
    """The actor's GCS table entry (``gcs_pb2.ActorTableData``) or None, and how it was read.

    An actor created a moment ago may not be registered yet (its creation is
    asynchronous; under load it takes a while): wait up to ``wait_s`` for its entry."""
    try:
        entry = _read(handle, wait_s)
    except _Unreadable as e:
        return None, str(e)
    if entry is None:
        return None, f"the actor was not in the GCS actor table within {wait_s:g} s"
    return entry, "the GCS actor table"


def actor_state(handle: ActorHandle) -> str | None:
    """``"ALIVE"``, one of ``STARTING`` (``UNREGISTERED`` where the table has no entry for it
    yet), ``"DEAD"``, or None where the table cannot be read."""
    try:
        entry = _read(handle, 0.0)
    except _Unreadable:
        return None
    if entry is None:
        return UNREGISTERED
    from ray.core.generated import gcs_pb2

    return str(gcs_pb2.ActorTableData.ActorState.Name(entry.state))  # type: ignore[attr-defined]
