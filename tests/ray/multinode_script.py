"""Run by test_multinode.py in its own process: a 2-node Ray cluster on this machine.

Each check prints one JSON line; the test asserts on them. Actors on the second
node are reached over cross-node (socket) channels.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster
from ray.dag import InputNode, MultiOutputNode

import cgraph


def in_cgraph_shm(arr) -> bool:
    """True when the array's memory lies inside one of cgraph's shm mappings."""
    addr = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/cgraph_" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= addr < hi:
                    return True
    return False


def segments_of(compiled) -> list[str]:
    """The graph's shared-memory segments on this machine, whichever node's process made
    them (``cgraph_<pid>_<graph tag>_<channel>``): other test processes' are not its."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("cgraph_") and f"_{compiled._tag}_" in n)


def report(name: str, **values: object) -> None:
    print(json.dumps({"check": name, **values}), flush=True)


@ray.remote(num_cpus=0)
class Node:
    def __init__(self, label: str) -> None:
        self.label = label

    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def nap(self, x, seconds):
        time.sleep(seconds)
        return x

    def inc(self, x):
        return x + 1

    def scale(self, arr, k):
        return arr * k

    def pid(self) -> int:
        return os.getpid()

    def make(self, n):
        return np.arange(n, dtype=np.float64)

    def zero_copy(self, arr):
        return in_cgraph_shm(arr), float(arr.sum())

    def tensor(self, x):
        import torch

        return torch.full((4,), float(x))

    def twice(self, t):
        return t * 2

    def total(self, t):
        return float(t.sum())

    def run(self, fn, *args):
        return fn(*args)

    def fail_on(self, x, bad):
        if x == bad:
            raise ValueError(f"{self.label} refuses {x}")
        return x


def give_this_cluster_certificates() -> str:
    """Certificates of a test CA for every process (the nodes inherit this environment);
    the folder that holds them (the caller removes it)."""
    import tempfile

    import trustme

    folder, ca = tempfile.mkdtemp(prefix="cgraph-tls-"), trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(f"{folder}/cert.pem")
    cert.private_key_pem.write_to_path(f"{folder}/key.pem")
    ca.cert_pem.write_to_path(f"{folder}/ca.pem")
    os.environ.update(CGRAPH_TLS_CERT=f"{folder}/cert.pem", CGRAPH_TLS_KEY=f"{folder}/key.pem",
                      CGRAPH_TLS_CA=f"{folder}/ca.pem")
    return folder


def break_data_connections(_self) -> int:
    """In an actor: cut the data connections of its socket writers (the actor lives on)."""
    import gc
    import socket

    from cgraph.channels.socket_channel import SocketWriter

    broken = 0
    for obj in gc.get_objects():
        if isinstance(obj, SocketWriter) and obj._data is not None:
            socket.socket.shutdown(obj._data, socket.SHUT_RDWR)
            broken += 1
    return broken


def check_where_across_nodes(a, b) -> None:
    """b (node 2) naps in its method, a (head) waits for its value: a get's timeout says so
    for both, with their nodes, as on one node."""
    with InputNode() as inp:
        dag = a.inc.bind(b.nap.bind(inp, 4))
    compiled = cgraph.compile(dag)
    compiled.execute(0).get(timeout=60)
    ref = compiled.execute(1)
    try:
        ref.get(timeout=1.5)
        said = None
    except cgraph.TimeoutError as exc:
        said = str(exc)
    status = [str(w) for w in compiled.status()]
    ref.get(timeout=60)
    compiled.teardown()
    report("where", said=said, status=status)


def check_death_at_the_output(on_two) -> None:
    """driver -> d(node2) -> driver: d's output reaches the driver over a socket, whose
    stream ends the moment d dies; get() must say that d died, not blame a teardown."""
    d = on_two.remote("d")
    with InputNode() as inp:
        dag = d.inc.bind(inp)
    compiled = cgraph.compile(dag)
    compiled.execute(1).get(timeout=60)
    ray.get(d.__ray_call__.remote(break_data_connections))  # as a middlebox's reset would
    try:
        compiled.execute(2).get(timeout=60)
        lost = None
    except Exception as exc:  # noqa: BLE001 - reported, the test says what was expected
        lost = f"{type(exc).__name__}: {exc}"
    report("lost_output", error=lost)
    compiled.teardown()

    compiled = cgraph.compile(dag)
    compiled.execute(1).get(timeout=60)
    ray.kill(d)
    start, error = time.monotonic(), None
    while error is None and time.monotonic() - start < 60:
        try:
            compiled.execute(2).get(timeout=60)
        except Exception as exc:  # noqa: BLE001 - reported, the test says what was expected
            error = f"{type(exc).__name__}: {exc}"
    report("death_at_output", error=error, seconds=time.monotonic() - start)
    compiled.teardown()


def patient_flaky_gloo(host: str, port: int):
    """A user communicator over gloo whose own timeout (600 s) outlasts every wait here, and
    whose rank 0 raises in the allreduce of 2's tensors: its peer on the other node, inside
    that allreduce, can learn of the fault from cgraph alone."""
    from datetime import timedelta

    from tests.ray.test_transport_custom import GlooCommunicator

    class PatientFlakyGloo(GlooCommunicator):
        def initialize(self, rank: int, world_size: int, group_name: str) -> None:
            from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

            client = TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=30))
            self.pg = ProcessGroupGloo(PrefixStore(group_name + "/", client), rank, world_size,
                                       timedelta(seconds=600))
            self._rank, self._size = rank, world_size

        def allreduce(self, tensor, op="sum") -> None:
            if self.rank == 0 and float(tensor.sum()) == 8.0:
                raise ValueError("flaky allreduce")
            super().allreduce(tensor, op)

    return PatientFlakyGloo(host, port)


def check_a_group_fault_reaches_every_node(on_head, on_two) -> None:
    """A user communicator raises on the head node's rank while the rank on node2 waits
    inside the allreduce: the group fails on node2 too, at once, never at the
    communicator's own timeout (600 s), and the actors stay usable."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from cgraph.collective import allreduce

    a, b = on_head.remote("fa"), on_two.remote("fb")
    host = ray.util.get_node_ip_address()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    with InputNode() as inp:
        ra, rb = allreduce.bind([a.tensor.bind(inp), b.tensor.bind(inp)])
        dag = MultiOutputNode([b.total.bind(rb), a.total.bind(ra)])  # node2's output first
    compiled = cgraph.compile(dag, default_communicator=patient_flaky_gloo(host, store.port))
    outcomes = {"first": compiled.execute(1).get(timeout=60)}
    for i in (2, 3):  # 2: the fault; 3: the failed group's next execution
        start = time.monotonic()
        try:
            outcomes[str(i)] = repr(compiled.execute(i).get(timeout=60))
        except Exception as exc:  # noqa: BLE001 - reported, the test says what was expected
            outcomes[str(i)] = f"{type(exc).__name__}: {exc}"
        outcomes[f"seconds{i}"] = round(time.monotonic() - start, 2)
    compiled.teardown()
    report("group_fault_across_nodes", **outcomes,
           free=ray.get([a.inc.remote(1), b.inc.remote(1)], timeout=60))
    for actor in (a, b):
        ray.kill(actor)
    del store


def check_node_death(cluster) -> None:
    """A third node, removed (its raylet and every process on it killed) while its actor
    works on an execution: the waiter gets a NodeDiedError naming that node, the graph's
    segments and sockets are freed before any teardown, and the survivors run a new graph."""
    node3 = cluster.add_node(num_cpus=1, resources={"node3": 10})
    a, c = (Node.options(resources={"head": 1}).remote(n) for n in "ac")
    d = Node.options(resources={"node3": 1}).remote("d")
    lost = ray.get(d.where.remote(), timeout=120)
    with InputNode() as inp:
        dag = MultiOutputNode([c.inc.bind(d.nap.bind(a.inc.bind(inp), 3.0)), a.inc.bind(inp)])
    compiled = cgraph.compile(dag)
    first = compiled.execute(1).get(timeout=60)
    ref = compiled.execute(2)
    time.sleep(1.0)  # d is in its nap
    start = time.monotonic()
    cluster.remove_node(node3, allow_graceful=False)
    try:
        ref.get(timeout=60)
        error, types = None, []
    except Exception as exc:  # noqa: BLE001 - reported, the test says what was expected
        error = f"{type(exc).__name__}: {exc}"
        types = [name for name, cls in (("cgraph.NodeDiedError", cgraph.NodeDiedError),
                                        ("cgraph.ActorDiedError", cgraph.ActorDiedError),
                                        ("ray.NodeDiedError", ray.exceptions.NodeDiedError),
                                        ("ray.ActorDiedError", ray.exceptions.ActorDiedError))
                 if isinstance(exc, cls)]
        node = getattr(exc, "node", None)
    seconds = round(time.monotonic() - start, 2)
    left = segments_of(compiled)
    while left and time.monotonic() - start < 30:  # freed once the survivors' loops ended
        time.sleep(0.05)
        left = segments_of(compiled)
    freed_after = round(time.monotonic() - start, 2)
    with InputNode() as inp:
        again = cgraph.compile(c.inc.bind(a.inc.bind(inp)))
    survivors = again.execute(1).get(timeout=60)
    again.teardown()
    compiled.teardown()
    report("node_death", first=first, error=error, types=types, node=node if error else None, lost=lost,
           seconds=seconds, left=left, freed_after=freed_after, survivors=survivors)
    for actor in (a, c):
        ray.kill(actor)


def main() -> None:
    certificates = give_this_cluster_certificates()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"head": 10}, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"node2": 10})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        run_checks()
        check_a_killed_driver(cluster.address)
        check_node_death(cluster)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(certificates, ignore_errors=True)  # a private key: never left in /tmp


KILLED_DRIVER = """
import json, os, sys, ray, cgraph
from ray.dag import InputNode
from tests.ray.multinode_script import Node
ray.init(address=sys.argv[1], log_to_driver=False)
a = Node.options(resources={"head": 1}).remote("a")
b, c = (Node.options(resources={"node2": 1}).remote(n) for n in "bc")
with InputNode() as inp:  # driver -> b, b -> c on node2 (shm made there), c -> a, a -> driver (shm)
    dag = a.inc.bind(c.inc.bind(b.inc.bind(inp)))
compiled = cgraph.compile(dag)
assert compiled.execute(1).get(timeout=60) == 4
made = sorted(e for e in os.listdir("/dev/shm") if compiled._tag in e)
print(json.dumps({"pid": os.getpid(), "tag": compiled._tag, "segments": made}), flush=True)
sys.stdin.read()  # until it is killed
"""


def check_a_killed_driver(address: str) -> None:
    """A driver killed (-9) without teardown, its graph's segments on both nodes: every one
    is gone within seconds (each creator's reaper), not at the next compile there."""
    import signal
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, address], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=root, env=env)
    try:
        assert proc.stdout is not None
        made = json.loads(proc.stdout.readline() or "{}")
        tag = made.get("tag", "?")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        start = time.monotonic()
        left = sorted(e for e in os.listdir("/dev/shm") if tag in e)
        while left and time.monotonic() - start < 30:
            time.sleep(0.05)
            left = sorted(e for e in os.listdir("/dev/shm") if tag in e)
        creators = sorted({name.split("_")[1] for name in made.get("segments", [])})
        report("killed_driver", made=made.get("segments", []), creators=creators,
               driver=str(made.get("pid")), left=left, seconds=round(time.monotonic() - start, 2))
    finally:
        proc.kill()


def run_checks() -> None:
    on_head = Node.options(resources={"head": 1})
    on_two = Node.options(resources={"node2": 1})
    a, b, c = on_head.remote("a"), on_two.remote("b"), on_two.remote("c")
    nodes = ray.get([a.where.remote(), b.where.remote(), c.where.remote()])
    report("placement", head=nodes[0], b=nodes[1], c=nodes[2])

    # driver -> b (node2) -> a (head) -> driver, and b -> c on node2
    with InputNode() as inp:
        dag = a.inc.bind(b.inc.bind(inp))
    plan = cgraph.plan(dag)  # no locations: the planner sees one node
    compiled = cgraph.compile(dag)
    kinds = sorted({spec.kind.name for spec in compiled.planned.plan.channels})
    got = [compiled.execute(i).get(timeout=60) for i in range(200)]
    report("chain", kinds=kinds, ok=got == [i + 2 for i in range(200)], planned=str(plan.plan),
           channels=str(compiled.planned.plan).splitlines())
    compiled.teardown()

    with InputNode() as inp:
        x = b.scale.bind(inp, 3)
        dag = MultiOutputNode([c.scale.bind(x, 2), a.scale.bind(x, 1)])
    compiled = cgraph.compile(dag, max_inflight_executions=4)
    arr = np.arange(1 << 20, dtype=np.float64)  # 8 MiB through every socket
    refs = [compiled.execute(arr + i) for i in range(4)]
    outs = [r.get(timeout=120) for r in reversed(refs)][::-1]
    ok = all(np.array_equal(o[0], (arr + i) * 6) and np.array_equal(o[1], (arr + i) * 3)
             for i, o in enumerate(outs))
    report("arrays", ok=bool(ok), writable=bool(outs[0][0].flags.writeable))
    compiled.teardown()

    with InputNode() as inp:  # b's array read by the driver and by a: it lands in a relay on the head
        x = b.scale.bind(inp, 1)
        dag = MultiOutputNode([x, a.scale.bind(x, 2)])
    compiled = cgraph.compile(dag, max_inflight_executions=4)
    refs = [compiled.execute(arr + i) for i in range(4)]
    outs = [r.get(timeout=120) for r in reversed(refs)][::-1]  # three wait buffered, then more run
    later = [compiled.execute(arr - i).get(timeout=120) for i in range(1, 5)]
    report("relay_to_driver", kinds=sorted(s.kind.name for s in compiled.planned.plan.channels),
           ok=bool(all(np.array_equal(o[0], arr + i) and np.array_equal(o[1], (arr + i) * 2)
                       for i, o in enumerate(outs))),
           later=bool(all(np.array_equal(o[0], arr - i) for i, o in enumerate(later, 1))))
    compiled.teardown()

    check_shared_memory_on_node2(a, b, c)
    check_tls(a, b, c)

    with InputNode() as inp:
        dag = a.inc.bind(c.fail_on.bind(b.inc.bind(inp), bad=5))
    compiled = cgraph.compile(dag)
    first = compiled.execute(1).get(timeout=60)
    try:
        compiled.execute(4).get(timeout=60)
        error = None
    except ValueError as exc:
        error = (type(exc).__name__, isinstance(exc, cgraph.TaskError), "c refuses 5" in str(exc))
    after = compiled.execute(7).get(timeout=60)
    compiled.teardown()
    report("errors", first=first, error=error, after=after,
           usable=ray.get([b.inc.remote(1), c.inc.remote(1)], timeout=60))

    with InputNode() as inp:  # the CPU communicator's links live in the driver's shm
        dag = c.inc.bind(b.inc.bind(inp).with_tensor_transport("nccl"))
    try:
        cgraph.compile(dag, default_communicator="cpu")
        refused = None
    except cgraph.TransportError as exc:
        refused = str(exc)
    report("cpu_communicator_off_node", refused=refused,
           free=ray.get([b.inc.remote(1), c.inc.remote(1)], timeout=60))

    with InputNode() as inp:  # the input goes out on two channels: shm on the head, a socket to node2
        dag = MultiOutputNode([a.inc.bind(inp), b.inc.bind(inp)])
    compiled = cgraph.compile(dag, max_inflight_executions=2)
    refs = [compiled.execute(i) for i in range(2)]
    got = [r.get(timeout=60) for r in refs] + [compiled.execute(i).get(timeout=60) for i in range(2, 50)]
    report("input_on_two_nodes", ok=got == [[i + 1, i + 1] for i in range(50)],
           kinds=sorted(s.kind.name for s in compiled.planned.plan.channels if s.node == "n0"))
    compiled.teardown()
    check_gloo_across_nodes(a, b, c)
    check_where_across_nodes(a, b)
    check_collectives_across_nodes(on_head, on_two)
    check_a_pair_first(on_head, on_two)
    check_a_group_fault_reaches_every_node(on_head, on_two)
    check_death_at_the_output(on_two)

    with InputNode() as inp:
        dag = a.inc.bind(c.inc.bind(b.inc.bind(inp)))
    compiled = cgraph.compile(dag)
    compiled.execute(1).get(timeout=60)
    ray.kill(c)  # returns at once; c dies soon after
    start, died = time.monotonic(), None
    while died is None and time.monotonic() - start < 60:
        try:
            compiled.execute(2).get(timeout=60)
        except cgraph.ActorDiedError as exc:
            died = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported, the test says what was expected
            died = f"wrong type {type(exc).__name__}: {exc}"
    report("death", error=died, seconds=time.monotonic() - start)
    compiled.teardown()
    report("teardown", survivors=ray.get([a.inc.remote(1), b.inc.remote(1)], timeout=60),
           segments=segments_of(compiled))


ALGORITHMS = ("star", "chain", "tree", "butterfly", "ring", "reduction_server", "shared")
SIZES = (0, 1, 7, 1 << 19)  # elements: 2 MiB of float32 at the end
GATHER_SCATTER = ("ring", "hierarchical", "auto")


def rank_input(rank: int, size: int) -> np.ndarray:
    return np.random.default_rng(rank * 7919 + size).standard_normal(size).astype(np.float32)


def every_collective(name: str, world: int, rank: int, backend: str) -> dict:
    """On one rank: every algorithm, op, size and tensor kind, checked against numpy here."""
    import torch

    import cgraph.collective as col

    col.init_collective_group(world, rank, backend, name, timeout_s=20)
    wrong, calls = [], 0
    for size in SIZES:
        every = np.stack([rank_input(r, size) for r in range(world)])
        for op in ("sum", "max"):
            want = every.sum(0) if op == "sum" else every.max(0)
            for algorithm in (*ALGORITHMS, "auto"):
                for kind in ("numpy", "torch"):
                    x = rank_input(rank, size)
                    col.allreduce(torch.from_numpy(x) if kind == "torch" else x, name, op=op, algorithm=algorithm)
                    calls += 1
                    if not np.allclose(x, want, rtol=1e-5, atol=1e-4):
                        wrong.append(f"allreduce {algorithm} {op} {size} {kind}")
        for algorithm in GATHER_SCATTER:
            if size % world == 0:  # reducescatter: rank r gets the sum of every rank's chunk r
                out = torch.zeros(size // world)
                col.reducescatter(out, list(torch.from_numpy(every[rank]).chunk(world)), name,
                                  algorithm=algorithm)
                calls += 1
                if not np.allclose(out.numpy(), every.reshape(world, world, -1)[:, rank].sum(0), atol=1e-4):
                    wrong.append(f"reducescatter {algorithm} {size}")
                chunk = np.zeros(size // world, dtype=np.float32)  # numpy in, MAX
                col.reducescatter(chunk, [np.ascontiguousarray(c) for c in np.split(every[rank], world)],
                                  name, op="max", algorithm=algorithm)
                calls += 1
                if not np.array_equal(chunk, every.reshape(world, world, -1)[:, rank].max(0)):
                    wrong.append(f"reducescatter max numpy {algorithm} {size}")
            for kind in ("torch", "numpy"):
                parts = [np.zeros(size, dtype=np.float32) for _ in range(world)]
                mine = rank_input(rank, size)
                if kind == "torch":
                    parts, mine = [torch.from_numpy(p) for p in parts], torch.from_numpy(mine)
                col.allgather(parts, mine, name, algorithm=algorithm)
                calls += 1
                if not all(np.array_equal(np.asarray(p), every[r]) for r, p in enumerate(parts)):
                    wrong.append(f"allgather {algorithm} {size} {kind}")
    big = 1 << 22  # 16 MiB of float32: "shared" reads its peers' tensors where the kernel lets it
    every = np.stack([rank_input(r, big) for r in range(world)])
    for kind in ("numpy", "torch"):
        x = rank_input(rank, big)
        col.allreduce(torch.from_numpy(x) if kind == "torch" else x, name, algorithm="shared")
        calls += 1
        if not np.allclose(x, every.sum(0), rtol=1e-5, atol=1e-3):
            wrong.append(f"allreduce shared sum {big} {kind}")
    return {"rank": rank, "node": ray.get_runtime_context().get_node_id(), "calls": calls, "wrong": wrong,
            "peer_reads": _peer_reads(name) if backend == "cpu" else None}


def _peer_reads(name: str) -> bool | None:
    """Whether this rank's node settled on reading its peers' tensors (``comm.peer_memory``)."""
    from cgraph.collective import groups

    return groups.lookup(name).comm._mesh.settled.transport.arena.peer_reads


def allreduce_after_a_death(name: str) -> str:
    import torch

    import cgraph.collective as col

    start = time.monotonic()
    try:
        col.allreduce(torch.ones(1 << 16), name, algorithm="reduction_server")
        return "no error"
    except Exception as exc:  # noqa: BLE001 - its type and timing are the result
        return f"{type(exc).__name__} after {time.monotonic() - start:.1f}s: {exc}"


def check_collectives_across_nodes(on_head, on_two) -> None:
    """A gloo group and a cpu group (shared memory within a node, gloo between) of 2 actors
    per node: every algorithm against numpy, then a death on the other node."""
    for backend in ("gloo", "cpu"):
        members = [on_head.remote("r0"), on_head.remote("r1"), on_two.remote("r2"), on_two.remote("r3")]
        name, world = f"xnode-{backend}", len(members)
        got = ray.get([m.run.remote(every_collective, name, world, r, backend)
                       for r, m in enumerate(members)], timeout=180)
        ray.kill(members[3])
        survivors = ray.get([m.run.remote(allreduce_after_a_death, name) for m in members[:3]], timeout=90)
        report(f"collectives_across_nodes_{backend}", got=got, after_death=survivors)
        pids = ray.get([m.pid.remote() for m in members[:3]], timeout=60)
        for m in members[:3]:
            ray.kill(m)
        wait_gone(pids)  # the next compile frees a dead leader's segments; ray.kill returns at once


def pair_step(name: str, rank: int, step: str):
    """One step of ``check_a_pair_first`` on one rank of a 4-rank "cpu" group."""
    import cgraph.collective as col

    if step == "init":
        col.init_collective_group(4, rank, "cpu", name, timeout_s=20)
    elif step == "send":
        col.send(np.arange(6, dtype=np.float32) * (rank + 1), 3, name)
    elif step == "recv":
        got = np.zeros(6, dtype=np.float32)
        col.recv(got, 1, name)
        return got.tolist()
    elif step == "allreduce":
        mine = np.full(4, rank + 1.0, dtype=np.float32)
        col.allreduce(mine, name)
        return mine.tolist()
    else:
        col.destroy_collective_group(name)
    return step


def check_a_pair_first(on_head, on_two) -> None:
    """A "cpu" group's first call is a send from rank 1 (head node) to rank 3 (node 2) while
    ranks 0 and 2 stay idle, as after torch's init_process_group; then all four allreduce,
    destroy, and the group's segments are gone."""
    members = [on_head.remote("p0"), on_head.remote("p1"), on_two.remote("p2"), on_two.remote("p3")]
    name = "pairfirst"
    ray.get([m.run.remote(pair_step, name, r, "init") for r, m in enumerate(members)], timeout=60)
    sent = members[1].run.remote(pair_step, name, 1, "send")
    got = ray.get(members[3].run.remote(pair_step, name, 3, "recv"), timeout=60)
    sent = ray.get(sent, timeout=60)
    summed = ray.get([m.run.remote(pair_step, name, r, "allreduce") for r, m in enumerate(members)], timeout=60)
    ray.get([m.run.remote(pair_step, name, r, "destroy") for r, m in enumerate(members)], timeout=60)
    left = sorted(n for n in os.listdir("/dev/shm") if f"col.{name}." in n)
    report("pair_first", got=got, sent=sent, summed=summed, left=left)
    pids = ray.get([m.pid.remote() for m in members], timeout=60)
    for m in members:
        ray.kill(m)
    wait_gone(pids)


def wait_gone(pids: list[int], limit_s: float = 30.0) -> None:
    """Until none of ``pids`` is a live process (loopback "nodes": one machine's pids)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        time.sleep(0.1)


def check_gloo_across_nodes(a, b, c) -> None:
    """CPU actors on two nodes with communicator edges and a collective: gloo carries them."""
    from cgraph.collective import allreduce

    with InputNode() as inp:
        x = b.tensor.bind(inp).with_tensor_transport("nccl")  # node2 -> head
        y = a.twice.bind(x).with_tensor_transport("nccl")  # head -> node2
        ra, rc = allreduce.bind([a.tensor.bind(inp), c.tensor.bind(inp)],  # head + node2
                                algorithm="reduction_server")  # its teams follow the two nodes
        dag = MultiOutputNode([c.total.bind(y), a.total.bind(ra), c.total.bind(rc)])
    got = {}
    for overlap in (False, True):
        compiled = cgraph.compile(dag, default_communicator="gloo", overlap_gpu_communication=overlap)
        got[str(overlap)] = [compiled.execute(i).get(timeout=60) for i in range(5)]
        compiled.teardown()
    report("gloo_across_nodes", got=got, expected=[[8.0 * i, 8.0 * i, 8.0 * i] for i in range(5)],
           free=ray.get([a.inc.remote(1), b.inc.remote(1), c.inc.remote(1)], timeout=60))


def check_shared_memory_on_node2(a, b, c) -> None:
    """b -> c on node2 share memory made there; a value of a read by b and c crosses once."""
    with InputNode() as inp:
        dag = c.zero_copy.bind(b.make.bind(inp))
    compiled = cgraph.compile(dag)
    made_by = {spec.id: spec.kind.name for spec in compiled.planned.plan.channels}
    got = [compiled.execute(n).get(timeout=60) for n in (10, 1 << 20, 10)]  # 8 MiB grows the slot
    pids = ray.get([b.pid.remote(), c.pid.remote()])
    segments = segments_of(compiled)
    compiled.teardown()
    report("node_shm", kinds=made_by, got=got,
           want=[[True, float(sum(range(n)))] for n in (10, 1 << 20, 10)],
           made_on_node2=bool(segments) and all(n.split("_")[1] in map(str, pids) for n in segments),
           left=segments_of(compiled))

    with InputNode() as inp:
        x = a.make.bind(inp)
        dag = MultiOutputNode([b.zero_copy.bind(x), c.zero_copy.bind(x)])
    compiled = cgraph.compile(dag, max_inflight_executions=2)
    channels = [str(spec) for spec in compiled.planned.plan.channels if spec.kind.name == "CROSS_NODE"]
    refs = [compiled.execute(n) for n in (1000, 1 << 18)]
    got = [ref.get(timeout=60) for ref in refs] + [compiled.execute(7).get(timeout=60)]
    compiled.teardown()
    report("relay", channels=channels, got=got,
           want=[[[True, float(sum(range(n)))]] * 2 for n in (1000, 1 << 18, 7)],
           left=segments_of(compiled))


def check_tls(a, b, c) -> None:
    """The same graph shapes with tls=True: every socket encrypted, values unchanged."""
    with InputNode() as inp:
        x = b.make.bind(inp)
        dag = MultiOutputNode([a.zero_copy.bind(x), c.zero_copy.bind(x), b.inc.bind(inp)])
    compiled = cgraph.compile(dag, tls=True)
    sockets = [r.channel.handle for r in compiled._ep.resources
               if type(getattr(r, "channel", None)).__name__ == "SocketChannel"]
    got = [compiled.execute(n).get(timeout=60) for n in (5, 1 << 20)]
    compiled.teardown()
    report("tls", sockets=len(sockets), all_tls=all(h.tls for h in sockets), got=got,
           want=[[[False, float(sum(range(n)))], [True, float(sum(range(n)))], n + 1]
                 for n in (5, 1 << 20)])


if __name__ == "__main__":
    sys.exit(main())
