"""Pass-through stages: a 64 MiB array through 3 actors that return their input unchanged.

    driver ─► s1.echo ─► s2.echo ─► s3.total ─► driver (a float)

Systems, side by side in one run (each on fresh actors, rounds interleaved):

    cgraph            forwarding on: each stage hands its read slot on, s3 reads the
                      driver's slot (one copy in all: the driver's write)
    cgraph, copying   CGRAPH_FORWARD=0 in the actors: each stage copies once (4 copies)
    Ray CG            Ray Compiled Graphs on the same actors' class

The physical reference is one copy of the array into shared memory, measured the
way the channel copies (``physical.memcpy_reference``). Reported: median ms per
execution (one at a time), its spread over rounds, the ratio to the reference
(copies' worth of time) and to cgraph with forwarding. Results:
benchmarks/results/forward.{json,md}.

    .venv/bin/python benchmarks/bench_forward.py [--quick] [--out DIR]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from common import (  # noqa: E402
    configure_environment,
    fmt,
    log,
    markdown_table,
    new_results,
    parse_args,
    ray_session,
    run_section,
    write_results,
)
from physical import memcpy_reference  # noqa: E402

SECTIONS = ("passthrough",)
SIZE = 64 << 20
WARMUP = 4  # executions before timing: twice the 2 slots of each channel (max_inflight_executions=2)
SYSTEMS = {"cgraph": "cgraph", "cgraph_copying": "cgraph, copying (CGRAPH_FORWARD=0)", "ray_cgraph": "Ray CG"}


class Stage:
    def echo(self, x: Any) -> Any:
        return x

    def total(self, x: Any) -> float:
        return float(x[:: 1 << 16].sum())  # touches a few pages: the read is what is measured


def run_system(system: str, size: int, executions: int) -> list[float]:
    """ms per execution of ``system`` on fresh actors."""
    import ray
    from ray.dag import InputNode

    env = {"OMP_NUM_THREADS": "1", "CGRAPH_FORWARD": "0" if system == "cgraph_copying" else "1"}
    actor = ray.remote(num_cpus=0, runtime_env={"env_vars": env})(Stage)
    stages = [actor.remote() for _ in range(3)]
    ray.get([s.__ray_ready__.remote() for s in stages])
    try:
        with InputNode() as inp:
            dag = stages[2].total.bind(stages[1].echo.bind(stages[0].echo.bind(inp)))
        if system == "ray_cgraph":
            compiled = dag.experimental_compile()
        else:
            import cgraph

            compiled = cgraph.compile(dag, buffer_size_bytes=size + (1 << 20), max_inflight_executions=2)
        arr = np.ones(size // 8)
        expected = float(arr[:: 1 << 16].sum())
        times = []
        try:
            for i in range(executions + WARMUP):
                start = time.perf_counter()
                got = ray.get(compiled.execute(arr), timeout=120)
                if i >= WARMUP:  # warm: every slot grown and its pages faulted in
                    times.append((time.perf_counter() - start) * 1e3)
                assert got == expected, (got, expected)
        finally:
            compiled.teardown()
        return times
    finally:
        for s in stages:
            ray.kill(s)


def measure_passthrough(quick: bool) -> dict[str, Any]:
    size = 8 << 20 if quick else SIZE
    rounds, executions = (2, 3) if quick else (5, 10)
    reference = memcpy_reference((size,), 5 if quick else 20)["sizes"][str(size)]
    samples: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    round_medians: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    os.environ.setdefault("RAY_CGRAPH_buffer_size_bytes", str(size + (1 << 20)))
    os.environ.setdefault("RAY_CGRAPH_get_timeout", "120")
    with ray_session(num_cpus=4):
        for r in range(rounds):
            order = list(SYSTEMS)[r % len(SYSTEMS):] + list(SYSTEMS)[: r % len(SYSTEMS)]
            for system in order:
                try:
                    times = run_system(system, size, executions)
                except Exception as exc:  # noqa: BLE001 - an anchor that fails is reported, not fatal
                    log(f"  {system}: failed: {exc!r}")
                    continue
                samples[system] += times
                round_medians[system].append(statistics.median(times))
                log(f"  round {r}: {system} median {statistics.median(times):.1f} ms")
    copy_ms = reference["shm_median_ms"]
    out: dict[str, Any] = {"size_bytes": size, "stages": 3, "one_copy_into_shm_ms": copy_ms, "systems": {}}
    base = statistics.median(samples["cgraph"]) if samples["cgraph"] else None
    for system, times in samples.items():
        if not times:
            out["systems"][system] = {"status": "did not run"}
            continue
        median = statistics.median(times)
        out["systems"][system] = {
            "median_ms": median, "round_medians_ms": round_medians[system],
            "spread_ms": max(round_medians[system]) - min(round_medians[system]),
            "copies_worth": median / copy_ms, "vs_cgraph": median / base if base else None,
        }
    return out


def report(results: dict[str, Any]) -> str:
    data = results["sections"]["passthrough"]
    if "systems" not in data:
        return f"# Pass-through stages\n\n{data.get('status', 'not run')}\n"
    rows = []
    for system, label in SYSTEMS.items():
        row = data["systems"][system]
        if "median_ms" not in row:
            rows.append([label, row.get("status", "-"), "-", "-", "-"])
            continue
        rows.append([label, fmt(row["median_ms"]), " / ".join(fmt(v) for v in row["round_medians_ms"]),
                     fmt(row["copies_worth"], 2), fmt(row["vs_cgraph"], 2) + "x"])
    mib = data["size_bytes"] >> 20
    return "\n".join([
        "# Pass-through stages: forwarding instead of copying", "",
        f"Measured {results['created']} on {results['host']['cpu_model']} ({results['host']['cpu_count']} cores); "
        f"`{results['command']}`. A {mib} MiB float64 array through 3 actors whose methods return "
        "their input unchanged, then a float back to the driver; one execution at a time. One copy of "
        f"the array into shared memory takes {data['one_copy_into_shm_ms']:.1f} ms here (the physical "
        "reference, measured the way the channel copies); \"copies' worth\" is an execution's median "
        "over it. With forwarding the only copy is the driver's write; copying, each stage adds one. "
        "The machine is shared: compare the ratios within this run.", "",
        markdown_table(["system", "median ms", "round medians ms", "copies' worth", "vs cgraph"], rows), "",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n", 1)[0], SECTIONS, argv)
    configure_environment()
    results = new_results("forward", args, size_bytes=SIZE)
    run_section(results, "passthrough", lambda: measure_passthrough(args.quick))
    write_results(args.out, "forward", results, report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
