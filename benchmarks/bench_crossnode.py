"""Cross-node benchmark: cgraph next to Ray Compiled Graphs on a multi-node Ray cluster.

One run starts a 2-node Ray cluster on this machine (``ray.cluster_utils.Cluster``:
a head node with custom resource ``head``, a worker node with ``node2``; the driver
runs on the head node), places actors by those resources, and measures both
systems on the same layouts, one after the other, on fresh actors per (layout,
system):

    handshake   one loopback TCP connection with and without cgraph's
                authentication handshake (no cluster needed): its cost per connection
    echo        driver -> A.echo -> driver, the int 1: A on node2 (across nodes) and
                A on head (reference); median / p99 of many executions
    hops        driver -> A.produce -(array)-> B.consume -(2 ints)-> driver, with
                preallocated uint8 arrays of 1 / 16 / 64 MiB (same values for both
                systems): A head -> B node2 (across nodes), A and B on node2 (within
                a worker node) and A and B on head (within the driver's node);
                median execution time, and throughput = array bytes / median
    tls         cgraph only, compile(tls=False) next to compile(tls=True) on the same
                placements: the echo across nodes (median / p99) and the hop across
                nodes at 16 / 64 MiB (median, GB/s); warm compile and first execute,
                which hold the TLS handshakes of the graph's connections; certificates
                of a throwaway test CA (``trustme``) reach the driver and only the TLS
                rows' actors

Every layout is compiled several times (compile, first execute, teardown: the
compile table), the last compile is the one measured. A system that fails or is
refused in a layout gets the error as that row's result; the run goes on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_crossnode.py        # ~2-4 min, results/
    .venv/bin/python benchmarks/bench_crossnode.py --quick                  # ~20-40 s, a temp folder
    .venv/bin/python benchmarks/bench_crossnode.py --sections echo --out /tmp/x

All "nodes" here are processes of one machine: they share one kernel, one
/dev/shm, two CPU cores and the loopback interface, so cross-node numbers measure
the systems' software overhead, not a network (see NOTES in the results).
"""

from __future__ import annotations

import gc
import mmap
import os
import re
import select
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402 - needs the path above
    call_with_timeout,
    configure_environment,
    describe_error,
    fmt,
    fmt_ratio,
    gb_per_s,
    load_average,
    log,
    markdown_table,
    new_results,
    parse_args,
    percentile,
    run_section,
    summarize_ns,
    system_busy_percent,
    time_calls,
    verdict,
    write_results,
)

MiB = 1 << 20
# The buffer size must be in the environment before Ray is imported, so the sizes
# (smaller with --quick) are settled from the command line before parse_args runs.
QUICK_FLAG = "--quick" in sys.argv[1:]
SIZES = (1 * MiB, 16 * MiB) if QUICK_FLAG else (1 * MiB, 16 * MiB, 64 * MiB)
TLS_SIZES = tuple(size for size in SIZES if size >= 16 * MiB)  # the tls section's hop arrays
TINY = 8  # bytes: the array of the compile cycles' first execute and of the baseline row
# Every channel of the hop graphs gets one buffer above the largest array (pickle
# adds a few hundred bytes), for both systems: no resize during a measurement.
HOP_BUFFER = max(SIZES) + max(SIZES) // 4
ECHO_BUFFER = 1 * MiB  # Ray's default
HOP_INFLIGHT = 2  # executions run one at a time; Ray CG allocates this many buffers per channel
ECHO_INFLIGHT = 10  # Ray's default

# Ray reads RAY_CGRAPH_* when ray.dag is imported; the nodes' raylets and so the actors
# inherit them from this process. buffer_size_bytes above the largest array: Ray CG's
# channel to another node is one unbuffered object per node, sized at compile.
# teardown_timeout: teardown(kill_actors=True) kills an actor whose loop has not
# stopped after this many seconds instead of waiting.
ENV = configure_environment({
    "RAY_CGRAPH_get_timeout": "300",
    "RAY_CGRAPH_submit_timeout": "300",
    "RAY_CGRAPH_buffer_size_bytes": str(HOP_BUFFER),
    "RAY_CGRAPH_teardown_timeout": "5",
})

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.dag import InputNode  # noqa: E402

SECTIONS = ("handshake", "echo", "hops", "tls")
SYSTEMS = ("cgraph", "ray_cgraph")
RAW = "raw_tcp"  # the hops' physical reference: a plain TCP stream between the same two actors
ECHO_TARGET = 0.32  # cgraph's cross-node echo median at most this times Ray CG's
RAW_TARGET = 0.70  # cgraph's cross-node GB/s at 16 and 64 MiB at least this share of raw TCP's
RAW_REPEAT = 3  # raw TCP rounds per round of the others, each on fresh actors
TLS_SYSTEMS = ("cgraph", "cgraph+tls")
LABELS = {"cgraph": "cgraph", "ray_cgraph": "Ray Compiled Graphs", "cgraph+tls": "cgraph + TLS",
          RAW: "raw TCP (reference)"}
# compile(tls=...) per cgraph system: explicit, so CGRAPH_TLS / RAY_USE_TLS in the
# environment cannot turn TLS on for the plain rows
CGRAPH_TLS = {"cgraph": False, "cgraph+tls": True}
TLS_LAYOUTS = ("echo_cross", "hop_cross")
TLS_ENV_NAMES = ("CGRAPH_TLS_CERT", "CGRAPH_TLS_KEY", "CGRAPH_TLS_CA")
NODE_CPUS = 2
OBJECT_STORE_BYTES = 3 << 30  # per node; Ray CG's hop graphs take ~0.5 GiB each
STEP_TIMEOUT_S = 180.0  # actor start or a compile that takes longer fails
EXECUTE_TIMEOUT_S = 60.0  # a first execute (actors warm, torch imported) that takes longer fails
TEARDOWN_TIMEOUT_S = 60.0

NOTES = [
    "**Loopback nodes are not real nodes.** Both Ray nodes are processes of one machine "
    "(`ray.cluster_utils.Cluster`): they share one kernel, one /dev/shm, the same 2 CPU "
    "cores and the loopback interface. There is no NIC and no wire latency, and bandwidth "
    "is memory copies through the kernel's socket buffers; every process of both nodes "
    "competes for the same two cores. Cross-node numbers therefore measure each system's "
    "software overhead on the cross-node path (serialization, copies, system calls, RPCs, "
    "wake-ups), not a network. On real nodes add the wire: ~RTT per small hop and "
    "size / link bandwidth per array.",
    "**How Ray Compiled Graphs (Ray 2.60) move data between nodes**: a channel whose "
    "reader is on another node is a single unbuffered mutable object in the writer "
    "node's object store plus one reader object created (by one reader actor) in each "
    "reader node's object store (`shared_memory_channel.Channel`, also for "
    "`max_inflight_executions` > 1); the writer's core worker counts one extra local "
    "reader that forwards each written value to the remote node's raylet over gRPC "
    "(`PushMutableObject`, sent in chunks), which copies it into the local reader "
    "object, where the reader actor reads it as from shared memory. Channels within a "
    "node are `BufferedSharedMemoryChannel`s (`max_inflight_executions` buffers) in "
    "that node's object store.",
    "**cgraph's transports**: an edge between actors on different nodes is an `xnode` "
    "channel (TCP, loopback here); an edge within one node, the driver's or a worker node, is "
    "an `shm` channel in that node's shared memory (on a worker node made there by one of its "
    "actors). A value read on another node crosses once, into a relay that lands it in that "
    "node's shared memory for every reader there. The `cgraph channels` "
    "column gives the channel kinds of each compiled cgraph graph (from its plan), so the "
    "results say which transport was measured; `cgraph_source` in the JSON names the commit "
    "and any uncommitted changes to cgraph/ the run used.",
    "**Ray CG's buffer size**: in Ray 2.60 `experimental_compile(_buffer_size_bytes=...)` "
    "does not reach the channels (`CompositeChannel` makes its inner `Channel`s without a "
    "type, so they take `DAGContext.buffer_size_bytes` of the process that allocates them: "
    "the writer, i.e. RAY_CGRAPH_buffer_size_bytes unless set there). This benchmark sets "
    "RAY_CGRAPH_buffer_size_bytes above the largest array and, before each Ray CG compile, "
    "`DAGContext.buffer_size_bytes` per writer: the hop graphs' producer A gets the array "
    "buffer, the driver (it writes the input int) and every other writer 1 MiB. Here Ray "
    "did not free the driver's channel buffers after teardown and garbage collection (the "
    "actors' went when the actors were killed): with the driver's input channel at the array "
    "size, the head node's 3 GiB object store ran full within one round and Ray allocated "
    "from the filesystem instead (slow compiles). The notes below give how often the store "
    "ran full in this run.",
    "**The raw TCP reference** (`raw TCP (reference)` rows): the same two actors as each "
    "hop layout, fresh, with one plain TCP connection between them (no cgraph, no Ray, "
    "no framing): A sends its prepared array and B receives it into a buffer it reuses "
    "for that size, both as cgraph's channel does: non-blocking sockets, `TCP_NODELAY`, "
    "`send` / `recv_into` as far as the socket allows, then `poll` (a blocking `sendall` "
    "moved 1.7-2.2 GB/s at 64 MiB here, against 3.2-3.6 this way), into an anonymous "
    "mapping (into a numpy array from `np.empty` the same stream moved 1.4-1.65 GB/s at "
    "64 MiB, into a mapping 2.1-3.2, four pairs of fresh actors each). B sends one byte "
    "back, one value at a time, with the hop graphs' sizes, warm-up and counts. It is the "
    "floor a one-value-at-a-time hop pays on this machine (one copy into the kernel, one "
    "out), without the hop graph's two small driver hops. It runs 3 rounds (fresh actors "
    "each) per round of the others: on two vCPUs its throughput depends on whether the "
    "kernel runs sender and receiver on one core or on both, and a standalone run of the "
    "same code between two Ray actors moved between 1.45 and 4.29 GB/s at 64 MiB from one "
    "pair of fresh actors to the next. Read the round medians beside the pooled median.",
    "The hop layouts time the whole execution driver -> A -> B -> driver; only A -> B "
    "carries the array (A returns a preallocated array, B returns (nbytes, last byte)). "
    "The 8-byte row is the same graph with an 8-byte array: the layout's fixed cost "
    "(in the worker-node layout it includes two small cross-node hops, driver -> A and "
    "B -> driver, which the driver's-node layout does not have).",
]


@dataclass(frozen=True)
class Settings:
    rounds: int  # each (layout, system) this many times, on fresh actors
    sizes: tuple[int, ...]
    echo_iters: int
    echo_warmup: int
    hop_bytes: int  # per size, iterations = clamp(hop_bytes / size)
    hop_min_iters: int
    hop_max_iters: int
    hop_warmup: int
    tiny_iters: int
    compile_cycles: int
    handshake_iters: int

    def hop_iters(self, size: int) -> int:
        return max(self.hop_min_iters, min(self.hop_max_iters, self.hop_bytes // size))


FULL = Settings(3, SIZES, 2000, 200, 1 << 30, 10, 200, 3, 300, 4, 1000)
QUICK = Settings(1, SIZES, 200, 20, 128 * MiB, 5, 40, 2, 50, 3, 200)


# ================================================================== actors and layouts
@ray.remote(num_cpus=0)
class Node:
    """One actor of the benchmark graphs."""

    def where(self) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def import_torch(self) -> str:
        # Ray Compiled Graphs import torch lazily in the actor loop; on two cores that
        # first import can outlast the first execute's timeout, so pay it up front.
        import torch

        return str(torch.__version__)

    def prepare(self, sizes: list[int]) -> int:
        """Preallocate one uint8 array per size: all 7s, the last byte size % 251."""
        self.arrays = {}
        for size in sizes:
            arr = np.full(size, 7, dtype=np.uint8)
            arr[-1] = size % 251
            self.arrays[size] = arr
        return len(self.arrays)

    def set_ray_buffer_size(self, nbytes: int) -> int:
        """Ray CG's channel buffer size in this process (see ray_driver_buffer below)."""
        from ray.dag import DAGContext

        DAGContext.get_current().buffer_size_bytes = nbytes
        return nbytes

    def echo(self, x: Any) -> Any:
        return x

    def produce(self, size: int) -> Any:
        return self.arrays[size]

    def consume(self, arr: Any) -> tuple[int, int]:
        return (int(arr.nbytes), int(arr[-1]))

    # the raw TCP reference (RAW): no cgraph, no Ray on the data path
    def raw_listen(self) -> tuple[str, int]:
        self.listener = socket.create_server((ray.util.get_node_ip_address(), 0))
        return self.listener.getsockname()[:2]

    def raw_receive(self, plan: list[tuple[int, int]]) -> int:
        """Receive ``count`` values of ``size`` bytes per plan entry, each into one buffer
        reused for that size (as cgraph's receive buffers), one byte back after each."""
        conn, _ = self.listener.accept()
        self.listener.close()
        with conn:
            _raw_socket(conn)
            received = 0
            for size, count in plan:
                view = memoryview(mmap.mmap(-1, size + size // 4))[:size]  # as cgraph's buffers
                for _ in range(count):
                    _raw_recv_into(conn, view)
                    received += int(view[-1] == size % 251)
                    _raw_send(conn, memoryview(b"\x01"))
        return received

    def raw_send(self, addr: tuple[str, int], plan: list[tuple[int, int, int]]) -> dict[str, list[int]]:
        """Send each prepared array ``warmup + count`` times, one at a time: ns from the
        first byte sent to the receiver's byte back, per value after the warm-up."""
        out: dict[str, list[int]] = {}
        ack = memoryview(bytearray(1))
        with socket.create_connection(addr) as sock:
            _raw_socket(sock)
            for size, warmup, count in plan:
                view, samples = memoryview(self.arrays[size]), []
                for i in range(warmup + count):
                    start = time.perf_counter_ns()
                    _raw_send(sock, view)
                    _raw_recv_into(sock, ack)
                    if i >= warmup:
                        samples.append(time.perf_counter_ns() - start)
                out[str(size)] = samples
        return out


def _raw_socket(sock: socket.socket) -> None:
    """As cgraph's data sockets: no Nagle delay, non-blocking, waits in ``poll``."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)


def _raw_send(sock: socket.socket, view: memoryview) -> None:
    """Send ``view`` whole the way cgraph's writer does: as much as the socket takes, then
    ``poll`` for room (a blocking ``sendall`` moved 1.7-2.2 GB/s at 64 MiB here, against
    3.2-3.6 this way: the kernel wakes a blocked sender for every bit of room)."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    sent = 0
    while sent < view.nbytes:
        try:
            sent += sock.send(view[sent:])
        except BlockingIOError:
            poller.poll()


def _raw_recv_into(sock: socket.socket, view: memoryview) -> None:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    got = 0
    while got < view.nbytes:
        try:
            n = sock.recv_into(view[got:])
        except BlockingIOError:
            poller.poll()
            continue
        if not n:
            raise ConnectionError("the peer went away")
        got += n


@dataclass(frozen=True)
class Layout:
    name: str
    kind: str  # "echo" or "hop"
    nodes: tuple[str, ...]  # the resource naming each actor's node: "head" or "node2"
    picture: str
    role: str  # what the row is for


LAYOUTS = (
    Layout("echo_cross", "echo", ("node2",), "driver(head) -> A(node2).echo -> driver",
           "across nodes"),
    Layout("echo_head", "echo", ("head",), "driver(head) -> A(head).echo -> driver",
           "reference: actor on the driver's node"),
    Layout("hop_cross", "hop", ("head", "node2"),
           "driver -> A(head).produce -(array)-> B(node2).consume -> driver", "across nodes"),
    Layout("hop_worker", "hop", ("node2", "node2"),
           "driver -> A(node2).produce -(array)-> B(node2).consume -> driver", "within a worker node"),
    Layout("hop_head", "hop", ("head", "head"),
           "driver -> A(head).produce -(array)-> B(head).consume -> driver",
           "within the driver's node (reference)"),
)


def layouts_of(kind: str) -> list[Layout]:
    return [lay for lay in LAYOUTS if lay.kind == kind]


def expected(layout: Layout, x: int) -> Any:
    return x if layout.kind == "echo" else (x, x % 251)


def bind(layout: Layout, actors: list[Any], inp: Any) -> Any:
    if layout.kind == "echo":
        return actors[0].echo.bind(inp)
    return actors[1].consume.bind(actors[0].produce.bind(inp))


@contextmanager
def actor_group(layout: Layout, node_ids: dict[str, str], sizes: list[int],
                env: dict[str, str] | None = None) -> Iterator[tuple[list[Any], dict]]:
    """Fresh actors placed as ``layout`` says, torch imported, arrays prepared; killed on exit.
    ``env``: environment variables of these actors only (their runtime_env)."""
    extra = {"runtime_env": {"env_vars": env}} if env else {}
    actors = [Node.options(resources={node: 1}, **extra).remote() for node in layout.nodes]
    pids: list[int] = []
    try:
        where = ray.get([a.where.remote() for a in actors], timeout=STEP_TIMEOUT_S)
        pids = [pid for _, pid in where]
        OUR_PIDS.update(pids)
        placed = [node_id for node_id, _ in where]
        wanted = [node_ids[node] for node in layout.nodes]
        if placed != wanted:
            raise RuntimeError(f"actors placed on {placed}, wanted {wanted}")
        ray.get([a.import_torch.remote() for a in actors], timeout=STEP_TIMEOUT_S)
        if layout.kind == "hop":
            ray.get(actors[0].prepare.remote(sizes), timeout=STEP_TIMEOUT_S)
        yield actors, {"actor_nodes": list(layout.nodes), "actor_pids": pids}
    finally:
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        deadline = time.monotonic() + 15.0  # every "node" is this machine: wait for the processes
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.05)


# ================================================================== the two systems
@dataclass
class Runner:
    run: Callable[[Any], Any]
    teardown: Callable[[bool], Any]  # kill_actors -> None
    info: dict[str, Any]


def buffer_and_inflight(layout: Layout) -> tuple[int, int]:
    return (ECHO_BUFFER, ECHO_INFLIGHT) if layout.kind == "echo" else (HOP_BUFFER, HOP_INFLIGHT)


def ray_buffers(layout: Layout) -> list[int]:
    """Ray CG's buffer size per actor of ``layout``: what that actor writes needs (the
    producer of the hop graphs writes the array; every other writer an int or two)."""
    return [HOP_BUFFER if layout.kind == "hop" and i == 0 else ECHO_BUFFER for i in range(len(layout.nodes))]


@contextmanager
def ray_driver_buffer() -> Iterator[None]:
    """Ray CG's buffer size in the driver while it compiles: 1 MiB (it writes the input,
    an int); restored after.

    In Ray 2.60 ``experimental_compile(_buffer_size_bytes=...)`` does not reach the
    channels: ``CompositeChannel`` makes its inner ``Channel``s without a type, so they
    take ``DAGContext.buffer_size_bytes`` of the process that allocates them (the
    writer: the driver for the input channel, else the writing actor), i.e.
    RAY_CGRAPH_buffer_size_bytes. Each process gets its own size through
    ``DAGContext`` (Ray's documented way; the actors' by ``Node.set_ray_buffer_size``
    before their compiles). Besides not allocating 80 MiB buffers for ints, this keeps
    Ray's object store from filling: the buffers a process owns stay in the store
    until that process exits (the actors die after each round, the driver does not),
    and with the driver's input channel at 80 MiB x max_inflight_executions per
    compile, the head node's 3 GiB store ran full within one round of the hop layouts
    and Ray allocated from the filesystem instead.
    """
    from ray.dag import DAGContext

    ctx = DAGContext.get_current()
    before = ctx.buffer_size_bytes
    ctx.buffer_size_bytes = ECHO_BUFFER
    try:
        yield
    finally:
        ctx.buffer_size_bytes = before


def open_runner(system: str, layout: Layout, actors: list[Any]) -> Runner:
    buffer, inflight = buffer_and_inflight(layout)
    with InputNode() as inp:
        dag = bind(layout, actors, inp)
    if system == "ray_cgraph":
        with ray_driver_buffer():
            compiled = dag.experimental_compile(_buffer_size_bytes=buffer, _max_inflight_executions=inflight,
                                                _submit_timeout=300)
        return Runner(lambda x: ray.get(compiled.execute(x)),
                      lambda kill: compiled.teardown(kill_actors=kill), {})
    import cgraph

    compiled = cgraph.compile(dag, max_inflight_executions=inflight, buffer_size_bytes=buffer,
                              submit_timeout=300, get_timeout=300, tls=CGRAPH_TLS[system])
    return Runner(lambda x: compiled.execute(x).get(), lambda kill: compiled.teardown(kill_actors=kill),
                  {"channel_kinds": channel_kinds(compiled), "tls_channels": tls_channels(compiled)})


def channel_kinds(compiled: Any) -> dict[str, int] | str:
    """How many channels of each kind (shm, xnode, ...) the compiled graph uses."""
    try:
        return dict(Counter(spec.kind.value for spec in compiled.planned.plan.channels))
    except Exception as exc:  # noqa: BLE001 - cgraph's internals may move
        return f"unknown ({describe_error(exc)})"


def tls_channels(compiled: Any) -> str:
    """How many of the graph's socket channels run TLS, as the driver set them up."""
    try:
        handles = [res.channel.handle for res in compiled._ep.resources
                   if type(getattr(res, "channel", None)).__name__ == "SocketChannel"]
    except Exception as exc:  # noqa: BLE001 - cgraph's internals may move
        return f"unknown ({describe_error(exc)})"
    return f"{sum(bool(h.tls) for h in handles)} of {len(handles)}"


def checked_run(runner: Runner, x: int, want: Any, what: str) -> None:
    got = call_with_timeout(lambda: runner.run(x), EXECUTE_TIMEOUT_S, what)
    if (tuple(got) if isinstance(want, tuple) else got) != want:
        raise RuntimeError(f"{what} returned {got!r}, expected {want!r}")


def close(runner: Runner, kill: bool) -> float:
    start = time.perf_counter()
    call_with_timeout(lambda: runner.teardown(kill), TEARDOWN_TIMEOUT_S, "teardown")
    return time.perf_counter() - start


def measure_layout(system: str, layout: Layout, s: Settings, node_ids: dict[str, str],
                   sizes: tuple[int, ...], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One round: ``compile_cycles`` compiles on fresh actors (``env``: theirs only), the
    last one stays up and is timed (a hop graph with 8 B and each of ``sizes``). Raw samples
    (ns); any failure is the round's status, with whatever was measured before it."""
    out: dict[str, Any] = {"status": "ok"}
    compiles: dict[str, list[float]] = {"compile_s": [], "first_execute_s": [], "teardown_s": []}
    out["compile"] = compiles
    probe = 1 if layout.kind == "echo" else TINY
    step = "starting actors"
    try:
        with actor_group(layout, node_ids, [TINY, *sizes], env) as (actors, where):
            out.update(where)
            if system == "ray_cgraph":  # see ray_driver_buffer
                step = "setting Ray's buffer size in the actors"
                ray.get([a.set_ray_buffer_size.remote(n) for a, n in zip(actors, ray_buffers(layout), strict=True)],
                        timeout=STEP_TIMEOUT_S)
            runner = None
            try:
                for cycle in range(s.compile_cycles):
                    step = f"compile {cycle + 1}"
                    t0 = time.perf_counter()
                    runner = call_with_timeout(lambda: open_runner(system, layout, actors), STEP_TIMEOUT_S,
                                               f"{system} compile")
                    t1 = time.perf_counter()
                    step = f"first execute after compile {cycle + 1}"
                    checked_run(runner, probe, expected(layout, probe), f"{system} first execute")
                    t2 = time.perf_counter()
                    compiles["compile_s"].append(t1 - t0)
                    compiles["first_execute_s"].append(t2 - t1)
                    if cycle < s.compile_cycles - 1:
                        step = f"teardown after compile {cycle + 1}"
                        done, runner = runner, None
                        compiles["teardown_s"].append(close(done, kill=False))
                        del done
                        gc.collect()  # see release_graphs
                out.update(runner.info)
                step = "timing"
                if layout.kind == "echo":
                    out["samples"] = time_calls(lambda: runner.run(1), s.echo_iters, s.echo_warmup)
                else:
                    out["sizes"] = {}
                    for size in (TINY, *sizes):
                        step = f"timing {size} B"
                        checked_run(runner, size, (size, size % 251), f"execute with {size} B")
                        iters = s.tiny_iters if size == TINY else s.hop_iters(size)
                        out["sizes"][str(size)] = time_calls(lambda n=size: runner.run(n), iters, s.hop_warmup)
            finally:
                if runner is not None:
                    step_before, step = step, "final teardown"
                    try:
                        out["final_teardown_s"] = close(runner, kill=True)
                    except Exception as exc:  # noqa: BLE001 - the actors are killed anyway
                        out["final_teardown"] = f"failed: {describe_error(exc)}"
                    step = step_before
    except Exception as exc:  # noqa: BLE001 - the row records it, the run goes on
        out["status"] = strip_ansi(f"failed at {step}: {describe_error(exc)}")
        out["error_text"] = strip_ansi(f"{type(exc).__name__}: {exc}")[:4000]  # a refusal's whole message
    release_graphs()
    return out


def measure_raw(layout: Layout, s: Settings, node_ids: dict[str, str], sizes: tuple[int, ...]) -> dict[str, Any]:
    """One round of the physical reference on fresh actors placed as ``layout``: A sends
    B its prepared arrays over one plain TCP connection (``Node.raw_send``), one at a time,
    B receiving each into a buffer it reuses and sending one byte back. The same sizes,
    warm-up and counts as the hop graphs; no cgraph, no Ray, no framing on the path."""
    out: dict[str, Any] = {"status": "ok", "compile": {"compile_s": [], "first_execute_s": [], "teardown_s": []}}
    step = "starting actors"
    try:
        with actor_group(layout, node_ids, [TINY, *sizes]) as (actors, where):
            out.update(where)
            a, b = actors
            step = "raw TCP"
            plan = [(n, s.hop_warmup, s.tiny_iters if n == TINY else s.hop_iters(n)) for n in (TINY, *sizes)]
            addr = ray.get(b.raw_listen.remote(), timeout=STEP_TIMEOUT_S)
            received = b.raw_receive.remote([(n, warm + count) for n, warm, count in plan])
            out["sizes"] = ray.get(a.raw_send.remote(addr, plan), timeout=STEP_TIMEOUT_S)
            right = ray.get(received, timeout=STEP_TIMEOUT_S)
            if right != sum(warm + count for _, warm, count in plan):
                raise RuntimeError(f"raw TCP: {right} values arrived whole and right")
    except Exception as exc:  # noqa: BLE001 - the row records it, the run goes on
        out["status"] = strip_ansi(f"failed at {step}: {describe_error(exc)}")
        out["error_text"] = strip_ansi(f"{type(exc).__name__}: {exc}")[:4000]
    return out


def release_graphs() -> None:
    """Collect torn-down graphs now (a Ray CG ``CompiledDAG`` sits in reference cycles),
    so no graph of an earlier round holds on to anything while the next one runs."""
    gc.collect()


def strip_ansi(text: str) -> str:
    """Ray colours task names in its error messages; results files get plain text."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def pooled(layout: Layout, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One (layout, system)'s rounds as one entry: statistics over the samples of the
    rounds that ran; the status is "ok" or the first failure."""
    failed = [run for run in runs if run["status"] != "ok"]
    out: dict[str, Any] = {"status": failed[0]["status"] if failed else "ok", "rounds": len(runs)}
    if failed:
        out["error_text"] = failed[0].get("error_text")
    for key in ("actor_nodes", "channel_kinds", "tls_channels"):
        source = next((run for run in reversed(runs) if key in run), None)
        if source is not None:
            out[key] = source[key]
    ok_runs = [run for run in runs if run["status"] == "ok"]
    out["rounds_ok"] = len(ok_runs)
    if layout.kind == "echo" and ok_runs:
        samples = [ns for run in ok_runs for ns in run["samples"]]
        out.update(summarize_ns(samples))
        out["round_medians_us"] = [percentile(run["samples"], 50) / 1e3 for run in ok_runs]
    elif ok_runs:
        out["sizes"] = {}
        for size in ok_runs[0]["sizes"]:
            samples = [ns for run in ok_runs for ns in run["sizes"][size]]
            stats: dict[str, Any] = summarize_ns(samples)
            stats["gbps"] = gb_per_s(int(size), stats["median_us"] / 1e6)
            stats["round_medians_us"] = [percentile(run["sizes"][size], 50) / 1e3 for run in ok_runs]
            out["sizes"][size] = stats
    # compile: the first compile of each round is on fresh actors ("cold": the actor
    # imports and sets up what cgraph / Ray need), the later ones on the same actors
    cold = [run["compile"]["compile_s"][0] for run in runs if run["compile"]["compile_s"]]
    warm = [t for run in runs for t in run["compile"]["compile_s"][1:]]
    first_exec = [t for run in runs for t in run["compile"]["first_execute_s"]]
    teardown = [t for run in runs for t in run["compile"]["teardown_s"]]
    out["compile"] = {
        "median_cold_compile_s": percentile(cold, 50) if cold else None,
        "median_warm_compile_s": percentile(warm, 50) if warm else None,
        "median_first_execute_s": percentile(first_exec, 50) if first_exec else None,
        "median_teardown_s": percentile(teardown, 50) if teardown else None,
        "cold_compile_s": cold, "warm_compile_s": warm, "first_execute_s": first_exec, "teardown_s": teardown,
    }
    final = [run.get("final_teardown_s") for run in runs if run.get("final_teardown_s") is not None]
    out["final_teardown_s"] = final
    errors = [run["final_teardown"] for run in runs if "final_teardown" in run]
    if errors:
        out["final_teardown_errors"] = errors
    return out


# ================================================================== sections
def measure_handshake(s: Settings) -> dict[str, Any]:
    """One loopback TCP connection (connect + accept), and the same with cgraph's
    mutual HMAC handshake on it (handshake.Acceptor on the accepting side, handshake.prove
    on the dialling side): the difference is what the handshake adds per connection.
    The two ends are threads of this process (cgraph's ends are two processes)."""
    from cgraph.channels import handshake as hs

    secret, claim = hs.new_secret(), b"data cgraph_bench_0_ab_n1>b.xnode w"
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    jobs: list[bool] = []
    ready = threading.Semaphore(0)
    errors: list[BaseException] = []

    def serve() -> None:
        while True:
            ready.acquire()
            if not jobs:
                return
            with_handshake = jobs.pop()
            conn, _ = listener.accept()
            try:
                if with_handshake:
                    hs.answer(conn, lambda c: secret if c == claim else None)
                else:
                    conn.sendall(b"k")
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                conn.close()

    server = threading.Thread(target=serve, name="bench-acceptor", daemon=True)
    server.start()

    def one(with_handshake: bool) -> None:
        jobs.append(with_handshake)
        ready.release()
        sock = socket.create_connection(address)
        try:
            if with_handshake:
                hs.prove(sock, secret, claim, time.monotonic() + hs.HANDSHAKE_S)
            else:
                sock.recv(1)
        finally:
            sock.close()

    try:
        plain = time_calls(lambda: one(False), s.handshake_iters, s.handshake_iters // 10)
        authed = time_calls(lambda: one(True), s.handshake_iters, s.handshake_iters // 10)
    finally:
        ready.release()  # no job: the server returns
        server.join(5)
        listener.close()
    if errors:
        raise RuntimeError(f"acceptor side failed: {describe_error(errors[0])}")
    out = {"iterations": s.handshake_iters, "connect_only": summarize_ns(plain),
           "connect_and_handshake": summarize_ns(authed)}
    out["handshake_median_us"] = out["connect_and_handshake"]["median_us"] - out["connect_only"]["median_us"]
    log(f"  handshake: connect {out['connect_only']['median_us']:.1f} us, connect + handshake "
        f"{out['connect_and_handshake']['median_us']:.1f} us: +{out['handshake_median_us']:.1f} us per connection")
    return out


def measure_layouts(layouts: list[Layout], systems: tuple[str, ...], s: Settings, node_ids: dict[str, str],
                    gate: str | None, sizes: tuple[int, ...] | None = None,
                    tls_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Every layout for every system, ``rounds`` times, fresh actors each time; who goes
    first alternates by layout and round, so a change in the shared machine's load falls
    on every system alike. A (layout, system) that fails is not run again in later
    rounds. Hop layouts time ``sizes`` (default: the settings'); ``tls_env`` goes to
    the actors of the systems that compile with TLS only."""
    sizes = s.sizes if sizes is None else sizes
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(s.rounds):
        for i, layout in enumerate(layouts):
            order = systems if (i + r) % 2 == 0 else systems[::-1]
            for system in order:
                done = runs.setdefault((layout.name, system), [])
                if system in CGRAPH_TLS and gate or (done and done[-1]["status"] != "ok"):
                    continue
                env = tls_env if CGRAPH_TLS.get(system) else None
                if system == RAW:  # seconds a round, and placement noise: RAW_REPEAT rounds
                    runs_now = [measure_raw(layout, s, node_ids, sizes) for _ in range(RAW_REPEAT)]
                else:
                    runs_now = [measure_layout(system, layout, s, node_ids, sizes, env)]
                for run in runs_now:
                    done.append(run)
                    log_entry(layout, system, r, run)
    out: dict[str, Any] = {}
    for layout in layouts:
        entries = {}
        for system in systems:
            done = runs.get((layout.name, system), [])
            entries[system] = pooled(layout, done) if done else {"status": f"skipped: {gate}"}
        out[layout.name] = {**asdict(layout), "systems": entries}
    return {"rounds": s.rounds, "layouts": out}


def measure_tls(s: Settings, node_ids: dict[str, str], gate: str | None) -> dict[str, Any]:
    """cgraph with compile(tls=False) and compile(tls=True) on the same placements
    (TLS_LAYOUTS), fresh actors per round. The certificates are made for this run in a
    temporary folder, put in this process's environment (the driver) while the section
    runs and in the TLS rows' actors' (their runtime_env); the plain rows' actors never
    see them."""
    layouts = [lay for lay in LAYOUTS if lay.name in TLS_LAYOUTS]
    with tempfile.TemporaryDirectory(prefix="cgraph-bench-tls-") as folder:
        env = make_certificates(Path(folder))
        with driver_environment(env):
            out = measure_layouts(layouts, TLS_SYSTEMS, s, node_ids, gate, TLS_SIZES, env)
    out["sizes"] = list(TLS_SIZES)
    out["summary"] = tls_summary(out["layouts"])
    for row in out["summary"]:
        if row["ratio"] is not None:
            log(f"  tls: {row['measure']}: {row['plain']:.2f} -> {row['tls']:.2f} {row['unit']} "
                f"(x{row['ratio']:.2f})")
    return out


def make_certificates(folder: Path) -> dict[str, str]:
    """A throwaway test CA (``trustme``) and one certificate it signed for 127.0.0.1, as PEM
    files in ``folder``; returns cgraph's TLS environment variables naming them. Every
    process presents the same certificate, which mutual TLS checks against the CA."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = [folder / name for name in ("cert.pem", "key.pem", "ca.pem")]
    for blob, path in zip((cert.cert_chain_pems[0], cert.private_key_pem, ca.cert_pem), paths, strict=True):
        blob.write_to_path(str(path))
    return dict(zip(TLS_ENV_NAMES, map(str, paths), strict=True))


@contextmanager
def driver_environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while the block runs; restored after. cgraph
    caches a process's TLS context from its environment, so the cache is cleared on both
    sides: the block's graphs read ``env``, no later one keeps its (deleted) files."""
    from cgraph.channels import tls

    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    tls.context.cache_clear()
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tls.context.cache_clear()


def tls_summary(layouts: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measure: plain and TLS values, TLS / plain and TLS - plain."""
    def entry(layout: str, system: str) -> dict[str, Any]:
        return layouts.get(layout, {}).get("systems", {}).get(system, {})

    rows: list[dict[str, Any]] = []

    def row(measure: str, unit: str, values: list[float | None]) -> None:
        plain, tls = values
        rows.append({"measure": measure, "unit": unit, "plain": plain, "tls": tls,
                     "ratio": _ratio(tls, plain),
                     "difference": tls - plain if tls is not None and plain is not None else None})

    echo = [entry("echo_cross", system) for system in TLS_SYSTEMS]
    for key, what in (("median_us", "median"), ("p99_us", "p99")):
        row(f"echo across nodes, {what}", "us", [e.get(key) for e in echo])
    hops = [entry("hop_cross", system).get("sizes", {}) for system in TLS_SYSTEMS]
    for size in (TINY, *TLS_SIZES):
        stats = [h.get(str(size), {}) for h in hops]
        label = f"{size // MiB} MiB" if size >= MiB else f"{size} B"
        row(f"{label} hop across nodes, median", "ms",
            [v["median_us"] / 1e3 if "median_us" in v else None for v in stats])
        if size >= MiB:
            row(f"{label} hop across nodes, throughput", "GB/s", [v.get("gbps") for v in stats])
    for layout, what in (("echo_cross", "echo"), ("hop_cross", "hop")):
        for key, when in (("median_warm_compile_s", "warm compile"), ("median_first_execute_s", "first execute")):
            seconds = [(entry(layout, system).get("compile") or {}).get(key) for system in TLS_SYSTEMS]
            row(f"{when}, {what} across nodes", "ms", [None if x is None else x * 1e3 for x in seconds])
    return rows


def log_entry(layout: Layout, system: str, r: int, run: dict[str, Any]) -> None:
    times = run["compile"]["compile_s"]
    comp = f"compiles {', '.join(f'{t * 1e3:.0f}' for t in times)} ms" if times else "no compile"
    head = f"  {layout.name} {system} round {r + 1}:"
    if run["status"] != "ok":
        log(f"{head} {run['status']}; {comp}")
    elif layout.kind == "echo":
        stats = summarize_ns(run["samples"])
        log(f"{head} median {stats['median_us']:.1f} us, p99 {stats['p99_us']:.1f} us; {comp}")
    else:
        parts = []
        for size, samples in run["sizes"].items():
            median_ms = percentile(samples, 50) / 1e6
            unit = f"{int(size) // MiB} MiB" if int(size) >= MiB else f"{size} B"
            parts.append(f"{unit} {median_ms:.2f} ms" + (f" ({gb_per_s(int(size), median_ms / 1e3):.2f} GB/s)"
                                                        if int(size) >= MiB else ""))
        log(f"{head} {'; '.join(parts)}; {comp}")


# ================================================================== cluster
@contextmanager
def cluster_session() -> Iterator[dict[str, Any]]:
    """A head node (resource ``head``, the driver's node) and a worker node (``node2``);
    always shut down."""
    info: dict[str, Any] = {"node_cpus": NODE_CPUS, "object_store_bytes_per_node": OBJECT_STORE_BYTES}
    cluster = None
    try:
        t0 = time.monotonic()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": NODE_CPUS, "resources": {"head": 10}, "include_dashboard": False,
            "object_store_memory": OBJECT_STORE_BYTES})
        t1 = time.monotonic()
        cluster.add_node(num_cpus=NODE_CPUS, resources={"node2": 10}, object_store_memory=OBJECT_STORE_BYTES)
        cluster.wait_for_nodes()
        t2 = time.monotonic()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=True, logging_level="warning")
        info["start_s"] = {"head": round(t1 - t0, 2), "node2": round(t2 - t1, 2),
                           "driver": round(time.monotonic() - t2, 2)}
        node_ids = {}
        for node in ray.nodes():
            for name in ("head", "node2"):
                if node["Alive"] and name in node["Resources"]:
                    node_ids[name] = node["NodeID"]
        info["node_ids"] = node_ids
        log(f"cluster up: head {info['start_s']['head']} s, node2 {info['start_s']['node2']} s, "
            f"driver {info['start_s']['driver']} s")
        yield info
    finally:
        if cluster is not None:
            info["object_store_fallback_allocations"] = store_fallbacks(cluster)
        try:
            ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()


def store_fallbacks(cluster: Any) -> dict[str, int] | str:
    """Per raylet log of this cluster's session: how often the object store was full and
    Ray allocated an object from the filesystem instead (0 everywhere: every Ray CG
    channel buffer was in shared memory)."""
    try:
        logs = Path(cluster.head_node.get_session_dir_path()) / "logs"
        return {p.name: p.read_text(errors="replace").count("falling back to allocating from filesystem")
                for p in sorted(logs.glob("raylet*.out"))}
    except Exception as exc:  # noqa: BLE001 - Ray's layout may move
        return f"unknown ({describe_error(exc)})"


def cgraph_gate() -> str | None:
    try:
        import cgraph
    except Exception as exc:  # noqa: BLE001
        return f"cgraph not importable: {describe_error(exc)}"
    if not callable(getattr(cgraph, "compile", None)):
        return "cgraph.compile does not exist"
    return None


def cgraph_source() -> dict[str, Any]:
    """The commit this run's cgraph came from, and cgraph/ files changed since (if any)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "cgraph"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": describe_error(exc)}
    out: dict[str, Any] = {"commit": head, "uncommitted_cgraph_changes": [line.strip() for line in dirty]}
    try:
        import cgraph

        out["imported_from"] = str(Path(cgraph.__file__).resolve().parent)
        if not out["imported_from"].startswith(str(root)):
            out["note"] = "cgraph was imported from outside this checkout: commit and changes do not describe it"
    except Exception as exc:  # noqa: BLE001
        out["imported_from"] = f"not importable: {describe_error(exc)}"
    return out


OUR_PIDS: set[int] = {os.getpid()}  # the driver and every actor this run started


def leftover_segments() -> dict[str, list[str]]:
    """cgraph's /dev/shm entries (``cgraph_<creator pid>_...``): those created by this
    run's processes, and the others (another process's, e.g. a test suite running
    beside this benchmark on the shared machine)."""
    out: dict[str, list[str]] = {"ours": [], "others": []}
    for name in sorted(n for n in os.listdir("/dev/shm") if n.startswith("cgraph_")):
        pid = name.split("_")[1]
        out["ours" if pid.isdigit() and int(pid) in OUR_PIDS else "others"].append(name)
    return out


# ================================================================== report
def _ok(layouts: dict[str, Any], layout: str, system: str) -> dict[str, Any] | None:
    entry = layouts.get(layout, {}).get("systems", {}).get(system)
    return entry if entry and entry.get("status") == "ok" else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    sec = results["sections"]
    echo = sec.get("echo", {}).get("layouts", {})
    hops = sec.get("hops", {}).get("layouts", {})
    targets: list[dict[str, Any]] = []

    cg, ray_cg = _ok(echo, "echo_cross", "cgraph"), _ok(echo, "echo_cross", "ray_cgraph")
    cg_m, ray_m = cg and cg["median_us"], ray_cg and ray_cg["median_us"]
    r = _ratio(cg_m, ray_m)
    targets.append({"target": "cross-node echo", "requirement": f"cgraph median <= {ECHO_TARGET}x Ray CG's",
                    "cgraph": f"{fmt(cg_m)} us" if cg_m else "-", "anchor": f"Ray CG {fmt(ray_m)} us" if ray_m else "-",
                    "ratio": r, "verdict": verdict(None if r is None else r <= ECHO_TARGET)})

    size = 16 * MiB
    worker, head = _ok(hops, "hop_worker", "cgraph"), _ok(hops, "hop_head", "cgraph")
    w = worker and worker["sizes"].get(str(size), {}).get("median_us")
    h = head and head["sizes"].get(str(size), {}).get("median_us")
    r = _ratio(w, h)
    targets.append({"target": "16 MiB hop within a worker node",
                    "requirement": "cgraph median <= 1.5x the same hop within the driver's node",
                    "cgraph": f"{fmt(w / 1e3, 2)} ms" if w else "-",
                    "anchor": f"cgraph within the driver's node {fmt(h / 1e3, 2)} ms" if h else "-",
                    "ratio": r, "verdict": verdict(None if r is None else r <= 1.5)})

    cg, ray_cg = _ok(hops, "hop_cross", "cgraph"), _ok(hops, "hop_cross", "ray_cgraph")
    for size in results["settings"]["sizes"]:
        a = cg and cg["sizes"].get(str(size), {}).get("gbps")
        b = ray_cg and ray_cg["sizes"].get(str(size), {}).get("gbps")
        r = _ratio(a, b)
        targets.append({"target": f"cross-node throughput, {size // MiB} MiB",
                        "requirement": "cgraph GB/s >= Ray CG's", "cgraph": f"{fmt(a, 2)} GB/s" if a else "-",
                        "anchor": f"Ray CG {fmt(b, 2)} GB/s" if b else "-", "ratio": r,
                        "verdict": verdict(None if r is None else r >= 1.0)})
    raw = _ok(hops, "hop_cross", RAW)
    for size in results["settings"]["sizes"]:
        if size < 16 * MiB:
            continue
        a = cg and cg["sizes"].get(str(size), {}).get("gbps")
        b = raw and raw["sizes"].get(str(size), {}).get("gbps")
        r = _ratio(a, b)
        targets.append({"target": f"cross-node throughput vs the wire's reference, {size // MiB} MiB",
                        "requirement": f"cgraph GB/s >= {RAW_TARGET:.0%} of raw TCP's between the same actors",
                        "cgraph": f"{fmt(a, 2)} GB/s" if a else "-",
                        "anchor": f"raw TCP {fmt(b, 2)} GB/s" if b else "-", "ratio": r,
                        "verdict": verdict(None if r is None else r >= RAW_TARGET)})
    return targets


def _status_row(entry: dict[str, Any]) -> str:
    return entry.get("status", "not run")


def _partial(entry: dict[str, Any]) -> str:
    """A mark for a row some of whose rounds failed (the notes say why)."""
    return "" if entry.get("status") == "ok" else f" ({entry.get('rounds_ok', 0)} of {entry.get('rounds')} rounds ok)"


def render_markdown(results: dict[str, Any]) -> str:
    sec, host, st = results["sections"], results["host"], results["settings"]
    cl = results.get("cluster", {})
    lines = ["# Cross-node: cgraph vs Ray Compiled Graphs on a loopback multi-node cluster", ""]
    lines.append(
        f"Measured {results['created']} on {host['cpu_model']} ({host['cpu_count']} cores), Python {host['python']}, "
        f"Ray {host.get('ray', '?')}, numpy {host.get('numpy', '?')}; `{results['command']}`. Both systems measured "
        f"in this one run, each (layout, system) on fresh actors. Cluster: 2 Ray nodes on this one machine "
        f"(head: the driver's node, resource `head`; worker: `node2`), {NODE_CPUS} logical CPUs each, "
        f"{OBJECT_STORE_BYTES >> 30} GiB object store each; started in "
        f"{sum(cl.get('start_s', {}).values()):.1f} s (started once, used for every layout). Before the run "
        f"{host.get('background_busy_percent', float('nan')):.0f}% of all cores were busy (load average "
        f"{host.get('load_average_1m', float('nan')):.2f}): the machine is shared, so absolute numbers move "
        f"between runs; compare the ratios within one run.")
    src = results.get("cgraph_source", {})
    if src.get("note"):
        lines += ["", f"cgraph imported from `{src['imported_from']}`: {src['note']}."]
    elif src.get("commit"):
        changed = src.get("uncommitted_cgraph_changes") or []
        lines += ["", f"cgraph from commit `{src['commit']}`" + (
            f" with uncommitted changes to {len(changed)} file(s) under cgraph/ (listed in the JSON)."
            if changed else ".")]
    lines += ["", "**All nodes are one machine**: " + NOTES[0].split("**", 2)[2].strip(), ""]

    lines += ["## Targets", ""]
    rows = [[t["target"], t["requirement"], t["cgraph"], t["anchor"], fmt_ratio(t["ratio"]), t["verdict"]]
            for t in results.get("targets", [])]
    lines += [markdown_table(["target", "requirement", "cgraph", "anchor", "ratio", "verdict"], rows), ""]

    echo = sec.get("echo", {})
    lines += ["## Echo latency", ""]
    if echo.get("status") != "ok":
        lines += [f"_{echo.get('status', 'not run')}_", ""]
    else:
        lines += [f"Microseconds, the int 1, {st['rounds']} round(s) x {st['echo_iters']} executions per row "
                  f"after {st['echo_warmup']} warm-up each, on fresh actors per round; buffer "
                  f"{ECHO_BUFFER // MiB} MiB (for Ray CG set through `DAGContext` in the driver and the "
                  "actor: see the notes), "
                  f"max_inflight_executions {ECHO_INFLIGHT}.", ""]
        rows = []
        for name, lay in echo["layouts"].items():
            anchor = _ok(echo["layouts"], name, "ray_cgraph")
            for system, e in lay["systems"].items():
                if "median_us" not in e:
                    rows.append([lay["picture"], LABELS[system], _status_row(e), "", "", "", ""])
                    continue
                rows.append([lay["picture"], LABELS[system] + _partial(e), fmt(e["median_us"]), fmt(e["p99_us"]),
                             fmt_ratio(_ratio(e["median_us"], anchor and anchor["median_us"])),
                             " / ".join(fmt(m) for m in e["round_medians_us"]), _kinds(e)])
        lines += [markdown_table(["layout", "system", "median us", "p99 us", "median vs Ray CG",
                                  "round medians us", "cgraph channels"], rows), ""]

    hops = sec.get("hops", {})
    lines += ["## Array hops", ""]
    if hops.get("status") != "ok":
        lines += [f"_{hops.get('status', 'not run')}_", ""]
    else:
        lines += [f"Per execution of driver -> A.produce -(uint8 array)-> B.consume -(2 ints)-> driver, one at a "
                  f"time, {st['rounds']} round(s) on fresh actors, samples pooled; GB/s = array bytes / median (1 GB = 1e9 B). Executions per size: "
                  + ", ".join(f"{int(sz) // MiB} MiB: {n}" for sz, n in st["hop_iterations"].items())
                  + f", 8 B: {st['tiny_iters']}. Buffer {HOP_BUFFER / MiB:g} MiB per slot: cgraph's "
                  f"`buffer_size_bytes` (its initial slot size, every channel); Ray CG's channels written by A "
                  f"(the array), {ECHO_BUFFER // MiB} MiB for the others (see the notes). "
                  f"max_inflight_executions {HOP_INFLIGHT}.", ""]
        rows = []
        for name, lay in hops["layouts"].items():
            anchor = _ok(hops["layouts"], name, "ray_cgraph")
            for system, e in lay["systems"].items():
                if "sizes" not in e:
                    rows.append([lay["role"], LABELS[system], "", _status_row(e), "", "", "", ""])
                    continue
                for size, v in e["sizes"].items():
                    a = anchor and anchor["sizes"].get(size, {}).get("median_us")
                    label = f"{int(size) // MiB} MiB" if int(size) >= MiB else f"{size} B"
                    rows.append([lay["role"], LABELS[system] + _partial(e), label, fmt(v["median_us"] / 1e3, 3),
                                 fmt(v["p99_us"] / 1e3, 3), fmt(v["gbps"], 2) if int(size) >= MiB else "-",
                                 fmt_ratio(_ratio(v["median_us"], a)), _kinds(e)])
        lines += [markdown_table(["layout", "system", "array", "median ms", "p99 ms", "GB/s",
                                  "time vs Ray CG", "cgraph channels"], rows), ""]
        lines += ["Layouts: " + "; ".join(f"{lay['role']}: `{lay['picture']}`" for lay in hops["layouts"].values())
                  + ".", ""]

    lines += ["## Compile time", ""]
    lines += [f"Each round compiles each (layout, system) {st['compile_cycles']} times on the same fresh actors: "
              "compile, its first execute (the int 1, or an 8-byte array), teardown (not after the last compile, "
              "whose graph is the one timed above). **Cold** = the first compile on fresh actors (median over "
              f"{st['rounds']} round(s)), **warm** = the later ones (median of "
              f"{st['rounds'] * (st['compile_cycles'] - 1)}). cgraph's compile includes opening and authenticating "
              "every cross-node connection; `warm vs same node` = the warm median minus that of the same graph "
              "with every actor on the driver's node (echo_head / hop_head).", ""]
    rows = []
    for section in ("echo", "hops"):
        layouts = sec.get(section, {}).get("layouts", {})
        base_name = "echo_head" if section == "echo" else "hop_head"
        for name, lay in layouts.items():
            for system, e in lay["systems"].items():
                c = e.get("compile") or {}
                warm, cold = c.get("median_warm_compile_s"), c.get("median_cold_compile_s")
                if warm is None and cold is None:
                    rows.append([lay["picture"], LABELS[system], _status_row(e), "", "", "", "", ""])
                    continue
                base = layouts.get(base_name, {}).get("systems", {}).get(system, {}).get("compile", {})
                base_warm = base.get("median_warm_compile_s") if base else None
                delta = (warm - base_warm) * 1e3 if warm is not None and base_warm is not None \
                    and name != base_name else None
                every = c["warm_compile_s"]
                rows.append([lay["picture"], LABELS[system], _ms(cold), _ms(warm),
                             f"{_ms(min(every))}-{_ms(max(every))}" if every else "-",
                             fmt(delta, 1) if delta is not None else "-",
                             _ms(c.get("median_first_execute_s")), _ms(c.get("median_teardown_s"))])
    lines += [markdown_table(["layout", "system", "cold compile ms", "warm compile ms", "warm min-max ms",
                              "warm vs same node ms", "first execute ms", "teardown ms"], rows), ""]

    hs = sec.get("handshake", {})
    lines += ["## cgraph's connection handshake", ""]
    if hs.get("status") != "ok":
        lines += [f"_{hs.get('status', 'not run')}_", ""]
    else:
        per = hs["handshake_median_us"]
        lines += [f"One loopback TCP connection (connect + accept, two threads of one process), without and with "
                  f"cgraph's mutual HMAC-SHA256 handshake (`cgraph.channels.handshake`), {hs['iterations']} each: "
                  f"**{fmt(per)} us per connection** (median {fmt(hs['connect_only']['median_us'])} us -> "
                  f"{fmt(hs['connect_and_handshake']['median_us'])} us; p99 {fmt(hs['connect_only']['p99_us'])} -> "
                  f"{fmt(hs['connect_and_handshake']['p99_us'])} us). The 5 ms compile budget would allow "
                  f"~{int(5000 / per) if per > 0 else '-'} such handshakes, done one after another; on real "
                  "nodes each also waits ~1.5 network round trips.", ""]

    lines += render_tls(sec.get("tls", {}), st)
    lines += ["## Notes", ""]
    lines += [f"- {note}" for note in NOTES]
    fallbacks = cl.get("object_store_fallback_allocations")
    if isinstance(fallbacks, dict):
        total = sum(fallbacks.values())
        lines.append(f"- Ray's object store ran full {total} time(s) during the run (raylet logs: allocations "
                     "that fell back to the filesystem)" + (
                         "; Ray CG numbers measured after that may have used buffers outside shared memory."
                         if total else ": every Ray CG buffer was in shared memory."))
    elif fallbacks:
        lines.append(f"- Ray's object store fallbacks: {fallbacks}")
    left = results.get("leftover_cgraph_segments")
    others = results.get("other_cgraph_segments_in_dev_shm") or []
    lines.append(f"- After the run /dev/shm held {len(left) if left is not None else '?'} `cgraph_*` entries "
                 "created by this run's processes" + (f": {', '.join(left[:10])}" if left else "")
                 + (f" ({len(others)} more from other processes, e.g. tests running at the same time)"
                    if others else "") + "; Ray CG's `sem.*` files are expected.")
    for sname in ("echo", "hops", "tls"):
        for n, lay in sec.get(sname, {}).get("layouts", {}).items():
            for sy, e in lay["systems"].items():
                if e.get("status") != "ok":
                    lines.append(f"- {n} / {LABELS[sy]}: {e.get('status')}")
                for error in e.get("final_teardown_errors", []):
                    lines.append(f"- {n} / {LABELS[sy]}: final teardown {error}")
    for sname, entry in sec.items():
        if entry.get("status") != "ok":
            lines.append(f"- section {sname}: {entry.get('status')}")
    if results.get("cluster_error"):
        lines.append(f"- cluster: {results['cluster_error']}")
    return "\n".join(lines) + "\n"


def render_tls(tls: dict[str, Any], st: dict[str, Any]) -> list[str]:
    lines = ["## TLS across nodes", ""]
    if tls.get("status") != "ok":
        return [*lines, f"_{tls.get('status', 'not run')}_", ""]
    layouts = tls["layouts"]
    lines += [
        "What cgraph's optional TLS costs across nodes: the same graphs compiled with `tls=False` and "
        "`tls=True` (cgraph only), same placements, fresh actors per round, "
        f"{st['rounds']} round(s), who goes first alternating. With TLS every socket of the graph, control "
        "and data, runs mutual TLS 1.2+ (Python's standard `ssl` module; both ends present a certificate "
        "the CA signed) and then cgraph's HMAC handshake inside it; every frame is encrypted and "
        "integrity-checked. Shared-memory edges within a node are unchanged. Certificates: a throwaway "
        "test CA made for this run (`trustme`), in the environment of the driver and of the TLS rows' "
        "actors only (`runtime_env` env_vars); the plain rows compile with `tls=False` explicitly. "
        "Measured: the echo across nodes (same executions as the echo section), the hop across nodes "
        "(A on head, B on node2: the array crosses one TLS connection), the warm compile and the first "
        "execute after each compile (the compile table's columns). Between them they hold the TLS "
        "handshakes: each socket endpoint's control connection to the driver is made at compile, and a "
        "data connection by its writer's first write (the first execute). Here encryption and "
        "decryption are CPU work on the same 2 cores as every other process and the \"wire\" is "
        "loopback, so the ratios are the cipher's CPU cost against memory copies; on real nodes the same "
        "CPU work also competes with the NIC's transfer (hidden behind a slow link, the limit on a fast "
        "one).", ""]
    rows = [[r["measure"], fmt(r["plain"], 2), fmt(r["tls"], 2), r["unit"], fmt_ratio(r["ratio"]),
             fmt(r["difference"], 2)] for r in tls["summary"]]
    lines += [markdown_table(["measure", "plain", "TLS", "unit", "TLS / plain", "TLS - plain"], rows), ""]
    rows = []
    for lay in layouts.values():
        for system, e in lay["systems"].items():
            rows.append([lay["picture"], LABELS[system] + _partial(e), _status_row(e), _kinds(e),
                         e.get("tls_channels", "-")])
    lines += [markdown_table(["layout", "system", "status", "cgraph channels", "TLS socket channels"], rows), ""]
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else fmt(seconds * 1e3, 1)


def _kinds(entry: dict[str, Any]) -> str:
    kinds = entry.get("channel_kinds")
    if not kinds:
        return "-"
    if isinstance(kinds, str):
        return kinds
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))


# ================================================================== main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n", 1)[0], SECTIONS, argv)
    s = QUICK if args.quick else FULL
    results = new_results("crossnode", args, **asdict(s), environment=ENV, sections_run=args.sections,
                          hop_buffer_size_bytes=HOP_BUFFER, echo_buffer_size_bytes=ECHO_BUFFER,
                          hop_max_inflight_executions=HOP_INFLIGHT, echo_max_inflight_executions=ECHO_INFLIGHT,
                          hop_iterations={str(size): s.hop_iters(size) for size in s.sizes},
                          tls_sizes=TLS_SIZES)
    results["notes"] = NOTES
    results["cgraph_source"] = cgraph_source()
    results["host"]["background_busy_percent"] = system_busy_percent(1.0)
    results["host"]["load_average_1m"] = load_average()
    log(f"machine before the run: {results['host']['background_busy_percent']:.0f}% of all cores busy, "
        f"load average {results['host']['load_average_1m']:.2f}")
    gate = cgraph_gate()
    if gate:
        log(gate)
    if "handshake" in args.sections:
        run_section(results, "handshake", lambda: measure_handshake(s))
    cluster_sections = [n for n in args.sections if n in ("echo", "hops", "tls")]
    if cluster_sections:
        try:
            with cluster_session() as info:
                results["cluster"] = info
                results["host"]["ray"] = ray.__version__
                node_ids = info["node_ids"]
                sections = {
                    "echo": lambda: measure_layouts(layouts_of("echo"), SYSTEMS, s, node_ids, gate),
                    "hops": lambda: measure_layouts(layouts_of("hop"), (*SYSTEMS, RAW), s, node_ids, gate),
                    "tls": lambda: measure_tls(s, node_ids, gate),
                }
                for name in cluster_sections:
                    run_section(results, name, sections[name])
        except Exception as exc:  # noqa: BLE001 - the results say so
            results["cluster_error"] = describe_error(exc)
            log(f"cluster failed: {describe_error(exc)}")
    left = leftover_segments()
    results["leftover_cgraph_segments"] = left["ours"]
    results["other_cgraph_segments_in_dev_shm"] = left["others"]
    if left["ours"]:
        log(f"left in /dev/shm by this run's processes: {left['ours']}")
    if left["others"]:
        log(f"in /dev/shm from other processes (not this run's): {left['others']}")
    results["targets"] = evaluate_targets(results)
    markdown = render_markdown(results)
    json_path, md_path = write_results(args.out, "crossnode", results, markdown)
    print(markdown, flush=True)
    log(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
