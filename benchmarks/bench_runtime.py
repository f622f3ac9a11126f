"""Runtime benchmark: cgraph next to Ray Compiled Graphs and plain Ray actor calls.

One run measures every system on the same DAGs, in one Ray session, and writes
medians, p99s and ratios to results/runtime.json and results/runtime.md:

    floor       bare wake-up round trip between two forked processes
    memcpy      copy of each array size into shared memory: one core, and both at once
    latency     one execute + get of the int 1 on echo, chain3 and fanout3
    throughput  an array through driver -> A.echo -> B.checksum -> driver:
                sequential (one execution at a time) and pipelined (k in flight)
    idle_cpu    % of a core used by the actors of a compiled chain3 at rest
    compile     compile / first execute / teardown of chain3

runtime_report.py evaluates the targets and renders the Markdown; its
DEFINITIONS (printed at the end of runtime.md) say exactly what each section
measures. Systems: ``cgraph``, ``ray_cgraph`` (Ray Compiled Graphs) and
``ray_plain`` (the same methods chained with .remote).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_runtime.py       # ~2 min, results/
    .venv/bin/python benchmarks/bench_runtime.py --quick                 # ~1 min, a temp folder
    .venv/bin/python benchmarks/bench_runtime.py --sections floor,latency --out /tmp/x

Most of a run is actors starting and importing torch; a --sections run rewrites
runtime.json with only those sections.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402 - needs the path above
    CallTimeout,
    call_with_timeout,
    configure_environment,
    describe_error,
    gb_per_s,
    load_average,
    log,
    measure_cpu_window,
    memory_available_bytes,
    new_results,
    parse_args,
    percentile,
    pingpong_floor,
    ray_session,
    run_section,
    summarize_ns,
    system_busy_percent,
    thread_breakdown,
    time_calls,
    write_results,
)
from physical import memcpy_reference  # noqa: E402
from runtime_report import evaluate_targets, render_markdown  # noqa: E402

# Ray reads RAY_CGRAPH_* when ray.dag is imported; the actors inherit them from ray.init.
# RAY_CGRAPH_buffer_size_bytes is deliberately NOT set globally: at 120 MiB it made
# every Ray compile on this 2-core machine take 16-35 s (it sizes every channel).
# The buffer size is passed per compile instead (BUFFER_* below), to both systems.
# RAY_CGRAPH_teardown_timeout: Ray's teardown of a graph that passed numpy arrays
# through two actors hangs here (the first actor's loop never exits); after this
# many seconds teardown(kill_actors=True) kills the actors instead of waiting.
ENV = configure_environment({
    "RAY_CGRAPH_get_timeout": "300",
    "RAY_CGRAPH_submit_timeout": "300",
    "RAY_CGRAPH_teardown_timeout": "5",
})

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.dag import InputNode  # noqa: E402

MiB = 1 << 20
SECTIONS = ("floor", "memcpy", "latency", "throughput", "idle_cpu", "compile")
RAY_SECTIONS = {"latency", "throughput", "idle_cpu", "compile"}
SYSTEMS = ("cgraph", "ray_cgraph", "ray_plain")
COMPILED = ("cgraph", "ray_cgraph")
BUFFER_LATENCY = 1 * MiB  # Ray's default buffer size
MAX_INFLIGHT_LATENCY = 10  # Ray's default
# The pipelined window k, and the compiled throughput graph's max_inflight_executions:
# every channel gets k slots of 1.2x the largest array (Ray touches all of them).
MAX_INFLIGHT_THROUGHPUT = 4
# Ray Compiled Graphs put their channel buffers in the object store: 3 channels x 4
# slots x 120 MiB = 1.4 GiB, so 3 GiB rather than the 2 GiB that held 2 slots.
OBJECT_STORE_BYTES = 3 << 30
STEP_TIMEOUT_S = 300.0  # actor start-up or a first execute that takes longer fails
TEARDOWN_TIMEOUT_S = 60.0
# The executor loop's thread in an actor, by its name (/proc/<pid>/task/<tid>/comm,
# 15 characters): Ray names the thread running a task "ray::<task name>".
LOOP_THREAD = {"cgraph": "ray::cgraph_loo", "ray_cgraph": "ray::Node.__ray"}  # Node.__ray_call__


@dataclass(frozen=True)
class Settings:
    latency_iters: int
    latency_rounds: int
    latency_warmup: int
    floor_iters: int
    sizes: tuple[int, ...]
    throughput_bytes: int  # per size, iterations = clamp(throughput_bytes / size)
    throughput_min_iters: int
    throughput_max_iters: int
    pipelined_min_iters: int  # executions per pipelined repeat: at least this many
    pipelined_repeats: int
    memcpy_iters: int
    idle_seconds: float
    compile_cycles: int

    def throughput_iters(self, size: int) -> int:
        return max(self.throughput_min_iters, min(self.throughput_max_iters, self.throughput_bytes // size))

    def pipelined_iters(self, size: int) -> int:
        return max(self.pipelined_min_iters, self.throughput_iters(size))


FULL = Settings(1000, 3, 100, 20000, (1 * MiB, 16 * MiB, 100 * MiB), 3 << 30, 20, 300, 40, 5, 50, 3.0, 5)
QUICK = Settings(100, 1, 10, 2000, (1 * MiB, 4 * MiB), 64 * MiB, 5, 30, 12, 2, 10, 1.0, 2)


# ================================================================== actors and DAGs
@ray.remote(num_cpus=0)
class Node:
    """One actor of the benchmark DAGs."""

    def getpid(self) -> int:
        return os.getpid()

    def import_torch(self) -> str:
        # Ray Compiled Graphs import torch lazily in the actor loop; on two cores that
        # first import can outlast the first execute's timeout, so pay it up front.
        import torch

        return str(torch.__version__)

    def echo(self, x: Any) -> Any:
        return x

    def combine(self, a: Any, b: Any, c: Any) -> Any:
        return a + b + c

    def checksum(self, arr: Any) -> tuple[int, int, int]:
        return (int(arr.nbytes), int(arr[0]), int(arr[-1]))


@dataclass(frozen=True)
class DagSpec:
    name: str
    actors: int
    hops: int  # channel hops on the critical path, driver to driver
    channels: int  # channels in the compiled graph (driver's included)
    picture: str
    bind: Callable[[list[Any], Any], Any]  # (actors, InputNode) -> output node
    call: Callable[[list[Any], Any], Any]  # (actors, x) -> ObjectRef, plain Ray


def _chain3_call(a: list[Any], x: Any) -> Any:
    return a[2].echo.remote(a[1].echo.remote(a[0].echo.remote(x)))


def _fanout3_call(a: list[Any], x: Any) -> Any:
    return a[3].combine.remote(a[0].echo.remote(x), a[1].echo.remote(x), a[2].echo.remote(x))


LATENCY_DAGS = (
    DagSpec("echo", 1, 2, 2, "driver -> A.echo -> driver",
            lambda a, i: a[0].echo.bind(i), lambda a, x: a[0].echo.remote(x)),
    DagSpec("chain3", 3, 4, 4, "driver -> A.echo -> B.echo -> C.echo -> driver",
            lambda a, i: a[2].echo.bind(a[1].echo.bind(a[0].echo.bind(i))), _chain3_call),
    DagSpec("fanout3", 4, 3, 7, "driver -> {A,B,C}.echo -> D.combine(A,B,C) -> driver",
            lambda a, i: a[3].combine.bind(a[0].echo.bind(i), a[1].echo.bind(i), a[2].echo.bind(i)),
            _fanout3_call),
)
THROUGHPUT_DAG = DagSpec(
    "chain2", 2, 3, 3, "driver -(array)-> A.echo -(array)-> B.checksum -(3 ints)-> driver",
    lambda a, i: a[1].checksum.bind(a[0].echo.bind(i)),
    lambda a, x: a[1].checksum.remote(a[0].echo.remote(x)),
)


@contextmanager
def actor_group(count: int, import_torch: bool) -> Iterator[tuple[list[Any], list[int]]]:
    """``count`` fresh actors and their pids; killed (and waited for) on exit."""
    actors, pids = [Node.remote() for _ in range(count)], []
    try:
        pids = ray.get([a.getpid.remote() for a in actors], timeout=STEP_TIMEOUT_S)
        if import_torch:
            ray.get([a.import_torch.remote() for a in actors], timeout=STEP_TIMEOUT_S)
        yield actors, pids
    finally:
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        deadline = time.monotonic() + 15.0  # let the processes exit before measuring more
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.05)


# ================================================================== the three systems
class Unavailable(RuntimeError):
    """The system cannot run here (cgraph's runtime not written yet)."""


class CgraphGate:
    """Whether cgraph can run here; the first "not available" answer is remembered,
    so later sections skip at once instead of starting actors for nothing."""

    def __init__(self) -> None:
        self.reason: str | None = None
        try:
            import cgraph
        except Exception as exc:  # noqa: BLE001
            self.reason = f"cgraph runtime not available: {describe_error(exc)}"
            return
        if not callable(getattr(cgraph, "compile", None)):
            self.reason = "cgraph runtime not available: cgraph.compile does not exist yet"


@dataclass
class Runner:
    """One system ready to run one DAG: ``run(x)`` returns the DAG's result;
    ``fetch(submit(x))`` does the same in two steps, so several can be in flight."""

    run: Callable[[Any], Any]
    submit: Callable[[Any], Any]  # x -> a ref to the result
    fetch: Callable[[Any], Any]  # ref -> the result
    teardown: Callable[[], Any]
    teardown_s: float | None = None

    def close(self) -> None:
        """Tear down (time-limited), remembering how long it took."""
        start = time.perf_counter()
        try:
            call_with_timeout(self.teardown, TEARDOWN_TIMEOUT_S, "teardown")
        finally:
            self.teardown_s = time.perf_counter() - start


def open_runner(system: str, spec: DagSpec, actors: list[Any], buffer: int, inflight: int,
                kill_actors: bool = True) -> Runner:
    """Compile (or not) ``spec`` on ``actors`` for ``system``.

    ``kill_actors``: the actors are thrown away after this DAG, so Ray's teardown may
    kill an actor whose loop does not stop (see RAY_CGRAPH_teardown_timeout above).
    """
    if system == "ray_plain":
        return Runner(lambda x: ray.get(spec.call(actors, x)), lambda x: spec.call(actors, x), ray.get,
                      lambda: None)
    with InputNode() as inp:
        dag = spec.bind(actors, inp)
    if system == "ray_cgraph":
        compiled = dag.experimental_compile(
            _buffer_size_bytes=buffer, _max_inflight_executions=inflight, _submit_timeout=300
        )
        return Runner(lambda x: ray.get(compiled.execute(x)), compiled.execute, ray.get,
                      lambda: compiled.teardown(kill_actors=kill_actors))
    return _open_cgraph(dag, buffer, inflight, "colocate" if system == "cgraph_colocate" else None,
                        timeline=system == "cgraph_timeline")


def _open_cgraph(dag: Any, buffer: int, inflight: int, affinity: Any = None, timeline: bool = False) -> Runner:
    import cgraph

    try:
        compiled = cgraph.compile(dag, max_inflight_executions=inflight, buffer_size_bytes=buffer,
                                  cpu_affinity=affinity, timeline=timeline)
    except (NotImplementedError, AttributeError, ImportError) as exc:
        raise Unavailable(f"cgraph runtime not available: {describe_error(exc)}") from exc
    if not callable(getattr(compiled, "execute", None)):
        raise Unavailable(f"cgraph runtime not available: compile returned {type(compiled).__name__} "
                          "without execute()")
    return Runner(lambda x: compiled.execute(x).get(), compiled.execute, lambda ref: ref.get(), compiled.teardown)


def first_run(runner: Runner, x: Any, expected: Any, system: str) -> None:
    """The first execution, time-limited, checking the answer."""
    try:
        got = call_with_timeout(lambda: runner.run(x), STEP_TIMEOUT_S, f"{system} first execute")
    except NotImplementedError as exc:
        raise Unavailable(f"cgraph runtime not available: {describe_error(exc)}") from exc
    if not _same(got, expected):
        raise RuntimeError(f"{system} returned {got!r}, expected {expected!r}")


def _same(got: Any, expected: Any) -> bool:
    if isinstance(expected, tuple):
        return tuple(got) == expected
    return bool(got == expected)


@contextmanager
def system_on_dag(system: str, spec: DagSpec, buffer: int, inflight: int) -> Iterator[tuple[Runner, list[int]]]:
    """Fresh actors, compiled for ``system``; torn down and killed on exit."""
    with actor_group(spec.actors, import_torch=system in COMPILED) as (actors, pids):
        runner = open_runner(system, spec, actors, buffer, inflight)
        try:
            yield runner, pids
        finally:
            try:
                runner.close()
            except CallTimeout as exc:
                log(f"  {system}: {exc}; killing its actors")
            if system in COMPILED and (runner.teardown_s or 0) > 2.0:
                log(f"  {system}: teardown took {runner.teardown_s:.1f} s")


def guarded(system: str, gate: CgraphGate, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one system's measurement; a failure becomes its status, not the section's."""
    if system.startswith("cgraph") and gate.reason:
        return {"status": f"skipped: {gate.reason}"}
    try:
        return {"status": "ok", **fn()}
    except Unavailable as exc:
        gate.reason = str(exc)
        return {"status": f"skipped: {exc}"}
    except Exception as exc:  # noqa: BLE001 - one anchor failing must not end the section
        return {"status": f"failed: {describe_error(exc)}"}


# ================================================================== sections
def measure_floor(s: Settings) -> dict[str, Any]:
    """The bare wake-up round trip between two forked processes (common.pingpong_floor)."""
    return pingpong_floor(s.floor_iters)


def measure_memcpy(s: Settings) -> dict[str, Any]:
    """Copies into shm by bare numpy, one core alone and both at once (physical.py)."""
    return memcpy_reference(s.sizes, s.memcpy_iters)


def measure_latency(s: Settings, gate: CgraphGate) -> dict[str, Any]:
    """Each (DAG, system) in ``latency_rounds`` rounds on fresh actors, the systems'
    order rotating per round, so a change in the shared machine's load falls on
    every system alike; the statistics pool the rounds' samples."""
    systems = (*SYSTEMS, "cgraph_colocate", "cgraph_timeline")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(s.latency_rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for spec in LATENCY_DAGS:
            for system in order:
                done = runs.setdefault((spec.name, system), [])
                if done and done[-1]["status"] != "ok":
                    continue  # failed or skipped once: not again
                done.append(guarded(system, gate, lambda sy=system, sp=spec: _latency_one(sy, sp, s)))
                _log_system(f"latency {spec.name} round {r + 1}", system, _pooled(done, spec.hops))
    dags: dict[str, Any] = {}
    for spec in LATENCY_DAGS:
        entry: dict[str, Any] = {k: v for k, v in asdict(spec).items() if k not in ("bind", "call")}
        entry["systems"] = {system: _pooled(runs[(spec.name, system)], spec.hops) for system in systems}
        dags[spec.name] = entry
    return {"iterations": s.latency_iters, "rounds": s.latency_rounds, "warmup": s.latency_warmup,
            "payload": "int 1", "buffer_size_bytes": BUFFER_LATENCY,
            "max_inflight_executions": MAX_INFLIGHT_LATENCY, "dags": dags}


def _latency_one(system: str, spec: DagSpec, s: Settings) -> dict[str, Any]:
    with system_on_dag(system, spec, BUFFER_LATENCY, MAX_INFLIGHT_LATENCY) as (runner, _):
        expected = 3 if spec.name == "fanout3" else 1
        first_run(runner, 1, expected, system)
        samples = time_calls(lambda: runner.run(1), s.latency_iters, s.latency_warmup)
    return {"samples": samples, "teardown_s": runner.teardown_s}


def _pooled(runs: list[dict[str, Any]], hops: int) -> dict[str, Any]:
    """One (DAG, system)'s rounds as one entry: the last failure, or pooled statistics."""
    if runs[-1]["status"] != "ok":
        return runs[-1]
    samples = [ns for run in runs for ns in run["samples"]]
    stats = {"status": "ok", **summarize_ns(samples)}
    stats["per_hop_median_us"] = stats["median_us"] / hops
    stats["round_medians_us"] = [percentile(run["samples"], 50) / 1e3 for run in runs]
    stats["teardown_s"] = max(run["teardown_s"] for run in runs)
    return stats


def measure_throughput(s: Settings, gate: CgraphGate) -> dict[str, Any]:
    buffer = int(max(s.sizes) * 1.2)
    window = throughput_window(buffer)
    if window["reason"]:
        log(f"  throughput: pipelined window {window['reason']}")
    k = window["k"]
    systems = {sy: guarded(sy, gate, lambda sy=sy: _throughput_one(sy, s, buffer, k)) for sy in SYSTEMS}
    return {"dag": THROUGHPUT_DAG.picture, "buffer_size_bytes": buffer, "max_inflight_executions": k,
            "window": window, "pipelined_repeats": s.pipelined_repeats,
            "pipelined_executions": {str(size): s.pipelined_iters(size) for size in s.sizes},
            "array_copies_per_execution": 2, "systems": systems}


def throughput_window(buffer: int) -> dict[str, Any]:
    """k for the pipelined runs: MAX_INFLIGHT_THROUGHPUT, or fewer when k slots of
    ``buffer`` bytes on every channel of the throughput DAG would not fit in half the
    free /dev/shm, half the available memory, or 3/4 of Ray's object store."""
    per_k = THROUGHPUT_DAG.channels * buffer  # one more slot on every channel
    room = {"half the free /dev/shm": shutil.disk_usage("/dev/shm").free // 2,
            "half the available memory": memory_available_bytes() // 2,
            "3/4 of Ray's object store": OBJECT_STORE_BYTES * 3 // 4}
    tightest = min(room, key=lambda name: room[name])
    k = max(1, min(MAX_INFLIGHT_THROUGHPUT, room[tightest] // per_k))
    reason = None
    if k < MAX_INFLIGHT_THROUGHPUT:
        reason = (f"k reduced from {MAX_INFLIGHT_THROUGHPUT} to {k}: {MAX_INFLIGHT_THROUGHPUT} slots x "
                  f"{THROUGHPUT_DAG.channels} channels x {buffer / MiB:.0f} MiB would not fit in {tightest} "
                  f"({room[tightest] / (1 << 30):.1f} GiB)")
    return {"k": k, "asked": MAX_INFLIGHT_THROUGHPUT, "reason": reason, "slot_bytes_per_k": per_k,
            "room_bytes": room}


def _throughput_one(system: str, s: Settings, buffer: int, k: int) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    with system_on_dag(system, THROUGHPUT_DAG, buffer, k) as (runner, _):
        for size in s.sizes:
            arr = np.ones(size, dtype=np.uint8)
            arr[-1] = 2
            first_run(runner, arr, (size, 1, 2), system)
            iters = s.throughput_iters(size)
            stats: dict[str, Any] = summarize_ns(time_calls(lambda a=arr: runner.run(a), iters, 3))
            stats["gbps"] = gb_per_s(size, stats["median_us"] / 1e6)
            stats["sustained_gbps"] = gb_per_s(size, stats["mean_us"] / 1e6)  # bytes x N / total time
            stats["pipelined"] = pipelined(runner, arr, k, s.pipelined_iters(size), s.pipelined_repeats)
            sizes[str(size)] = stats
            log(f"  throughput {system} {size // MiB} MiB: sequential median {stats['median_us'] / 1e3:.2f} ms, "
                f"{stats['gbps']:.2f} GB/s ({iters} runs); pipelined k={k} "
                f"{stats['pipelined']['gbps']:.2f} GB/s")
    return {"sizes": sizes, "teardown_s": runner.teardown_s}


def pipelined(runner: Runner, arr: Any, k: int, count: int, repeats: int) -> dict[str, Any]:
    """Sustained GB/s with ``k`` executions in flight: the median of ``repeats`` runs."""
    walls = [sliding_window(runner, arr, k, count) for _ in range(repeats)]
    gbps = [gb_per_s(arr.nbytes * count, wall) for wall in walls]
    return {"window": k, "executions": count, "repeats": repeats, "wall_s": walls, "gbps_each": gbps,
            "gbps": percentile(gbps, 50), "results_checked": count * repeats}


def sliding_window(runner: Runner, arr: Any, k: int, count: int) -> float:
    """Seconds for ``count`` executions of ``arr``, ``k`` in flight: submit ``k``, then
    read the oldest result and submit the next, until all are read.

    Before each submit the array's first and last bytes are set to the execution's
    number (every system copies its input at submit), and the result must echo them:
    a result read from the wrong slot, or an input overwritten too early, fails the run.
    """
    inflight: deque[tuple[int, Any]] = deque()

    def read_oldest() -> None:
        i, ref = inflight.popleft()
        got, want = tuple(runner.fetch(ref)), (arr.nbytes, i % 256, i // 256 % 256)
        if got != want:
            raise RuntimeError(f"pipelined execution {i} returned {got}, expected {want}")

    start = time.perf_counter()
    for i in range(count):
        if len(inflight) == k:
            read_oldest()
        arr[0], arr[-1] = i % 256, i // 256 % 256
        inflight.append((i, runner.submit(arr)))
    while inflight:
        read_oldest()
    return time.perf_counter() - start


def measure_idle_cpu(s: Settings, gate: CgraphGate) -> dict[str, Any]:
    spec = LATENCY_DAGS[1]  # chain3
    systems = {sy: guarded(sy, gate, lambda sy=sy: _idle_one(sy, spec, s)) for sy in SYSTEMS}
    for system, entry in systems.items():
        _log_system("idle cpu", system, entry)
    return {"dag": spec.picture, "idle_seconds": s.idle_seconds, "systems": systems}


def _idle_one(system: str, spec: DagSpec, s: Settings) -> dict[str, Any]:
    with system_on_dag(system, spec, BUFFER_LATENCY, MAX_INFLIGHT_LATENCY) as (runner, pids):
        first_run(runner, 1, 1, system)
        for _ in range(20):
            runner.run(1)
        time.sleep(0.5)  # let anything the executions started settle
        driver = os.getpid()
        cpu = measure_cpu_window([*pids, driver], s.idle_seconds)
    actors = [cpu.stat[p] for p in pids]
    return {"actor_percent": actors, "max_actor_percent": max(actors),
            "actor_percent_schedstat": [cpu.schedstat[p] for p in pids],
            "driver_percent": cpu.stat[driver], **thread_breakdown(pids, cpu.threads, LOOP_THREAD.get(system))}


def measure_compile(s: Settings, gate: CgraphGate) -> dict[str, Any]:
    spec = LATENCY_DAGS[1]  # chain3
    systems = {sy: guarded(sy, gate, lambda sy=sy: _compile_one(sy, spec, s)) for sy in COMPILED}
    for system, entry in systems.items():
        _log_system("compile", system, entry)
    return {"dag": spec.picture, "cycles": s.compile_cycles, "systems": systems}


def _compile_one(system: str, spec: DagSpec, s: Settings) -> dict[str, Any]:
    times: dict[str, list[float]] = {"compile_s": [], "first_execute_s": [], "teardown_s": []}
    with actor_group(spec.actors, import_torch=True) as (actors, _):
        for _ in range(s.compile_cycles):
            t0 = time.perf_counter()
            runner = open_runner(system, spec, actors, BUFFER_LATENCY, MAX_INFLIGHT_LATENCY, kill_actors=False)
            t1 = time.perf_counter()
            try:
                first_run(runner, 1, 1, system)
            finally:
                t2 = time.perf_counter()
                runner.close()
            t3 = t2 + (runner.teardown_s or 0.0)
            for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                times[key].append(value)
    out: dict[str, Any] = {f"median_{k}": percentile(v, 50) for k, v in times.items()}
    out.update(times)
    return out


def _log_system(what: str, system: str, entry: dict[str, Any]) -> None:
    if entry["status"] != "ok":
        log(f"  {what} {system}: {entry['status']}")
    elif "median_us" in entry:
        log(f"  {what} {system}: median {entry['median_us']:.1f} us, p99 {entry['p99_us']:.1f} us")
    elif "max_actor_percent" in entry:
        log(f"  {what} {system}: actors {', '.join(f'{p:.2f}%' for p in entry['actor_percent_schedstat'])} "
            f"(schedstat), driver {entry['driver_percent']:.1f}%")
    elif "median_compile_s" in entry:
        log(f"  {what} {system}: median compile {entry['median_compile_s']:.3f} s")


# ================================================================== main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n", 1)[0], SECTIONS, argv)
    s = QUICK if args.quick else FULL
    results = new_results("runtime", args, **asdict(s), environment=ENV, sections_run=args.sections)
    gate = CgraphGate()
    if gate.reason:
        log(gate.reason)
    results["host"]["background_busy_percent"] = system_busy_percent(1.0)
    results["host"]["load_average_1m"] = load_average()
    log(f"machine before the run: {results['host']['background_busy_percent']:.0f}% of all cores busy, "
        f"load average {results['host']['load_average_1m']:.2f}")
    for name in [n for n in args.sections if n not in RAY_SECTIONS]:  # forks: before Ray's threads
        run_section(results, name, {"floor": lambda: measure_floor(s), "memcpy": lambda: measure_memcpy(s)}[name])
    ray_sections = [n for n in args.sections if n in RAY_SECTIONS]
    if ray_sections:
        with ray_session(num_cpus=4, object_store_memory=OBJECT_STORE_BYTES):
            results["host"]["ray"] = ray.__version__
            table = {"latency": measure_latency, "throughput": measure_throughput,
                     "idle_cpu": measure_idle_cpu, "compile": measure_compile}
            for name in ray_sections:
                run_section(results, name, lambda fn=table[name]: fn(s, gate))
    results["targets"] = evaluate_targets(results)
    markdown = render_markdown(results)
    json_path, md_path = write_results(args.out, "runtime", results, markdown)
    print(markdown, flush=True)
    log(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
