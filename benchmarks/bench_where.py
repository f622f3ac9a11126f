"""What the where-record costs an actor's loop per op (issue 29: at most 1 us).

    python benchmarks/bench_where.py [--ops 200000] [--runs 9] [--quick]

The actor loop (``cgraph/runtime/executor.py``, ``run_actor_loop``) runs each op as a
step; with the record it also stores the op's position and a clock read in a list
(``cgraph/runtime/where.py``). This runs that loop's two shapes, with and without the
record, over steps that do nothing (the worst case: a real op reads a channel or runs a
method, microseconds at least) and over steps that take about a microsecond, alternating
the two shapes run by run in one process. The figure is the median over runs of the
difference in ns per op; the results file is ``benchmarks/results/where.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import host_info, markdown_table, write_results  # noqa: E402
from cgraph.runtime.where import track  # noqa: E402

BUDGET_NS = 1000
"""What the issue allows the record per op."""


def bare(steps: list[Callable[[], None]], executions: int) -> int:
    """The loop without the record: ns for ``executions`` passes over ``steps``."""
    start = time.perf_counter_ns()
    for _ in range(executions):
        for step in steps:
            step()
    return time.perf_counter_ns() - start


def recorded(steps: list[Callable[[], None]], executions: int) -> int:
    """The loop as ``run_actor_loop`` runs it, with the where-record."""
    where = track("bench")
    now = time.perf_counter_ns
    positioned = tuple(enumerate(steps))
    start = time.perf_counter_ns()
    for execution in range(executions):
        for position, step in positioned:
            where[1] = position
            where[2] = now()
            step()
        where[0] = execution
    return time.perf_counter_ns() - start


def busy(ns: int) -> Callable[[], None]:
    """A step of about ``ns`` nanoseconds (0: nothing at all)."""
    if ns == 0:
        return lambda: None
    clock = time.perf_counter_ns

    def step() -> None:
        end = clock() + ns
        while clock() < end:
            pass

    return step


def measure(step_ns: int, ops: int, runs: int) -> dict[str, float]:
    steps = [busy(step_ns) for _ in range(8)]  # an actor's 8 ops per execution
    executions = max(1, ops // len(steps))
    extra = []
    base = []
    for _ in range(runs):
        a = bare(steps, executions)
        b = recorded(steps, executions)
        base.append(a / (executions * len(steps)))
        extra.append((b - a) / (executions * len(steps)))
    return {"step_ns": step_ns, "bare_ns_per_op": statistics.median(base),
            "record_ns_per_op": statistics.median(extra), "spread_ns": [min(extra), max(extra)],
            "runs": runs, "ops_per_run": executions * len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    ops, runs = (20_000, 5) if args.quick else (args.ops, args.runs)
    rows = [measure(step_ns, ops, runs) for step_ns in (0, 1000)]
    results = {"host": host_info(), "budget_ns": BUDGET_NS, "rows": rows,
               "ok": all(r["record_ns_per_op"] <= BUDGET_NS for r in rows)}
    table = markdown_table(
        ["step", "loop alone (ns/op)", "the record adds (ns/op, median)", "spread", f"within {BUDGET_NS} ns"],
        [[f"{r['step_ns']} ns" if r["step_ns"] else "nothing", f"{r['bare_ns_per_op']:.0f}",
          f"{r['record_ns_per_op']:.0f}", f"{r['spread_ns'][0]:.0f} to {r['spread_ns'][1]:.0f}",
          "yes" if r["record_ns_per_op"] <= BUDGET_NS else "NO"] for r in rows])
    markdown = (f"# The where-record's cost per op\n\n`python benchmarks/bench_where.py`: the actor "
                f"loop's two shapes, with and without the record, alternated run by run in one "
                f"process ({runs} runs of {rows[0]['ops_per_run']} ops each; 8 steps an execution). "
                f"Shared 2-core VM: the spread is the machine's noise.\n\n{table}\n")
    paths = write_results(args.out, "where", results, markdown)
    print(markdown)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
