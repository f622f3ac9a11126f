"""The fault soak across nodes (``fault_soak.py --nodes N``): a cluster of loopback nodes,
actors placed on them, and the faults only several nodes have.

    Nodes(n)             head "node0" and worker nodes "node1".., each a custom resource;
                         remove(k) kills one (raylet and every process on it), restore()
                         adds back what was removed, before the next trial
    place(rng, n, nodes) the node of each of n actors: some on the head, some off it
    FlakyGloo            a user communicator over torch's gloo that raises in the send of
                         one value (the comm_raises fault)
    Stranger(compiled)   connects to every listening socket of the graph (the driver's
                         control server, each reader's data listener) and sends garbage,
                         forged lines and a huge frame, without the graph's secret

Loopback nodes are processes of this one machine: one kernel, one /dev/shm, no wire.
A removed node's processes die at once and its ports refuse at once, where a real
node's loss may leave connections silent until keepalive gives up; a real network
also has latency and a bandwidth far below loopback's.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import threading
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from soak_dag import digest

from cgraph.comm.communicator import Communicator


class Nodes:
    """A ``ray.cluster_utils.Cluster``: the head (``node0``) and ``n - 1`` worker nodes."""

    def __init__(self, n: int, head_cpus: int = 8) -> None:
        from ray.cluster_utils import Cluster

        self.n = n
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": head_cpus, "resources": {"node0": 100}, "include_dashboard": False})
        self.workers: dict[int, Any] = {}
        self.restore()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def remove(self, k: int, pids: Iterable[int] = ()) -> None:
        """Kill worker node ``k``: its raylet and every process on it, no grace, as a machine
        that dies. ``pids``: its actors' processes, killed with it (a worker whose raylet was
        killed exits only once it notices, seconds later on a loaded machine)."""
        self.cluster.remove_node(self.workers.pop(k), allow_graceful=False)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def restore(self) -> None:
        """Add back every worker node that is missing (a removed one, a fresh one)."""
        missing = [k for k in range(1, self.n) if k not in self.workers]
        for k in missing:
            self.workers[k] = self.cluster.add_node(num_cpus=2, resources={f"node{k}": 100})
        if missing:
            self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        self.cluster.shutdown()


def place(rng: random.Random, n_actors: int, n_nodes: int) -> list[int]:
    """Each actor's node: at random, with one on the head and one off it (n >= 2)."""
    where = [rng.randrange(n_nodes) for _ in range(n_actors)]
    if n_actors >= 2:
        where[0], where[1] = 0, rng.randrange(1, n_nodes)
        rng.shuffle(where)
    return where


class FlakyGloo(Communicator):
    """A user communicator over torch's ``ProcessGroupGloo`` (its store: a ``TCPStore`` on
    the driver), whose ``send`` raises for the tensor whose ``digest`` is ``poison``: the
    fault of one execution on one member, which the group's other members must hear of."""

    def __init__(self, host: str, port: int, poison: int) -> None:
        self.host, self.port, self.poison = host, port, poison
        self.pg: Any = None
        self.aborted = False

    def initialize(self, rank: int, world_size: int, group_name: str) -> None:
        from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

        client = TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=60))
        self.pg = ProcessGroupGloo(PrefixStore(group_name + "/", client), rank, world_size,
                                   timedelta(seconds=120))
        self._rank, self._size = rank, world_size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def send(self, tensor: Any, dst: int) -> None:
        if digest(tensor) == self.poison:
            raise ValueError(f"soak: flaky send of {self.poison} to rank {dst}")
        self._wait(self.pg.send([tensor.contiguous()], dst, 0))

    def recv(self, tensor: Any, src: int) -> None:
        self._wait(self.pg.recv([tensor], src, 0))

    def abort(self) -> None:
        self.aborted = True  # gloo's own abort does not wake a pending recv: _wait watches this

    def _wait(self, work: Any) -> None:
        import cgraph

        done, failed = threading.Event(), []

        def wait() -> None:
            try:
                work.wait()
            except Exception as exc:  # noqa: BLE001 - raised below, in the caller's thread
                failed.append(exc)
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        while not done.wait(0.05):
            if self.aborted:
                raise cgraph.ChannelClosedError("FlakyGloo aborted")
        if failed:
            raise failed[0]


class Stranger:
    """A party without the graph's secret at every door of one graph: each listening
    socket its channels use on this machine. Aims at nothing else."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.doors: list[tuple[str, int]] = []
        self.sent = 0

    def find_doors(self) -> list[tuple[str, int]]:
        """The driver's control servers that hold this graph's channels, and the data
        listeners their readers announced."""
        from cgraph.channels import socket_control

        doors: set[tuple[str, int]] = set()
        for server in list(socket_control._shared.values()):
            with server._lock:
                entries = [e for name, e in server._channels.items() if self.tag in name]
            if entries:
                doors.add(server.address)
            for entry in entries:
                if entry.addr:
                    host, port = entry.addr.split()
                    doors.add((host, int(port)))
        return sorted(doors)

    def attack(self) -> None:
        self.doors = self.find_doors()
        for door in self.doors:
            for payload in (os.urandom(64), b"CLOSE\n", b"LISTEN 127.0.0.1 1\n",
                            (1 << 40).to_bytes(8, "little") + secrets.token_bytes(16)):
                try:
                    with socket.create_connection(door, timeout=2.0) as sock:
                        sock.settimeout(2.0)
                        sock.sendall(payload)
                        self.sent += 1
                        try:
                            sock.recv(256)  # a challenge or the door shut: nothing to answer with
                        except OSError:
                            pass
                except OSError:
                    pass  # the door shut (a writer got in first): what it should do
