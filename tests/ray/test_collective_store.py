"""Rendezvous keys ride on Ray: no TCPStore (no TCP listener) in the store actor or the driver.

    gloo group, declared then used     the GroupStore actor's process: the same TCP
                                       listeners after every rank joined as before
                                       (the old code started a TCPStore server there)
    a compiled graph's NCCL group      _make_nccl on the driver opens no listener;
    (its store, driven through gloo)   the members build a process group over it; teardown
                                       ends the store actor
    RayStore over a real actor         a timeout says "timed out"; a killed actor is an error
"""

from __future__ import annotations

import datetime
import os
import time
import uuid

import pytest
import ray

import cgraph.collective as col
from cgraph.comm import rendezvous
from tests.ray.collective_helpers import (  # noqa: F401 - no_group_segments is an autouse fixture
    destroy_everywhere,
    fresh,
    no_group_segments,
    run_all,
    spawn_members,
)

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
needs_gloo = pytest.mark.skipif(not col.gloo_available(), reason="torch without gloo")


@pytest.fixture(scope="module")
def members(ray_session):
    yield from spawn_members(2)


def tcp_listeners(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on (/proc, no psutil)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    address, port = fields[1].rsplit(":", 1)
                    found.add((address, int(port, 16)))
    return found


def _pid(_self):
    return os.getpid()


@needs_gloo
def test_a_gloo_groups_rendezvous_opens_no_listener_in_its_store_actor(members):
    name = fresh("nolisten")
    try:
        col.declare_collective_group(members, 2, [0, 1], "gloo", name, timeout_s=20)
        store = rendezvous.find_store(name)
        pid = ray.get(store.__ray_call__.remote(_pid), timeout=30)
        before = tcp_listeners(pid)

        def use():
            t = torch.full((3,), col.get_rank(name) + 1.0)
            col.allreduce(t, name)
            return t.tolist()

        values = run_all(members, use)  # both ranks join and build their gloo groups
        after = tcp_listeners(pid)
    finally:
        destroy_everywhere(members, name)
    assert values == [[3.0] * 3] * 2
    assert before, "the store actor's process shows no listener at all (Ray's own): " \
                   "the check cannot see listeners"
    assert after - before == set(), f"the store actor opened listeners {after - before}"


def _gloo_over(rendezvous_record, rank):
    """In a member: a process group over the NCCL rendezvous's store (gloo on CPU)."""
    store = rendezvous_record.connect()
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=ray.util.get_node_ip_address())]
    options._timeout = datetime.timedelta(seconds=30)
    group = dist.ProcessGroupGloo(store, rank, 2, options)
    t = torch.tensor([rank + 1.0])
    group.allreduce([t]).wait()
    return t.item(), store.timeout.total_seconds()


@needs_gloo
def test_a_compiled_graphs_nccl_rendezvous_rides_on_a_store_actor(members):
    from cgraph.comm.kinds import KINDS
    from cgraph.runtime.communicators import CommResources

    res = CommResources()
    before = tcp_listeners(os.getpid())
    payloads = res.add(KINDS["nccl"].make(f"t{uuid.uuid4().hex[:6]}", "nccl", 2, None, None))
    try:
        made = tcp_listeners(os.getpid()) - before
        assert made == set(), f"the driver opened listeners {made} for the rendezvous"
        assert len(res.keep_alive) == 1 and payloads[0] == payloads[1]
        results = run_all(members, _gloo_over, payloads[0], per_rank=lambda i: (i,))
        opened = tcp_listeners(os.getpid()) - before
    finally:
        res.unlink()
    assert results == [(3.0, payloads[0].timeout_s)] * 2
    assert opened == set(), f"the driver opened listeners {opened} during the rendezvous"
    with pytest.raises(ray.exceptions.RayActorError):  # unlink ended the store actor
        ray.get(payloads[0].store.kv_check.remote(["x"]), timeout=30)


def test_the_store_client_over_a_real_actor(ray_session):
    from cgraph.comm.ray_store import connect_store, start_store_actor

    actor = start_store_actor()
    store = connect_store(actor, 0.5).prefixed("p")
    store.set("k", "v")
    assert store.get("k") == b"v" and store.add("n", 4) == 4 and store.num_keys() == 2
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="timed out"):
        store.get("never")
    assert time.monotonic() - start < 10
    ray.kill(actor, no_restart=True)
    with pytest.raises(dist.DistStoreError, match="gone"):
        for _ in range(50):  # the kill lands asynchronously
            store.check(["k"])
            time.sleep(0.1)
