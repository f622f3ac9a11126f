"""Run every benchmark script (benchmarks/bench_*.py) in sequence and collect the results.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/run_all.py            # full runs
    .venv/bin/python benchmarks/run_all.py --quick                      # smoke runs
    .venv/bin/python benchmarks/run_all.py --only runtime,channels --summary /tmp/all.json

Each script runs in its own process (one at a time: the machine has two cores),
with ``--quick`` passed through. Results land where each script writes them:
``benchmarks/results/NAME.json`` (NAME = the script's name without ``bench_``),
or under ``--out DIR``; a quick run defaults to a temporary folder so it never
overwrites the results the README quotes. Scripts built on ``common.py`` take a
folder for ``--out``, the others a file, and each gets the form it expects. A
script that fails or times out is reported and the next one still runs. The
collected JSON (every script's status, time and results) is printed as a table and
written to ``--summary`` when given. Exit status: 1 if any script failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import QUICK_RESULTS_DIR, RESULTS_DIR, log, markdown_table  # noqa: E402

HERE = Path(__file__).resolve().parent


def discover(only: list[str] | None) -> list[Path]:
    """bench_*.py in this folder, sorted; ``only`` filters by NAME (runtime, channels...)."""
    scripts = sorted(HERE.glob("bench_*.py"))
    if only:
        scripts = [p for p in scripts if short_name(p) in only]
    return scripts


def short_name(script: Path) -> str:
    return script.stem.removeprefix("bench_")


def takes_folder(script: Path) -> bool:
    """Scripts built on common.parse_args take a folder for --out; the others a file."""
    return "common import" in script.read_text()  # ``from common`` or ``from benchmarks.common``


def stream(command: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run ``command``, echoing its output as it comes; (exit status or None on timeout, tail).

    The script runs in its own process group, so a timeout also ends the Ray
    processes it started (SIGTERM, then SIGKILL 10 s later).
    """
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen(command, env=env, cwd=HERE.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue

    timer = threading.Timer(timeout, stop)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"    | {line}", end="", flush=True)
            tail.append(line)
        proc.wait()
    finally:
        timer.cancel()
    return (None if timed_out.is_set() else proc.returncode), "".join(tail)


def run_one(script: Path, quick: bool, out_dir: Path | None, timeout: float) -> dict[str, Any]:
    """Run one script; returns its status, time and collected results."""
    name = short_name(script)
    result_file = (out_dir or RESULTS_DIR) / f"{name}.json"
    command = [sys.executable, str(script)] + (["--quick"] if quick else [])
    if out_dir is not None:
        command += ["--out", str(out_dir if takes_folder(script) else result_file)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log(f"{name}: {' '.join(command[1:])}")
    start = time.monotonic()
    returncode, tail = stream(command, env, timeout)
    status = "ok" if returncode == 0 else (
        f"failed: timed out after {timeout:g}s" if returncode is None else f"failed: exit status {returncode}")
    elapsed = time.monotonic() - start
    entry: dict[str, Any] = {"script": script.name, "status": status, "elapsed_s": round(elapsed, 1),
                             "result_file": str(result_file)}
    if result_file.exists() and result_file.stat().st_mtime >= time.time() - elapsed - 1:
        entry["results"] = json.loads(result_file.read_text())
    elif status == "ok":
        entry["status"] = f"ok, but no fresh {result_file.name}"
    if not status.startswith("ok"):
        entry["output_tail"] = tail
    log(f"{name}: {entry['status']} ({elapsed:.1f}s)")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    parser.add_argument("--out", default=None,
                        help=f"results folder (default: each script's own, {RESULTS_DIR}; "
                             f"with --quick: {QUICK_RESULTS_DIR})")
    parser.add_argument("--only", default="", help="comma-separated NAMEs, e.g. runtime,channels")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per script (default 900)")
    parser.add_argument("--summary", default=None, help="also write the collected results to this JSON file")
    args = parser.parse_args(argv)
    out_dir = Path(args.out) if args.out else (QUICK_RESULTS_DIR if args.quick else None)
    only = [n.strip() for n in args.only.split(",") if n.strip()] or None
    scripts = discover(only)
    if not scripts:
        log(f"no benchmark scripts matched {args.only!r} in {HERE}")
        return 1
    collected = {short_name(p): run_one(p, args.quick, out_dir, args.timeout) for p in scripts}
    rows = [[name, e["status"], f"{e['elapsed_s']:.1f}", e["result_file"]] for name, e in collected.items()]
    print(markdown_table(["benchmark", "status", "seconds", "results"], rows), flush=True)
    if args.summary:
        Path(args.summary).write_text(json.dumps(collected, indent=2) + "\n")
        log(f"wrote {args.summary}")
    return 0 if all(e["status"].startswith("ok") for e in collected.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
