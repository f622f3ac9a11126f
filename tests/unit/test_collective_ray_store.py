"""The Ray-backed torch store (``cgraph.comm.ray_store``) without Ray.

    KVStore (the actor's class)      driven directly in an asyncio loop
    RayStore (the torch Store)       over a KVStore in a loop thread (``LocalActor``),
                                     called from Python and through torch's C++
                                     (``dist.Store.<method>(store, ...)``), and used by
                                     two gloo ranks in threads

The Ray side (a real actor, no TCP listener) is in tests/ray/test_collective_store.py.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time

import pytest

from cgraph.comm import ray_store
from cgraph.comm.ray_store import KVStore, connect_store

dist = pytest.importorskip("torch.distributed")


# --------------------------------------------------------------------------- server
def run(coro_fn):
    """Run ``coro_fn(store)`` on a fresh KVStore in a fresh loop."""
    return asyncio.run(coro_fn(KVStore()))


def test_set_get_and_values_are_bytes():
    async def body(kv):
        await kv.kv_set("a", b"1")
        return await kv.kv_get("a", 0.1), await kv.kv_get("missing", 0.05)

    assert run(body) == (b"1", None)


def test_a_get_waits_for_the_key_without_spinning_and_wakes_on_set():
    async def body(kv):
        getter = asyncio.ensure_future(kv.kv_get("k", 5.0))
        cpu = time.process_time()
        await asyncio.sleep(0.3)  # the getter is parked on the Condition, not polling
        cpu = time.process_time() - cpu
        parked = not getter.done()
        start = time.monotonic()
        await kv.kv_set("k", b"v")
        value = await getter
        return parked, cpu, value, time.monotonic() - start

    parked, cpu, value, woke = run(body)
    assert parked and value == b"v"
    assert cpu < 0.1, f"waiting 0.3 s took {cpu:.3f} s of CPU: the getter spins"
    assert woke < 0.5


def test_wait_returns_the_keys_still_missing_at_its_deadline():
    async def body(kv):
        await kv.kv_set("x", b"")
        start = time.monotonic()
        missing = await kv.kv_wait(["x", "y", "z"], 0.1)
        took = time.monotonic() - start
        later = asyncio.ensure_future(kv.kv_wait(["y"], 5.0))
        await asyncio.sleep(0)
        await kv.kv_set("y", b"1")
        return missing, took, await later

    missing, took, later = run(body)
    assert missing == ["y", "z"], "an empty value is a value: x exists"
    assert 0.09 <= took < 2.0
    assert later == []


def test_add_counts_in_decimal_text_like_tcpstore():
    async def body(kv):
        first, second = await kv.kv_add("n", 2), await kv.kv_add("n", -5)
        return first, second, await kv.kv_get("n", 0.1)

    assert run(body) == (2, -3, b"-3")


def test_compare_set_follows_c10d():
    async def body(kv):
        return [
            await kv.kv_compare_set("k", b"", b"one"),  # absent and expected empty: set
            await kv.kv_compare_set("k", b"zzz", b"two"),  # wrong: the current value
            await kv.kv_compare_set("k", b"one", b"two"),  # right: set
            await kv.kv_compare_set("absent", b"exp", b"new"),  # absent, expected given
            await kv.kv_get("k", 0.1),
            kv.kv_check(["absent"]),
        ]

    assert run(body) == [b"one", b"one", b"two", b"exp", b"two", False]


def test_check_delete_and_counting_by_prefix():
    async def body(kv):
        for key in ("p/a", "p/b", "q/a"):
            await kv.kv_set(key, b"1")
        before = (kv.kv_check(["p/a", "q/a"]), kv.kv_num_keys("p/"), kv.kv_num_keys(""))
        deleted = (kv.kv_delete("p/a"), kv.kv_delete("p/a"))
        return before, deleted, kv.kv_check(["p/a"]), kv.kv_num_keys("p/")

    assert run(body) == ((True, 2, 3), (True, False), False, 1)


# --------------------------------------------------------------------------- client
class _Method:
    def __init__(self, actor: LocalActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args):
        async def call():
            out = getattr(self.actor.server, self.name)(*args)
            return await out if asyncio.iscoroutine(out) else out

        return asyncio.run_coroutine_threadsafe(call(), self.actor.loop)


class LocalActor:
    """A KVStore in an event loop thread, called like an actor handle (``.m.remote()``)."""

    def __init__(self) -> None:
        self.server = KVStore()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def actor(monkeypatch):
    monkeypatch.setattr(ray_store, "_resolve", lambda future, timeout, method: future.result(timeout))
    local = LocalActor()
    yield local
    local.stop()


def test_the_client_is_a_torch_store_reached_through_cpp_too(actor):
    store = connect_store(actor, 2.0)
    assert isinstance(store, dist.Store) and isinstance(store, ray_store.RayStore)
    Store = dist.Store  # the C++ methods: they reach ours through torch's trampoline
    Store.set(store, "k", b"v")
    store.set("s", "text")  # str values are encoded
    assert (Store.get(store, "k"), store.get("s")) == (b"v", b"text")
    assert (Store.add(store, "n", 2), store.add("n", 3), store.get("n")) == (2, 5, b"5")
    assert Store.compare_set(store, "c", "", "x") == b"x"
    assert Store.check(store, ["k", "n"]) and not Store.check(store, ["k", "absent"])
    assert Store.num_keys(store) == 4 and Store.delete_key(store, "k") and store.num_keys() == 3
    Store.append(store, "log", b"a")  # torch's default append: get + compare_set, ours
    Store.append(store, "log", b"b")
    assert Store.multi_get(store, ["log", "s"]) == [b"ab", b"text"]
    Store.wait(store, ["n", "s"])
    Store.wait(store, ["n"], datetime.timedelta(seconds=1))
    clone = Store.clone(store)
    assert clone.get("n") == b"5"


def test_prefixed_stores_share_the_actor_under_prefixstores_layout(actor):
    root = connect_store(actor, 2.0).prefixed("group.nonce")
    team = root.prefixed("group[0,2]")
    team.set("0", b"addr")
    assert actor.server._kv == {"group.nonce/group[0,2]/0": b"addr"}
    assert root.get("group[0,2]/0") == b"addr"
    assert (team.num_keys(), root.num_keys(), root.prefixed("other").num_keys()) == (1, 1, 0)
    assert team.timeout == datetime.timedelta(seconds=2)


def test_a_key_never_set_is_a_store_error_that_says_timed_out(actor):
    store = connect_store(actor, 0.3)
    for attempt in (
        lambda: store.get("never"),
        lambda: dist.Store.get(store, "never"),  # from C++, as gloo's rendezvous calls it
        lambda: store.wait(["never"]),
        lambda: dist.Store.wait(store, ["never"], datetime.timedelta(seconds=0.2)),
    ):
        start = time.monotonic()
        with pytest.raises(dist.DistStoreError, match="timed out") as info:
            attempt()
        assert time.monotonic() - start < 3
        assert "never" in str(info.value)
    assert isinstance(info.value, RuntimeError)  # what the gloo backend's handling catches


def test_a_wait_returns_as_soon_as_another_rank_sets_the_key(actor):
    store = connect_store(actor, 10.0)
    setter = threading.Timer(0.2, lambda: connect_store(actor).set("late", b"1"))
    setter.start()
    start = time.monotonic()
    assert store.get("late") == b"1"
    setter.join()
    assert time.monotonic() - start < 5


def test_two_gloo_ranks_meet_through_the_store(actor):
    """The path comm.torch.backend and NcclCommunicator take: a process group built on it."""
    torch = pytest.importorskip("torch")
    if not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    root = connect_store(actor, 20.0).prefixed("g.1")
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        try:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            options._timeout = datetime.timedelta(seconds=20)
            store = root.prefixed("g[0,1]")
            group = dist.ProcessGroupGloo(store, r, 2, options)
            t = torch.tensor([r + 1.0, 10.0 * r])
            group.allreduce([t]).wait()
            results[r] = (t.tolist(), store)
        except Exception as exc:  # noqa: BLE001 - reported below
            results[r] = repr(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [results[r][0] for r in (0, 1)] == [[3.0, 10.0]] * 2, results
    assert any(key.startswith("g.1/g[0,1]/") for key in actor.server._kv)
