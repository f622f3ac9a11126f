"""Shared helpers for the benchmark scripts in ``benchmarks/`` (bench_*.py).

Every script follows one shape, so ``run_all.py`` can drive them all:

    args = parse_args("what it measures", SECTIONS)       # --quick --sections --out
    env = configure_environment()                         # before importing ray
    results = new_results("runtime", args)
    run_section(results, "floor", lambda: measure_floor(...))   # never raises
    write_results(args.out, "runtime", results, markdown)       # NAME.json + NAME.md

What lives here: the timing loop and percentiles, the pipe/eventfd ping-pong
floor, the /proc CPU readers (per process, per thread and machine-wide), a Ray
session that always shuts down, a call with a time limit (for anchors that can
hang), Markdown tables, PASS/MISS verdicts and the results writer. Timings are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# --quick runs write here unless --out says otherwise, so a smoke run never
# overwrites the results the README quotes.
QUICK_RESULTS_DIR = Path(tempfile.gettempdir()) / "cgraph-bench-quick"
_T0 = time.monotonic()


# ---------------------------------------------------------------- environment
def configure_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Set the environment every benchmark needs; call it before ``import ray``.

    OMP_NUM_THREADS=1 (two shared cores), plus ``extra`` (e.g. Ray's
    ``RAY_CGRAPH_*`` knobs, which Ray reads when ``ray.dag`` is first imported and
    which the actor processes inherit from ``ray.init``). Existing values win, so a
    caller can override from the shell. Returns what is in effect.
    """
    wanted = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(extra or {})}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


def host_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
    }
    for name in ("ray", "numpy", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            info[name] = getattr(module, "__version__", "?")
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------- progress
def log(message: str) -> None:
    """One progress line on stdout, stamped with seconds since the script started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


# ---------------------------------------------------------------- timing
def time_calls(fn: Callable[[], Any], iterations: int, warmup: int = 0) -> list[int]:
    """Call ``fn`` ``warmup`` times untimed, then ``iterations`` times; ns per call."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter_ns
    samples = [0] * iterations
    for i in range(iterations):
        start = clock()
        fn()
        samples[i] = clock() - start
    return samples


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize_ns(samples_ns: Sequence[int]) -> dict[str, float]:
    """Median, p99, min and mean of ns samples, in microseconds, plus the count."""
    us = [s / 1e3 for s in samples_ns]
    return {
        "n": len(us),
        "median_us": percentile(us, 50),
        "p99_us": percentile(us, 99),
        "min_us": min(us) if us else math.nan,
        "mean_us": sum(us) / len(us) if us else math.nan,
    }


def gb_per_s(nbytes: int, seconds: float) -> float:
    """Decimal GB/s (1 GB = 1e9 bytes)."""
    return nbytes / seconds / 1e9 if seconds > 0 else math.nan


# ---------------------------------------------------------------- physical floor
def pingpong_round_trips(kind: str, iterations: int, warmup: int = 0,
                         cpus: tuple[int, int] | None = None) -> list[int]:
    """ns per round trip between this process and a forked child: the kernel's wake-up floor.

    ``kind``: "pipe" (one byte each way through two pipes) or "eventfd" (two
    blocking eventfds). ``cpus``: (this thread's CPU, the child's CPU) to pin
    them to for the measurement; None leaves placement to the scheduler. Fork
    before starting threads (Ray, torch): the child runs only these system calls
    and leaves with ``os._exit``.
    """
    if kind == "pipe":
        (to_child_r, to_child_w), (to_parent_r, to_parent_w) = os.pipe(), os.pipe()

        def send(fd: int) -> None:
            os.write(fd, b"x")

        def recv(fd: int) -> None:
            os.read(fd, 1)
    else:
        to_child_r = to_child_w = os.eventfd(0)
        to_parent_r = to_parent_w = os.eventfd(0)

        def send(fd: int) -> None:
            os.eventfd_write(fd, 1)

        def recv(fd: int) -> None:
            os.eventfd_read(fd)

    total = iterations + warmup
    pid = os.fork()
    if pid == 0:  # the child: answer every ping, then leave without cleanup
        try:
            if cpus is not None:
                os.sched_setaffinity(0, {cpus[1]})
            for _ in range(total):
                recv(to_child_r)
                send(to_parent_w)
        finally:
            os._exit(0)

    def round_trip() -> None:
        send(to_child_w)
        recv(to_parent_r)

    before = os.sched_getaffinity(0)
    try:
        if cpus is not None:
            os.sched_setaffinity(0, {cpus[0]})
        samples = time_calls(round_trip, iterations, warmup)
    finally:
        os.sched_setaffinity(0, before)
        os.waitpid(pid, 0)
        for fd in {to_child_r, to_child_w, to_parent_r, to_parent_w}:
            os.close(fd)
    return samples


def pingpong_floor(iterations: int, batches: int = 10) -> dict[str, Any]:
    """Round trip between two forked processes: pipe and eventfd ping-pong.

    Other work on shared cores only ever adds to a wake-up, so the run is cut into
    ``batches``; the pipe is also timed with both processes pinned to one CPU and to
    two. ``floor_round_trip_us`` is the cheapest of these: the best batch median of
    either primitive or the one-CPU median. Fork before starting threads.
    """
    out: dict[str, Any] = {"iterations": iterations, "batches": batches}
    for kind in ("pipe", "eventfd"):
        samples = pingpong_round_trips(kind, iterations, iterations // 10)
        step = len(samples) // batches
        out[kind] = summarize_ns(samples)
        out[kind]["best_batch_median_us"] = min(
            percentile(samples[i:i + step], 50) / 1e3 for i in range(0, step * batches, step))
        log(f"  floor {kind}: median {out[kind]['median_us']:.1f} us, p99 {out[kind]['p99_us']:.1f} us, "
            f"best batch median {out[kind]['best_batch_median_us']:.1f} us")
    allowed = sorted(os.sched_getaffinity(0))
    placements = {"pipe_one_cpu": (allowed[-1], allowed[-1])}
    if len(allowed) > 1:
        placements["pipe_two_cpus"] = (allowed[0], allowed[-1])
    for name, cpus in placements.items():  # where each process runs, made explicit
        out[name] = summarize_ns(pingpong_round_trips("pipe", iterations, iterations // 10, cpus))
        out[name]["cpus"] = list(cpus)
        log(f"  floor {name} {cpus}: median {out[name]['median_us']:.1f} us, p99 {out[name]['p99_us']:.1f} us")
    # the cheapest wake-up seen anywhere: where the scheduler placed the two, or both on one CPU
    out["floor_round_trip_us"] = min(out["pipe"]["best_batch_median_us"], out["eventfd"]["best_batch_median_us"],
                                     out["pipe_one_cpu"]["median_us"])
    return out


# ---------------------------------------------------------------- CPU of processes
def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/<pid>/stat, in seconds (all its threads).

    The kernel counts these in clock ticks (10 ms at the usual 100 Hz), so over 3 s
    one tick is 0.33% of a core; ``thread_samples`` has ns resolution.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces or ')'; the fields after the last ')'
    # start at field 3 (state), so utime (14) and stime (15) are indices 11 and 12.
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- CPU of threads
class ThreadSample(NamedTuple):
    """One thread read once: its name, ns on CPU (schedstat), voluntary context switches."""

    comm: str
    run_ns: int
    voluntary_switches: int


@dataclass(frozen=True)
class ThreadCpu:
    """One thread over a window: % of a core, and wake-ups per second (voluntary
    context switches: each is the thread going to sleep, so one wake-up later)."""

    tid: int
    name: str
    percent: float
    wakeups_per_s: float


@dataclass(frozen=True)
class CpuWindow:
    """``measure_cpu_window``: per pid, % of a core (stat ticks, schedstat ns) and per thread."""

    seconds: float
    stat: dict[int, float]
    schedstat: dict[int, float]
    threads: dict[int, list[ThreadCpu]]  # busiest first


def thread_samples(pid: int) -> dict[int, ThreadSample]:
    """Each live thread of ``pid`` by tid; a thread that exits while it is read is left
    out, and a process that has exited gives {}."""
    try:
        tids = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return {}
    out: dict[int, ThreadSample] = {}
    for tid in tids:
        base = Path(f"/proc/{pid}/task/{tid}")
        try:
            comm = (base / "comm").read_text().strip()
            run_ns = int((base / "schedstat").read_text().split()[0])
            status = (base / "status").read_text()
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue  # the thread exited meanwhile
        switches = next((int(line.split()[1]) for line in status.splitlines()
                         if line.startswith("voluntary_ctxt_switches:")), 0)
        out[tid] = ThreadSample(comm, run_ns, switches)
    return out


def measure_cpu_window(pids: Sequence[int], seconds: float) -> CpuWindow:
    """CPU of each process over one window of ``seconds``, read three ways at the same
    instants: stat ticks, the sum of its threads' schedstat ns, and per thread.

    A thread counts when alive at the end (one born inside the window from zero); one
    that exited inside it is missing from both the per-thread and the schedstat sum.
    """
    def read() -> dict[int, tuple[float, dict[int, ThreadSample]]]:  # raises if a process has exited
        return {pid: (process_cpu_seconds(pid), thread_samples(pid)) for pid in pids}

    start_wall = time.monotonic()
    before = read()
    time.sleep(seconds)
    after = read()
    wall = time.monotonic() - start_wall
    zero = ThreadSample("", 0, 0)
    stat, schedstat, threads = {}, {}, {}
    for pid in pids:
        (t0, th0), (t1, th1) = before[pid], after[pid]
        stat[pid] = 100.0 * (t1 - t0) / wall
        run_ns = sum(t.run_ns for t in th1.values()) - sum(t.run_ns for t in th0.values())
        schedstat[pid] = 100.0 * run_ns / 1e9 / wall
        rows = [ThreadCpu(tid, s.comm, 100.0 * (s.run_ns - th0.get(tid, zero).run_ns) / 1e9 / wall,
                          (s.voluntary_switches - th0.get(tid, zero).voluntary_switches) / wall)
                for tid, s in th1.items()]
        threads[pid] = sorted(rows, key=lambda r: r.percent, reverse=True)
    return CpuWindow(wall, stat, schedstat, threads)


def thread_breakdown(pids: Sequence[int], threads: dict[int, list[ThreadCpu]], loop_prefix: str | None,
                     top: int = 3) -> dict[str, Any]:
    """Each process's threads split three ways, one list entry per pid:

    - the main thread (tid == pid): in a Ray actor, the core worker's task loop,
      which checks for Python signals every 10 ms;
    - the loop thread(s): comm starting with ``loop_prefix`` (None: none named, and
      None also where no thread matched);
    - every other thread (gRPC pollers, Ray's io and timer threads, ...).

    ``top_threads``: the ``top`` busiest threads of each, [name, %, wake-ups/s].
    """
    def total(ts: list[ThreadCpu], wakeups: bool = False) -> float | None:
        return round(sum(t.wakeups_per_s if wakeups else t.percent for t in ts), 1 if wakeups else 4) if ts else None

    out: dict[str, list[Any]] = {}
    for pid in pids:
        rows = threads.get(pid, [])
        main = [t for t in rows if t.tid == pid]
        loop = [t for t in rows if t.tid != pid and loop_prefix and t.name.startswith(loop_prefix)]
        other = [t for t in rows if t not in main and t not in loop]
        for key, value in (("main_thread_percent", total(main)), ("main_thread_wakeups_per_s", total(main, True)),
                           ("loop_thread_percent", total(loop)), ("loop_thread_wakeups_per_s", total(loop, True)),
                           ("other_threads_percent", total(other) or 0.0),
                           ("top_threads", [[t.name, round(t.percent, 4), round(t.wakeups_per_s, 1)]
                                            for t in rows[:top]])):
            out.setdefault(key, []).append(value)
    return {"loop_thread_prefix": loop_prefix, **out}


def system_busy_percent(seconds: float) -> float:
    """Percent of all cores busy (anything, any process) over ``seconds``, from /proc/stat."""
    def sample() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values[:8]) - idle, sum(values[:8])

    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    return 100.0 * (busy1 - busy0) / max(1, total1 - total0)


def load_average() -> float:
    """The 1-minute load average (runnable processes), to flag a busy shared machine."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def memory_available_bytes() -> int:
    """MemAvailable from /proc/meminfo: what can be allocated without swapping."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    return 0


# ---------------------------------------------------------------- guarded calls
class CallTimeout(RuntimeError):
    """``call_with_timeout`` gave up waiting (the call may still be running)."""


def call_with_timeout(fn: Callable[[], Any], seconds: float, what: str = "call") -> Any:
    """Run ``fn`` in a daemon thread; raise ``CallTimeout`` after ``seconds``.

    For anchors that can hang (a compile, a first execute, a teardown): the
    benchmark reports the failure and moves on instead of hanging the whole run.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"bench-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CallTimeout(f"{what} did not finish within {seconds:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def describe_error(exc: BaseException) -> str:
    """One line: the exception type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


# ---------------------------------------------------------------- Ray session
@contextlib.contextmanager
def ray_session(num_cpus: int = 4, **kwargs: Any) -> Iterator[Any]:
    """``ray.init`` with small explicit resources and no dashboard; always shuts down."""
    import ray

    options: dict[str, Any] = {
        "address": "local",  # a new instance even if /tmp/ray names a stale one (RAY_ADDRESS wins)
        "num_cpus": num_cpus,
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": True,
        "logging_level": "warning",
    }
    options.update(kwargs)
    ray.init(**options)
    try:
        yield ray
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- results
def parse_args(description: str, sections: Sequence[str], argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags every bench script takes: --quick, --sections a,b, --out DIR."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="few iterations and small sizes: a smoke run in seconds")
    parser.add_argument(
        "--sections",
        default=",".join(sections),
        help=f"comma-separated subset of: {','.join(sections)} (default: all)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"results folder (default: {RESULTS_DIR}; with --quick: {QUICK_RESULTS_DIR})",
    )
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(sections)}")
    args.sections = [s for s in sections if s in chosen]  # run in the script's order
    args.out = Path(args.out) if args.out else (QUICK_RESULTS_DIR if args.quick else RESULTS_DIR)
    return args


def new_results(name: str, args: argparse.Namespace, **settings: Any) -> dict[str, Any]:
    """The skeleton every results JSON shares."""
    return {
        "benchmark": name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "quick": bool(args.quick),
        "host": host_info(),
        "settings": settings,
        "sections": {},
    }


def run_section(results: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one section; record its dict, or ``status: "failed: <reason>"``. Never raises."""
    log(f"section {name}: start")
    start, load_before = time.monotonic(), load_average()
    try:
        body = fn()
        section = {"status": "ok", **body}
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - one failing section must not end the run
        section = {"status": f"failed: {describe_error(exc)}", "traceback": traceback.format_exc()}
        log(f"section {name}: FAILED {describe_error(exc)}")
    section["elapsed_s"] = round(time.monotonic() - start, 2)
    section["load_average_1m"] = [load_before, load_average()]
    results["sections"][name] = section
    log(f"section {name}: {section['status']} ({section['elapsed_s']}s)")
    return section


def verdict(ok: bool | None) -> str:
    """PASS / MISS, or n/a when the value could not be measured."""
    if ok is None:
        return "n/a"
    return "PASS" if ok else "MISS"


def write_results(out_dir: Path, name: str, results: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    """Write ``NAME.json`` and ``NAME.md`` into ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    md_path = out_dir / f"{name}.md"
    json_path.write_text(json.dumps(results, indent=2, sort_keys=False, default=_json_default) + "\n")
    md_path.write_text(markdown.rstrip() + "\n")
    return json_path, md_path


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return repr(value)


# ---------------------------------------------------------------- formatting
def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; numbers are expected already formatted as text."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Any, digits: int = 1, unit: str = "") -> str:
    """A number for a table: fixed digits, '-' when missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, (int, float)):
        text = f"{value:,.{digits}f}"
        return text + unit if unit == "%" else f"{text} {unit}".rstrip()
    return str(value)


def ok_entry(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The entry when its status is "ok", else None (for ``x and x["median_us"]``)."""
    return entry if entry and entry.get("status") == "ok" else None


def status_note(sections: dict[str, Any], name: str) -> str | None:
    """None when section ``name`` ran fine, else an italic line saying why not."""
    entry = sections.get(name)
    return "_not run_" if entry is None else None if entry["status"] == "ok" else f"_{entry['status']}_"


def system_rows(prefix: list[str], systems: dict[str, Any], labels: dict[str, str], width: int,
                cells: Callable[[dict[str, Any]], list[list[str]]]) -> list[list[str]]:
    """Table rows, ``cells(entry)`` per system that ran; one with its status per one that did not."""
    rows: list[list[str]] = []
    for system, entry in systems.items():
        label = labels.get(system, system)
        if entry["status"] != "ok":
            rows.append([*prefix, label, entry["status"], *[""] * (width - len(prefix) - 2)])
        else:
            rows += [[*prefix, label, *row] for row in cells(entry)]
    return rows


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}x"
