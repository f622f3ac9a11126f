"""Runtime benchmark: cgraph next to Ray Compiled Graphs and plain Ray actor calls.

One run measures every system on the same DAGs, in one Ray session, and writes
medians, p99s and ratios to results/runtime.json and results/runtime.md:

    floor       two bare forked processes waking each other: a byte through two
                pipes, or two blocking os.eventfd's; a round trip = two wake-ups;
                the targets use the best of 10 batch medians (noise only adds)
    memcpy      single-core np.copyto of each array size into a pre-faulted POSIX
                shared-memory mapping (how a shm channel writes) and into an
                ordinary numpy array
    latency     one execute + get of the int 1, one at a time, on three DAGs:
                  echo     driver -> A -> driver                          hops 2
                  chain3   driver -> A -> B -> C -> driver                hops 4
                  fanout3  driver -> A, B, C -> D.combine(A, B, C) -> driver
                           (4 actors, 7 channels)                         hops 3
                hops = channel hops on the critical path, driver to driver;
                per-hop median = median round trip / hops
    throughput  a uint8 array through driver -> A.echo -> B.checksum -> driver;
                B returns (nbytes, first, last), so the array crosses two channels
                (two serial copies) and the driver gets a few bytes back.
                GB/s = array bytes / median time of one execute + get
                (1 GB = 1e9 B), next to memcpy into shm of the same size
    idle_cpu    % of a core used by each actor of a compiled chain3 that waits
                for input: utime+stime from /proc/<pid>/stat (pids from
                actor.getpid before compiling), and the same from
                /proc/<pid>/task/*/schedstat (ns resolution)
    compile     compile of chain3 on 3 existing actors that imported torch;
                median of several compile / first execute / teardown cycles

Systems: ``cgraph`` (cgraph.compile, compiled.execute(x).get()), ``ray_cgraph``
(dag.experimental_compile, ray.get(compiled.execute(x))) and ``ray_plain`` (the
same methods chained with .remote, one ray.get). Both compiled systems get the
same buffer_size_bytes and max_inflight_executions: 1 MiB and 10 (Ray's
defaults) for latency, 1.2x the largest array and 2 for throughput. Each
(system, DAG) pair gets fresh actors, killed afterwards. Until cgraph's runtime
can execute, its entries read "cgraph runtime not available: <error>".

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_runtime.py       # ~1.5 min, results/
    .venv/bin/python benchmarks/bench_runtime.py --quick                 # ~1 min, a temp folder
    .venv/bin/python benchmarks/bench_runtime.py --sections floor,latency --out /tmp/x

Most of a run is actors starting and importing torch; a --sections run rewrites
runtime.json with only those sections.
"""

from __future__ import annotations

import os
import sys
import time
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
    fmt,
    fmt_ratio,
    gb_per_s,
    load_average,
    log,
    markdown_table,
    measure_cpu_percent,
    new_results,
    ok_entry,
    parse_args,
    percentile,
    pingpong_round_trips,
    ray_session,
    run_section,
    status_note,
    summarize_ns,
    system_busy_percent,
    system_rows,
    time_calls,
    verdict,
    write_results,
)

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
MAX_INFLIGHT_THROUGHPUT = 2  # each slot holds the largest array: keep shared memory small
STEP_TIMEOUT_S = 300.0  # actor start-up or a first execute that takes longer fails
TEARDOWN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Settings:
    latency_iters: int
    latency_warmup: int
    floor_iters: int
    sizes: tuple[int, ...]
    throughput_bytes: int  # per size, iterations = clamp(throughput_bytes / size)
    throughput_min_iters: int
    throughput_max_iters: int
    memcpy_iters: int
    idle_seconds: float
    compile_cycles: int

    def throughput_iters(self, size: int) -> int:
        return max(self.throughput_min_iters, min(self.throughput_max_iters, self.throughput_bytes // size))


FULL = Settings(1000, 100, 20000, (1 * MiB, 16 * MiB, 100 * MiB), 3 << 30, 20, 300, 50, 3.0, 5)
QUICK = Settings(100, 10, 2000, (1 * MiB, 4 * MiB), 64 * MiB, 5, 30, 10, 1.0, 2)


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
    """One system ready to run one DAG: ``run(x)`` returns the DAG's result."""

    run: Callable[[Any], Any]
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
        return Runner(lambda x: ray.get(spec.call(actors, x)), lambda: None)
    with InputNode() as inp:
        dag = spec.bind(actors, inp)
    if system == "ray_cgraph":
        compiled = dag.experimental_compile(
            _buffer_size_bytes=buffer, _max_inflight_executions=inflight, _submit_timeout=300
        )
        return Runner(lambda x: ray.get(compiled.execute(x)), lambda: compiled.teardown(kill_actors=kill_actors))
    return _open_cgraph(dag, buffer, inflight)


def _open_cgraph(dag: Any, buffer: int, inflight: int) -> Runner:
    import cgraph

    try:
        compiled = cgraph.compile(dag, max_inflight_executions=inflight, buffer_size_bytes=buffer)
    except (NotImplementedError, AttributeError, ImportError) as exc:
        raise Unavailable(f"cgraph runtime not available: {describe_error(exc)}") from exc
    if not callable(getattr(compiled, "execute", None)):
        raise Unavailable(f"cgraph runtime not available: compile returned {type(compiled).__name__} "
                          "without execute()")
    return Runner(lambda x: compiled.execute(x).get(), compiled.teardown)


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
    if system == "cgraph" and gate.reason:
        return {"status": f"skipped: {gate.reason}"}
    try:
        return {"status": "ok", **fn()}
    except Unavailable as exc:
        gate.reason = str(exc)
        return {"status": f"skipped: {exc}"}
    except Exception as exc:  # noqa: BLE001 - one anchor failing must not end the section
        return {"status": f"failed: {describe_error(exc)}"}


# ================================================================== sections
FLOOR_BATCHES = 10


def measure_floor(s: Settings) -> dict[str, Any]:
    """Round trip between two forked processes: pipe and eventfd ping-pong.

    Other work on the two shared cores only ever adds to a wake-up, so the run is
    cut into batches and the floor the targets use is the best batch's median.
    """
    out: dict[str, Any] = {"iterations": s.floor_iters, "batches": FLOOR_BATCHES}
    for kind in ("pipe", "eventfd"):
        samples = pingpong_round_trips(kind, s.floor_iters, s.floor_iters // 10)
        step = len(samples) // FLOOR_BATCHES
        out[kind] = summarize_ns(samples)
        out[kind]["best_batch_median_us"] = min(
            percentile(samples[i:i + step], 50) / 1e3 for i in range(0, step * FLOOR_BATCHES, step))
        log(f"  floor {kind}: median {out[kind]['median_us']:.1f} us, p99 {out[kind]['p99_us']:.1f} us, "
            f"best batch median {out[kind]['best_batch_median_us']:.1f} us")
    out["floor_round_trip_us"] = min(out["pipe"]["best_batch_median_us"], out["eventfd"]["best_batch_median_us"])
    return out


def measure_memcpy(s: Settings) -> dict[str, Any]:
    """Single-core numpy copy into shared memory and into an ordinary buffer."""
    from multiprocessing import shared_memory

    out: dict[str, Any] = {"iterations": s.memcpy_iters, "sizes": {}}
    for size in s.sizes:
        src = np.ones(size, dtype=np.uint8)
        shm = shared_memory.SharedMemory(create=True, size=size)
        try:
            targets = {"shm": np.ndarray((size,), np.uint8, buffer=shm.buf), "numpy": np.empty_like(src)}
            row = {}
            for name, dst in targets.items():
                dst[:] = 0  # fault the pages in once: channels reuse their buffers
                ns = percentile(time_calls(lambda d=dst, a=src: np.copyto(d, a), s.memcpy_iters, 2), 50)
                row[f"{name}_gbps"] = gb_per_s(size, ns / 1e9)
                row[f"{name}_median_ms"] = ns / 1e6
            del targets, dst
        finally:
            shm.close()
            shm.unlink()
        out["sizes"][str(size)] = row
        log(f"  memcpy {size // MiB} MiB: shm {row['shm_gbps']:.2f} GB/s, numpy {row['numpy_gbps']:.2f} GB/s")
    return out


def measure_latency(s: Settings, gate: CgraphGate) -> dict[str, Any]:
    dags: dict[str, Any] = {}
    for spec in LATENCY_DAGS:
        entry: dict[str, Any] = {k: v for k, v in asdict(spec).items() if k not in ("bind", "call")}
        entry["systems"] = {}
        for system in SYSTEMS:
            entry["systems"][system] = guarded(system, gate, lambda sy=system, sp=spec: _latency_one(sy, sp, s))
            _log_system(f"latency {spec.name}", system, entry["systems"][system])
        dags[spec.name] = entry
    return {"iterations": s.latency_iters, "warmup": s.latency_warmup, "payload": "int 1",
            "buffer_size_bytes": BUFFER_LATENCY, "max_inflight_executions": MAX_INFLIGHT_LATENCY,
            "dags": dags}


def _latency_one(system: str, spec: DagSpec, s: Settings) -> dict[str, Any]:
    with system_on_dag(system, spec, BUFFER_LATENCY, MAX_INFLIGHT_LATENCY) as (runner, _):
        expected = 3 if spec.name == "fanout3" else 1
        first_run(runner, 1, expected, system)
        stats = summarize_ns(time_calls(lambda: runner.run(1), s.latency_iters, s.latency_warmup))
    stats["per_hop_median_us"] = stats["median_us"] / spec.hops
    stats["teardown_s"] = runner.teardown_s
    return stats


def measure_throughput(s: Settings, gate: CgraphGate) -> dict[str, Any]:
    buffer = int(max(s.sizes) * 1.2)
    systems = {sy: guarded(sy, gate, lambda sy=sy: _throughput_one(sy, s, buffer)) for sy in SYSTEMS}
    return {"dag": THROUGHPUT_DAG.picture, "buffer_size_bytes": buffer,
            "max_inflight_executions": MAX_INFLIGHT_THROUGHPUT,
            "array_copies_per_execution": 2, "systems": systems}


def _throughput_one(system: str, s: Settings, buffer: int) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    with system_on_dag(system, THROUGHPUT_DAG, buffer, MAX_INFLIGHT_THROUGHPUT) as (runner, _):
        for size in s.sizes:
            arr = np.ones(size, dtype=np.uint8)
            arr[-1] = 2
            first_run(runner, arr, (size, 1, 2), system)
            iters = s.throughput_iters(size)
            stats = summarize_ns(time_calls(lambda a=arr: runner.run(a), iters, 3))
            stats["gbps"] = gb_per_s(size, stats["median_us"] / 1e6)
            sizes[str(size)] = stats
            log(f"  throughput {system} {size // MiB} MiB: median {stats['median_us'] / 1e3:.2f} ms, "
                f"{stats['gbps']:.2f} GB/s ({iters} runs)")
    return {"sizes": sizes, "teardown_s": runner.teardown_s}


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
        percent = measure_cpu_percent([*pids, driver], s.idle_seconds)
    actors = [percent["stat"][p] for p in pids]
    return {"actor_percent": actors, "max_actor_percent": max(actors),
            "actor_percent_schedstat": [percent["schedstat"][p] for p in pids],
            "driver_percent": percent["stat"][driver]}


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


# ================================================================== targets and report
LABELS = {"cgraph": "cgraph", "ray_cgraph": "Ray Compiled Graphs", "ray_plain": "plain Ray calls"}


def _target(name: str, requirement: str, cgraph: str, anchor: str, ok: bool | None) -> dict[str, Any]:
    return {"target": name, "requirement": requirement, "cgraph": cgraph, "anchor": anchor,
            "verdict": verdict(ok)}


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with cgraph's value, the anchor's, and PASS/MISS/n/a."""
    sec = results["sections"]
    floor = ok_entry(sec.get("floor"))
    floor_rt = floor["floor_round_trip_us"] if floor else None
    rows = []
    for dag, entry in (ok_entry(sec.get("latency")) or {}).get("dags", {}).items():
        rows += _latency_targets(dag, entry["systems"], floor_rt)
    rows.append(_throughput_target(ok_entry(sec.get("throughput")), ok_entry(sec.get("memcpy"))))
    idle = (ok_entry(sec.get("idle_cpu")) or {}).get("systems", {})
    cg, anchor = ok_entry(idle.get("cgraph")), ok_entry(idle.get("ray_cgraph"))
    rows.append(_target("idle actor CPU", "< 1% of a core (max over actors)",
                        fmt(cg and cg["max_actor_percent"], 2, "%"),
                        f"Ray CG {fmt(anchor and anchor['max_actor_percent'], 1, '%')}",
                        cg and cg["max_actor_percent"] < 1.0))
    comp = (ok_entry(sec.get("compile")) or {}).get("systems", {})
    cg, anchor = ok_entry(comp.get("cgraph")), ok_entry(comp.get("ray_cgraph"))
    rows.append(_target("compile chain3", "< 1 s (median)", fmt(cg and cg["median_compile_s"], 3, "s"),
                        f"Ray CG {fmt(anchor and anchor['median_compile_s'], 3, 's')}",
                        cg and cg["median_compile_s"] < 1.0))
    return rows


def _latency_targets(dag: str, systems: dict[str, Any], floor_rt: float | None) -> list[dict[str, Any]]:
    cg, anchor = ok_entry(systems.get("cgraph")), ok_entry(systems.get("ray_cgraph"))
    need = anchor["median_us"] / 4 if anchor else None
    hop_need = 3 * floor_rt if floor_rt else None
    anchor_p99 = anchor and anchor["p99_us"] / anchor["median_us"]
    return [
        _target(f"latency {dag}", f"median <= 1/4 of Ray CG (<= {fmt(need, 1, 'us')})",
                fmt(cg and cg["median_us"], 1, "us"), f"Ray CG {fmt(anchor and anchor['median_us'], 1, 'us')}",
                cg and need and cg["median_us"] <= need),
        _target(f"per-hop {dag}", f"<= 3x bare wake-up round trip (<= {fmt(hop_need, 1, 'us')})",
                fmt(cg and cg["per_hop_median_us"], 1, "us"),
                f"Ray CG {fmt(anchor and anchor['per_hop_median_us'], 1, 'us')}",
                cg and hop_need and cg["per_hop_median_us"] <= hop_need),
        _target(f"p99 {dag}", "p99 <= 5x own median", fmt_ratio(cg and cg["p99_us"] / cg["median_us"]),
                f"Ray CG {fmt_ratio(anchor_p99)}", cg and cg["p99_us"] <= 5 * cg["median_us"]),
    ]


def _throughput_target(tput: dict[str, Any] | None, memcpy: dict[str, Any] | None) -> dict[str, Any]:
    name = "throughput, largest array"
    if not tput or not memcpy:
        return _target(name, ">= 50% of memcpy into shm", "-", "-", None)
    size = max(int(k) for k in memcpy["sizes"])
    ref = memcpy["sizes"][str(size)]["shm_gbps"]

    def share(system: str) -> float | None:
        entry = ok_entry(tput["systems"].get(system))
        row = entry and entry["sizes"].get(str(size))
        return row["gbps"] / ref if row else None

    cg, anchor = share("cgraph"), share("ray_cgraph")
    return _target(f"{name} ({size // MiB} MiB)", f">= 50% of memcpy into shm ({ref:.2f} GB/s)",
                   fmt(cg and 100 * cg, 0, "%"), f"Ray CG {fmt(anchor and 100 * anchor, 0, '%')}",
                   cg and cg >= 0.5)


def render_markdown(results: dict[str, Any]) -> str:
    """runtime.md: the targets, one table per section, notes, and the definitions."""
    host, sec = results["host"], results["sections"]
    parts = [
        "# Runtime: cgraph vs Ray Compiled Graphs vs plain Ray",
        f"Measured {results['created']} on {host['cpu_model']} ({host['cpu_count']} cores), "
        f"Python {host['python']}, Ray {host.get('ray', '?')}, numpy {host.get('numpy', '?')}; "
        f"`{results['command']}`" + (" (**quick run: few iterations, small arrays**)" if results["quick"] else "")
        + ". All systems measured in this one run; every (system, DAG) pair on fresh actors. "
        f"Before the run {fmt(host.get('background_busy_percent'), 0, '%')} of all cores were busy "
        f"(load average {fmt(host.get('load_average_1m'), 2)}): the machine is shared, so "
        "absolute numbers move between runs; compare the ratios within one run.",
        "## Targets",
        markdown_table(["target", "requirement", "cgraph", "anchor", "verdict"],
                       [list(t.values()) for t in results.get("targets", [])]),
    ]
    for title, render in (("Round-trip latency", _md_latency), ("Throughput of numpy arrays", _md_throughput),
                          ("Physical floor: bare wake-up round trip", _md_floor),
                          ("Idle CPU of a compiled 3-actor chain", _md_idle), ("Compile time", _md_compile)):
        parts += [f"## {title}", render(sec)]
    notes = _notes(sec)
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    definitions = __doc__.split("\n\n", 2)[2].rsplit("\n\n", 1)[0]
    return "\n\n".join([*parts, "## Definitions", f"```\n{definitions}\n```"])


def _md_latency(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "latency"):
        return status
    rows = []
    for dag, entry in sec["latency"]["dags"].items():
        anchor = ok_entry(entry["systems"].get("ray_cgraph"))

        def cells(r: dict[str, Any], anchor: dict[str, Any] | None = anchor) -> list[list[str]]:
            return [[fmt(r["median_us"]), fmt(r["p99_us"]), fmt(r["per_hop_median_us"]),
                     fmt_ratio(r["p99_us"] / r["median_us"]),
                     fmt_ratio(r["median_us"] / anchor["median_us"]) if anchor else "-"]]

        rows += system_rows([f"{dag} ({entry['hops']} hops)"], entry["systems"], LABELS, 7, cells)
    return (f"Microseconds, {sec['latency']['iterations']} executions per row after warm-up.\n\n"
            + markdown_table(["DAG", "system", "median us", "p99 us", "per-hop median us", "p99/median",
                              "median vs Ray CG"], rows))


def _md_throughput(sec: dict[str, Any]) -> str:
    tput, memcpy = ok_entry(sec.get("throughput")), ok_entry(sec.get("memcpy"))
    refs = (memcpy or {}).get("sizes", {})
    rows = [[name, "all", status, "", "", ""] for name in ("throughput", "memcpy")
            if (status := status_note(sec, name))]

    def cells(entry: dict[str, Any]) -> list[list[str]]:
        return [[f"{int(size) // MiB} MiB", fmt(r["median_us"] / 1e3, 2), fmt(r["p99_us"] / 1e3, 2),
                 fmt(r["gbps"], 2),
                 fmt(100 * r["gbps"] / refs[size]["shm_gbps"], 0, "%") if size in refs else "-"]
                for size, r in entry["sizes"].items()]

    rows += system_rows([], (tput or {}).get("systems", {}), LABELS, 6, cells)
    for size, ref in refs.items():
        rows += [[f"memcpy into {dst} (1 core)", f"{int(size) // MiB} MiB", fmt(ref[f"{dst}_median_ms"], 2), "",
                  fmt(ref[f"{dst}_gbps"], 2), "100%" if dst == "shm" else ""] for dst in ("shm", "numpy")]
    return (f"`{THROUGHPUT_DAG.picture}`; GB/s = array bytes / median execution time (1 GB = 1e9 B).\n\n"
            + markdown_table(["system", "array", "median ms", "p99 ms", "GB/s", "% of memcpy into shm"], rows))


def _md_floor(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "floor"):
        return status
    floor = sec["floor"]
    rows = [[kind, fmt(floor[kind]["median_us"]), fmt(floor[kind]["p99_us"]), fmt(floor[kind]["min_us"]),
             fmt(floor[kind]["best_batch_median_us"])] for kind in ("pipe", "eventfd")]
    return (f"Two forked processes, {floor['iterations']} round trips each in {floor['batches']} batches; "
            "other work on the shared cores only adds to a wake-up, so the floor the targets use is the "
            f"best batch median of the cheaper primitive: {floor['floor_round_trip_us']:.1f} us.\n\n"
            + markdown_table(["primitive", "median us", "p99 us", "min us", "best batch median us"], rows))


def _md_idle(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "idle_cpu"):
        return status

    def cells(r: dict[str, Any]) -> list[list[str]]:
        return [[", ".join(fmt(p, 1, "%") for p in r["actor_percent"]), fmt(r["max_actor_percent"], 1, "%"),
                 ", ".join(fmt(p, 2, "%") for p in r["actor_percent_schedstat"]), fmt(r["driver_percent"], 1, "%")]]

    rows = system_rows([], sec["idle_cpu"]["systems"], LABELS, 5, cells)
    return (f"% of one core over {sec['idle_cpu']['idle_seconds']:g} s after 20 executions (plain Ray: the "
            "same actors, nothing compiled). /proc/<pid>/stat counts 10 ms ticks.\n\n"
            + markdown_table(["system", "each actor (stat)", "max actor (stat)", "each actor (schedstat)",
                              "driver (stat)"], rows))


def _md_compile(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "compile"):
        return status

    def cells(r: dict[str, Any]) -> list[list[str]]:
        return [[fmt(r["median_compile_s"], 3), fmt(r["median_first_execute_s"], 3),
                 fmt(r["median_teardown_s"], 3), ", ".join(f"{t:.3f}" for t in r["compile_s"])]]

    rows = system_rows([], sec["compile"]["systems"], LABELS, 5, cells)
    return (f"Seconds; chain3 on 3 existing actors, {sec['compile']['cycles']} cycles.\n\n"
            + markdown_table(["system", "median compile s", "median first execute s", "median teardown s",
                              "each compile s"], rows))


def _notes(sec: dict[str, Any]) -> list[str]:
    """What a reader of the tables should know, derived from this run's numbers."""
    notes = []
    tput = (ok_entry(sec.get("throughput")) or {}).get("systems", {})
    ray_tput = ok_entry(tput.get("ray_cgraph"))
    if ray_tput and (ray_tput.get("teardown_s") or 0) > 4:
        notes.append(f"Ray Compiled Graphs' teardown of the throughput graph did not finish: after "
                     f"RAY_CGRAPH_teardown_timeout={ENV['RAY_CGRAPH_teardown_timeout']} s it killed the actors "
                     f"({ray_tput['teardown_s']:.1f} s).")
    if tput:
        notes.append("The array crosses two channels one after the other, so an executor that copies it "
                     "at memcpy speed on both hops reaches 50% of memcpy; more needs fewer copies.")
    plain = ok_entry((ok_entry(sec.get("idle_cpu")) or {}).get("systems", {}).get("ray_plain"))
    if plain:
        notes.append(f"For scale: an idle plain Ray actor with nothing compiled uses up to "
                     f"{max(plain['actor_percent_schedstat']):.2f}% of a core (Ray's own threads, schedstat).")
    return notes


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
        with ray_session(num_cpus=4, object_store_memory=2 << 30):
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
