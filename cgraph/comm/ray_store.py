"""A torch.distributed store that rides on Ray: the keys live in an actor.

torch's ``TCPStore`` is a TCP server that anyone who reaches the node can read
and write (a poisoned rendezvous can redirect gloo's pair connections to a
stranger). Here the keys live in a Ray actor, so only a process of the Ray
cluster that holds the actor's handle reaches them, over Ray's own channels::

    client: RayStore(actor, prefix)                 server: KVStore (async Ray actor)
    (a torch.distributed.Store in Python)
      set / add / compare_set / delete_key  ──────►  kv_set / kv_add / ... (one call each)
      get / wait  ────────────────────────────────►  kv_get / kv_wait: await a Condition
        one call, answered when the keys exist         until the keys exist or the
        or the timeout passed                          deadline passes (no thread, no spin)
      check / num_keys  ──────────────────────────►  kv_check / kv_num_keys (never wait)
    store.prefixed("x")  shares the actor; its keys are "<prefix>x/<key>"

Who serves: ``GroupStore`` (rendezvous) subclasses ``KVStore``, so a gloo/nccl
group's keys live in the store actor the group already has; a compiled graph's
NCCL group gets a bare ``KVStore`` actor on the driver's node
(``start_store_actor``).

Prefixes: ``store.prefixed(p)`` rather than torch's ``PrefixStore``. A C++ object
holding a Python store keeps only its C++ half alive: once no Python reference
is left, every call fails with "Not implemented" from torch's trampoline
(measured with torch 2.13; reported as
pytorch issue #120843), easy to hit with a wrapper made inline. Each ``prefixed`` store is a Python object its user keeps, as a
process group's store must be kept as long as the group (``TorchComm``,
``NcclCommunicator`` do).

A wait that times out raises ``torch.distributed.DistStoreError`` (a
``RuntimeError``) whose message says "timed out", as TCPStore's does. The
client class subclasses ``torch.distributed.Store``, so it is made on first use
(``RayStore`` below, through the module's ``__getattr__``): importing this module
(every group's store actor does, "cpu" groups too) imports no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import ray

from cgraph._boundary import ActorHandle, RayObject, TorchObject

if TYPE_CHECKING:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from typing_extensions import Self

RENDEZVOUS_TIMEOUT_S = 120.0
"""How long joining may take: starting the store actor, and (gloo, nccl) every rank
connecting. Calls made after that wait the group's own timeout."""
DEFAULT_TIMEOUT_S = 300.0
"""A client's timeout when none is given (TCPStore's default)."""
ANSWER_MARGIN_S = 30.0
"""How much longer than its own deadline a client waits for the actor's answer: the
actor answers a wait at the deadline itself, so only an unreachable actor runs past."""


class KVStore:
    """The server side: bytes by key, for an async Ray actor (tests drive it in a loop).

    Mutations notify one ``asyncio.Condition``; ``kv_get``/``kv_wait`` await it
    until their keys exist or their deadline passes, and then answer. A timeout is
    an answer (``None`` / the missing keys), not an exception, so that the client
    raises torch's error in its own process.
    """

    def __init__(self) -> None:
        self._kv: dict[str, bytes] = {}
        # bound to the actor's event loop on first use (asyncio primitives are lazy)
        self._changed = asyncio.Condition()

    async def kv_set(self, key: str, value: bytes) -> None:
        """Set ``key`` and wake every waiter (each re-checks its own keys)."""
        async with self._changed:
            self._kv[key] = value
            self._changed.notify_all()

    async def kv_get(self, key: str, timeout_s: float | None) -> bytes | None:
        """The value of ``key`` once it exists; None if ``timeout_s`` passed first."""
        missing = await self.kv_wait([key], timeout_s)
        return None if missing else self._kv.get(key)

    async def kv_wait(self, keys: Sequence[str], timeout_s: float | None) -> list[str]:
        """Wait until every key exists (None: no deadline).

        Returns:
            The keys still missing at the deadline; empty when all exist.
        """

        def present() -> bool:
            return all(key in self._kv for key in keys)

        async with self._changed:
            if not present():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait_for(present), timeout_s)
            return [key for key in keys if key not in self._kv]

    async def kv_add(self, key: str, amount: int) -> int:
        """Add to the integer stored (as decimal text, like TCPStore) at ``key``; the new value."""
        async with self._changed:
            value = int(self._kv.get(key, b"0")) + amount
            self._kv[key] = str(value).encode()
            self._changed.notify_all()
            return value

    async def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``desired`` if the value is ``expected`` (absent counts as b""); c10d's rules.

        Returns:
            ``desired`` if it was set, else the current value (``expected`` if absent).
        """
        async with self._changed:
            current = self._kv.get(key)
            if current == expected or (current is None and not expected):
                self._kv[key] = desired
                self._changed.notify_all()
                return desired
            return expected if current is None else current

    def kv_check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, now (never waits)."""
        return all(key in self._kv for key in keys)

    def kv_delete(self, key: str) -> bool:
        """Remove ``key``; whether it existed."""
        return self._kv.pop(key, None) is not None

    def kv_num_keys(self, prefix: str) -> int:
        """How many keys start with ``prefix``."""
        return sum(1 for key in self._kv if key.startswith(prefix))


_KVActor = ray.remote(num_cpus=0, max_restarts=0)(KVStore)


def on_this_node() -> dict[str, NodeAffinitySchedulingStrategy]:
    """Actor options that place it on the caller's Ray node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def start_store_actor() -> ActorHandle:
    """A new bare store actor on this node (for rendezvous outside a collective group).

    Returns:
        Its handle: Ray ends the actor once this handle and every copy of it are dropped.
    """
    return _KVActor.options(**on_this_node()).remote()


# --------------------------------------------------------------------------- client side
class StoreClient:
    """The client's methods; ``RayStore`` mixes them into ``torch.distributed.Store``.

    torch calls them from C++ too (gloo, NCCL), by these names: ``getNumKeys``
    and ``deleteKey`` are the C++ names its trampoline looks up.
    """

    def __init__(self, actor: ActorHandle, prefix: str = "", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()  # torch.distributed.Store's (pybind needs it called)
        self._actor, self._prefix = actor, prefix
        self._kept: list[StoreClient] = []  # clones handed to C++ (below)
        self.set_timeout(datetime.timedelta(seconds=timeout_s))  # type: ignore[attr-defined]

    def prefixed(self, prefix: str) -> Self:
        """A store on the same actor, with the same timeout, under a longer prefix.

        Args:
            prefix: its keys are ``<this store's prefix><prefix>/<key>`` (PrefixStore's layout).

        Returns:
            A new ``RayStore`` (keep it as long as anything built on it).
        """
        return type(self)(self._actor, f"{self._prefix}{prefix}/", self._timeout_s())

    def set(self, key: str, value: str | bytes) -> None:
        """Set ``key`` (a str value is stored UTF-8 encoded), waking its waiters."""
        self._call("kv_set", self._key(key), _as_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store's timeout for it to be set.

        Raises:
            torch.distributed.DistStoreError: it was not set in time ("timed out").
        """
        deadline = self._timeout_s()
        value = self._call("kv_get", self._key(key), deadline, wait_s=deadline)
        if value is None:
            raise _store_error(f"RayStore get({key!r}) timed out after {deadline:g} s: "
                               f"the key was never set (prefix {self._prefix!r})")
        return bytes(value)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter at ``key`` (absent: 0).

        Returns:
            The new value.
        """
        return int(self._call("kv_add", self._key(key), int(amount)))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """Set ``desired`` if ``key`` holds ``expected`` (absent counts as empty).

        Returns:
            ``desired`` if set, else the current value (``expected`` if absent).
        """
        return bytes(self._call("kv_compare_set", self._key(key), _as_bytes(expected),
                                _as_bytes(desired)))

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        """Wait until every key is set (``timeout`` defaults to the store's; zero: forever).

        Raises:
            torch.distributed.DistStoreError: some key was not set in time ("timed out").
        """
        seconds = self._timeout_s() if timeout is None else timeout.total_seconds()
        deadline = seconds if seconds > 0 else None  # c10d's kNoTimeout is zero
        missing = self._call("kv_wait", [self._key(k) for k in keys], deadline, wait_s=deadline)
        if missing:
            shown = [k[len(self._prefix):] for k in missing]
            raise _store_error(f"RayStore wait timed out after {seconds:g} s: keys {shown} "
                               f"were never set (prefix {self._prefix!r})")

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key is set, now (never waits)."""
        return bool(self._call("kv_check", [self._key(k) for k in keys]))

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; whether it existed."""
        return bool(self._call("kv_delete", self._key(key)))

    def num_keys(self) -> int:
        """How many keys exist under this store's prefix (the whole actor's if none)."""
        return int(self._call("kv_num_keys", self._prefix))

    deleteKey = delete_key  # noqa: N815 - the name torch's C++ trampoline calls
    getNumKeys = num_keys  # noqa: N815

    def clone(self) -> Self:
        """Another client of the same keys (torch asks for one from C++)."""
        copy = type(self)(self._actor, self._prefix, self._timeout_s())
        # pybind drops the Python override of an object only C++ holds: keep it here
        self._kept.append(copy)
        return copy

    # ------------------------------------------------------------------ internals
    def _key(self, key: str) -> str:
        return self._prefix + key

    def _timeout_s(self) -> float:
        return float(self.timeout.total_seconds())  # type: ignore[attr-defined]

    def _call(self, method: str, *args: object, wait_s: float | None = 0.0) -> RayObject:
        """One Ray call to the actor; Ray's failures become the store errors torch expects.
        ``wait_s``: how long the actor itself may wait for keys (None: forever)."""
        # an actor still starting (or busy) gets the store's timeout even for quick calls
        limit = None if wait_s is None else max(wait_s, self._timeout_s()) + ANSWER_MARGIN_S
        return _resolve(getattr(self._actor, method).remote(*args), limit, method)


def _resolve(ref: RayObject, timeout_s: float | None, method: str) -> RayObject:
    """``ray.get`` with the store's errors (tests replace it to drive a local server)."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise _store_error(f"RayStore {method} timed out: the store actor did not answer within "
                           f"{timeout_s:g} s") from None
    except ray.exceptions.RayActorError as exc:
        raise _store_error(f"RayStore {method} failed: the store actor is gone "
                           f"({type(exc).__name__}); its group or graph was torn down") from None


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _store_error(message: str) -> Exception:
    import torch.distributed as dist

    return dist.DistStoreError(message)


@functools.cache
def _ray_store_class() -> type:
    import torch.distributed as dist

    class RayStore(StoreClient, dist.Store):  # type: ignore[misc, name-defined]  # torch's Store, unresolved through the local import
        """A ``torch.distributed.Store`` whose keys live in a ``KVStore`` actor
        (see the module docstring)."""

    RayStore.__module__, RayStore.__qualname__ = __name__, "RayStore"
    return RayStore


def connect_store(actor: ActorHandle, timeout_s: float = DEFAULT_TIMEOUT_S, prefix: str = "") -> TorchObject:
    """A ``RayStore`` client of the store actor ``actor``.

    Args:
        actor: a ``KVStore`` actor's handle (a ``GroupStore`` is one too).
        timeout_s: how long ``get``/``wait`` wait for a key by default.
        prefix: prepended to every key as is (``prefixed`` adds a "/").

    Returns:
        The client, a ``torch.distributed.Store`` (keep it alive as long as a
        process group built on it: C++ holds only a reference to it).
    """
    return _ray_store_class()(actor, prefix, timeout_s)


def __getattr__(name: str) -> type:
    if name == "RayStore":  # made on first use: it imports torch
        return _ray_store_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
