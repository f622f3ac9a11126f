"""Run by test_attacks.py in its own process: strangers attack a live graph on 2 nodes.

The graph spans a two-node ``ray.cluster_utils.Cluster`` on this machine::

    driver -> b (node2) -+-shm-> c (node2) -> driver      listeners: b (from the driver),
                         +-----> a (head)  -> driver      a (from b), the driver (from c)

Strangers (``stranger.py``: no Ray, no cgraph, no secret) attack those listeners
before the first execution (while they accept), and the driver's control server
at any time. After each round the same graph must return right results. Each
check prints one JSON line; the test asserts on them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import ray
from ray.cluster_utils import Cluster
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.channels.handshake import refused_connections
from cgraph.channels.segments import segment_name
from cgraph.channels.socket_channel import ControlServer, SocketChannel

STRANGER = Path(__file__).with_name("stranger.py")


def report(name: str, **values: object) -> None:
    print(json.dumps({"check": name, **values}), flush=True)


@ray.remote(num_cpus=0)
class Node:
    def inc(self, x):
        return x + 1

    def rss(self) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS"))

    def pid(self) -> int:
        return os.getpid()

    def refused(self) -> int:
        return refused_connections()


def strangers(*attacks: tuple[str, tuple[str, int], str]) -> list[subprocess.Popen]:
    """Start one stranger per attack (``-I``: nothing of this environment is imported)."""
    return [subprocess.Popen([sys.executable, "-I", str(STRANGER), kind, host, str(port), arg],
                             stdout=subprocess.PIPE, text=True)
            for kind, (host, port), arg in attacks]


def all_in(procs: list[subprocess.Popen], timeout: float = 60.0) -> None:
    """Wait until every stranger says it is in at its door (its first line, ``arrived``):
    on a loaded machine a stranger's interpreter may take seconds to start."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"a stranger ({proc.args[3]}) never reached its door"
        assert json.loads(proc.stdout.readline()) == {"in": True}


def outcomes(procs: list[subprocess.Popen]) -> dict[str, dict]:
    found = {}
    for proc in procs:
        proc.wait(timeout=60)  # a few lines: they fit in the pipe
        assert proc.stdout is not None
        out = proc.stdout.read()  # through the reader ``all_in`` used: nothing it buffered is lost
        entry = json.loads(out.strip().splitlines()[-1])
        found[entry.pop("attack")] = entry
    return found


def listeners(server: ControlServer, names: dict[str, str], timeout: float = 30.0) -> dict:
    """Where each named channel's reader listens (once it attached)."""
    deadline, found = time.monotonic() + timeout, {}
    while len(found) < len(names) and time.monotonic() < deadline:
        with server._lock:
            for key, name in names.items():
                entry = server._channels.get(name)
                if entry is not None and entry.addr:
                    host, port = entry.addr.split()
                    found[key] = (host, int(port))
        time.sleep(0.05)
    assert len(found) == len(names), f"readers never attached: {set(names) - set(found)}"
    return found


def run(compiled, start: int, count: int = 5) -> bool:
    return all(compiled.execute(i).get(timeout=60) == [i + 2, i + 2]
               for i in range(start, start + count))


def data_attacks(compiled, server, a, b, names, mark: str) -> None:
    """Before the first execution: every data listener gets a stranger or several."""
    doors = listeners(server, names)
    rss_before = ray.get(a.rss.remote())
    refused_before = ray.get([a.refused.remote(), b.refused.remote()]) + [refused_connections()]
    procs = strangers(
        ("hold", doors["b"], "8"),  # first in at b's door, silent past the handshake deadline
        ("garbage", doors["b"], ""),
        ("forged", doors["b"], f"{names['b']}={mark}.b"),
        ("huge", doors["a"], ""),
        ("pickle", doors["a"], mark + ".a"),
        ("pickle", doors["driver"], mark + ".driver"),
        ("flood", doors["driver"], "24"),
    )
    all_in(procs)  # the strangers are in before the writers connect
    ok = run(compiled, 0)
    seen = outcomes(procs)
    time.sleep(0.5)
    refused_after = ray.get([a.refused.remote(), b.refused.remote()]) + [refused_connections()]
    report("data", results_ok=ok, after_ok=run(compiled, 10), seen=seen,
           files=sorted(p.name for p in Path(mark).parent.glob(Path(mark).name + "*")),
           rss_growth=ray.get(a.rss.remote()) - rss_before,
           refused=[x - y for x, y in zip(refused_after, refused_before, strict=True)],
           doors_shut=all(_refused_connect(addr) for addr in doors.values()))


def _refused_connect(addr: tuple[str, int]) -> bool:
    import socket

    try:
        socket.create_connection(addr, timeout=2).close()
        return False
    except OSError:
        return True


def control_attacks(compiled, server, names) -> None:
    """At any time: forged hellos and closes at the driver's control server."""
    procs = strangers(("hello", server.address, names["b"]), ("close", server.address, names["b"]),
                      ("close", server.address, names["driver"]), ("garbage", server.address, ""))
    seen = outcomes(procs)
    report("control", seen=seen, after_ok=run(compiled, 20), closed=[
        server.channel_closed(n) for n in names.values()])


def doors_by_reader(compiled) -> dict[str, str]:
    """The socket channels' names (what a stranger could guess) by who listens: "b" (the
    driver's input), "a" (b's value), "driver" (c's value)."""
    names = [r.channel.handle.name for r in compiled._ep.resources
             if isinstance(getattr(r, "channel", None), SocketChannel)]
    doors = {}
    for spec in compiled.planned.plan.channels:
        if spec.kind.name == "CROSS_NODE":
            who = "b" if spec.writer == "driver" else "driver" if spec.readers == ("driver",) else "a"
            safe = segment_name("", spec.id).split("_", 3)[3]
            doors[who] = next(n for n in names if n.endswith("_" + safe))
    return doors


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"head": 10}, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"node2": 10})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        a = Node.options(resources={"head": 1}).remote()
        b, c = (Node.options(resources={"node2": 1}).remote() for _ in range(2))
        mark = f"/tmp/cgraph-attack-{uuid.uuid4().hex[:8]}"
        for round_ in ("fresh", "forged hello before the first write"):
            with InputNode() as inp:
                x = b.inc.bind(inp)
                dag = MultiOutputNode([a.inc.bind(x), c.inc.bind(x)])
            compiled = cgraph.compile(dag)
            server = ControlServer.shared(ray.util.get_node_ip_address())
            names = doors_by_reader(compiled)
            if round_ == "fresh":
                data_attacks(compiled, server, a, b, names, mark)
            else:
                control_attacks(compiled, server, names)
            compiled.teardown()
        ours = {os.getpid(), *ray.get([n.pid.remote() for n in (a, b, c)])}
        report("after", segments=sorted(n for n in os.listdir("/dev/shm")  # of this script's graphs
                                        if n.startswith("cgraph_") and int(n.split("_")[1]) in ours),
               files=sorted(p.name for p in Path("/tmp").glob(Path(mark).name + "*")))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
