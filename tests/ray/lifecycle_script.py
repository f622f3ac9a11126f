"""Many compile / execute / ray.shutdown() / ray.init() cycles in one driver process (run by
test_runtime_shutdown.py in a fresh process, so the test session's Ray stays as it is).

Each cycle connects to a running two-node cluster (one graph crosses to the second node, so
its channels are sockets), or, the last two, starts a local Ray of its own as Ray's test
fixtures do; compiles three graphs, runs them, tears some down and leaves the rest (and a
result never read) to ``ray.shutdown()``. After each shutdown it records what the process
holds: cgraph's threads, its shared-memory segments, the sockets cgraph's code opened that
are still open, and whether Ray is up. The last line printed is that record as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
import traceback
import weakref

import ray
import ray.cluster_utils

import cgraph
from cgraph import InputNode, MultiOutputNode

CYCLES = int(sys.argv[1]) if len(sys.argv) > 1 else 20
LOCAL = 2  # the last cycles start a local Ray each (ray.init() with no address)


class _Tracked(socket.socket):
    """Every socket the process opens; those opened by cgraph's code are remembered."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if any(f"{os.sep}cgraph{os.sep}" in frame.filename for frame in traceback.extract_stack(limit=40)):
            OPENED.append(weakref.ref(self))


OPENED: list[weakref.ref[socket.socket]] = []
socket.socket = _Tracked  # type: ignore[misc]  # the module's own functions (socketpair) use it too


@ray.remote(num_cpus=0)
class Adder:
    def add(self, x, by=1):
        return x + by


def held() -> dict[str, object]:
    """What this process holds now that a graph could have left behind."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    mine = f"cgraph_{os.getpid()}_"
    return {
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("cgraph")),
        "segments": sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine)),
        "sockets": sum(link.startswith("socket:") for link in fds),  # Ray's own leak one a cycle
        "cgraph_sockets": len(OPENED),
        "cgraph_sockets_open": sum(1 for ref in OPENED if (s := ref()) is not None and s.fileno() != -1),
        "ray": ray.is_initialized(),
    }


def one_cycle(i: int, address: str | None) -> list[object]:
    if address is None:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # never another script's cluster
    else:
        ray.init(address=address, log_to_driver=False)
    far = {} if address is None else {"resources": {"far": 0.01}}  # on the cluster's second node
    a, c, d, e = (Adder.remote() for _ in range(4))
    b = Adder.options(**far).remote()
    with InputNode() as inp:
        chain = b.add.bind(a.add.bind(inp))
    with InputNode() as inp:
        fan = MultiOutputNode([c.add.bind(inp[0]), d.add.bind(inp[1], by=inp.by)])
    with InputNode() as inp:
        lone = e.add.bind(inp)
    g1, g2 = cgraph.compile(chain), cgraph.compile(fan)
    g3 = cgraph.compile(lone, enable_asyncio=True)
    got = [g1.execute(i).get(timeout=60), g2.execute(i, 10, by=5).get(timeout=60)]

    async def main() -> int:
        return int(await (await g3.execute_async(i)))

    got.append(asyncio.run(main()))
    unread = g1.execute(100)  # never read: left for the shutdown
    if i % 2 == 0:
        g2.teardown()
    if i % 3 == 0:
        g3.teardown()
    ray.shutdown()  # tears down what is still live, as Ray's own graphs
    del unread
    return got


def main() -> None:
    cluster = ray.cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"far": 1})
    before = held()
    results, after = [], []
    try:
        for i in range(CYCLES + LOCAL):
            local = i >= CYCLES
            if local and i == CYCLES:
                cluster.shutdown()
            results.append(one_cycle(i, None if local else cluster.address))
            time.sleep(0.05)
            after.append(held())
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster.list_all_nodes():
            cluster.shutdown()
    time.sleep(1.0)  # a graph's thread that woke after the shutdown would start Ray again now
    print(json.dumps({"before": before, "results": results, "after": after,
                      "ray_at_exit": ray.is_initialized()}))


if __name__ == "__main__":
    main()
