"""Run-ahead on a 2-stage pipeline: receives of execution i+1 begin while i computes (issue 30).

    python benchmarks/bench_ahead.py [--quick] [--out DIR]

    driver ─i─► a.produce(i): S bytes ══ CPU communicator ══► b.consume(t) ─► driver

Both stages' compute is a wait, as a method waits for its GPU kernel: the core is free
meanwhile, and a copy of the value is the only CPU work (the own-engine model: the
communication has the cores the compute does not use). b computes about as long as a
value takes to cross. With ``overlap_gpu_communication=True`` b receives execution i's
value only once execution i begins on it; with ``run_ahead=True`` its comm thread
receives execution i+1's while b computes execution i.

The two modes alternate, ``runs`` runs each, on the same actors; each run keeps
``max_inflight_executions=4`` executions in flight over ``iters`` executions and reports
seconds per execution. The prediction: one recorded pass per mode gives the op
durations (``cgraph.visualize.durations``), and ``simulate_executions`` predicts both
schedules on them, 8 executions in flight, comm on its own engine and sharing the cores.
Results: ``benchmarks/results/ahead.{json,md}``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    configure_environment,
    log,
    markdown_table,
    new_results,
    parse_args,
    ray_session,
    run_section,
    write_results,
)

SECTIONS = ("cpu",)
MODES = ("per execution", "run ahead")
IN_FLIGHT = 4
COMMUNICATOR = "gloo"
PREDICTED_EXECUTIONS = 8
SIZE = 3 << 19  # float32 elements: 6 MiB
A_WAIT, B_WAIT = 0.0005, 0.005  # seconds: a makes the value quickly; b computes about one crossing


def make_actors() -> tuple[Any, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Stage:
        def __init__(self, wait: float) -> None:
            import torch

            torch.set_num_threads(1)
            self.wait = wait
            self.buf = torch.ones(SIZE)

        def produce(self, i: int) -> Any:
            time.sleep(self.wait)  # the "kernel"
            return self.buf  # the same tensor each time: the send fence keeps it until sent

        def consume(self, t: Any) -> float:
            time.sleep(self.wait)
            return float(t[0])

    a, b = Stage.remote(A_WAIT), Stage.remote(B_WAIT)
    ray.get([a.__ray_ready__.remote(), b.__ray_ready__.remote()])
    return a, b


def compile_mode(actors: tuple[Any, Any], mode: str, timeline: bool = False) -> Any:
    import cgraph
    from cgraph import InputNode

    a, b = actors
    with InputNode() as inp:
        dag = b.consume.bind(a.produce.bind(inp).with_tensor_transport(transport="nccl"))
    return cgraph.compile(dag, overlap_gpu_communication=True, run_ahead=mode == MODES[1],
                          max_inflight_executions=IN_FLIGHT, default_communicator=COMMUNICATOR, timeline=timeline,
                          timeline_executions=max(PREDICTED_EXECUTIONS, 20))


def pipelined(compiled: Any, iters: int) -> float:
    """Seconds for ``iters`` executions with ``IN_FLIGHT`` in flight (results checked)."""
    refs: list[Any] = []
    start = time.perf_counter()
    for i in range(iters):
        if len(refs) == IN_FLIGHT:
            assert refs.pop(0).get(timeout=60) == 1.0
        refs.append(compiled.execute(i))
    for ref in refs:
        assert ref.get(timeout=60) == 1.0
    return time.perf_counter() - start


def predict(actors: tuple[Any, Any], mode: str, iters: int) -> dict[str, Any]:
    """One recorded pass: the op durations, and both schedules predicted on them."""
    from cgraph.scheduler.ahead import run_ahead
    from cgraph.scheduler.simulate import Machine, compute_reads, simulate_executions
    from cgraph.visualize import durations

    compiled = compile_mode(actors, mode, timeline=True)
    try:
        pipelined(compiled, 4)
        pipelined(compiled, iters)
        table = durations(compiled._tracks())
        planned = compiled.planned
        overlapped = dict(planned.passes)["overlap"]
        schedules = {MODES[0]: overlapped, MODES[1]: run_ahead(overlapped)}
        reads = compute_reads(planned.graph)
        predicted = {f"{name} / {machine.name.lower()}":
                     simulate_executions(schedule, table, PREDICTED_EXECUTIONS, machine=machine, reads=reads,
                                         cores=2 if machine is Machine.SHARED_CORES else None).makespan
                     / PREDICTED_EXECUTIONS
                     for name, schedule in schedules.items() for machine in Machine}
        return {"durations": table, "predicted": predicted, "schedule": _text(compiled)}
    finally:
        compiled.teardown()


def measure(runs: int, iters: int) -> dict[str, Any]:
    actors = make_actors()
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    schedules = {}
    for r in range(runs):
        for mode in MODES:
            compiled = compile_mode(actors, mode)
            try:
                schedules[mode] = _text(compiled)
                pipelined(compiled, 8)  # warm-up
                took = pipelined(compiled, iters)
            finally:
                compiled.teardown()
            seconds[mode].append(took / iters)
            log(f"  run {r + 1}/{runs} {mode}: {1e3 * took / iters:.2f} ms per execution")
    medians = {mode: statistics.median(xs) for mode, xs in seconds.items()}
    recorded = {mode: predict(actors, mode, iters) for mode in MODES}
    own = recorded[MODES[0]]["predicted"]  # the per-execution run's durations
    gain_predicted = own[f"{MODES[0]} / own_engine"] / own[f"{MODES[1]} / own_engine"]
    gain = medians[MODES[0]] / medians[MODES[1]]
    return {"bytes": SIZE * 4, "waits_s": {"a": A_WAIT, "b": B_WAIT}, "in_flight": IN_FLIGHT, "iters": iters,
            "runs": runs, "schedules": schedules, "seconds_per_execution": seconds, "median_seconds": medians,
            "measured_gain": gain, "predicted": {mode: rec["predicted"] for mode, rec in recorded.items()},
            "durations": {mode: rec["durations"] for mode, rec in recorded.items()},
            "predicted_gain_own_engine": gain_predicted,
            "ok": (gain > 1.0) == (gain_predicted > 1.05)}


def _text(compiled: Any) -> str:
    from cgraph.scheduler.ops import format_schedule

    return format_schedule({"b": compiled.planned.schedule["b"]})


def render(results: dict[str, Any]) -> str:
    sec = results["sections"].get("cpu", {})
    head = (f"# Run-ahead: receives of the next execution while this one computes\n\nMeasured {results['created']}; "
            "`bench_ahead.py`. A shared VM: compare within this run only.\n")
    if sec.get("status") != "ok":
        return head + f"\n{sec.get('status')}\n"
    rows = [[mode, f"`{sec['schedules'][mode]}`", f"{1e3 * sec['median_seconds'][mode]:.2f}",
             ", ".join(f"{1e3 * x:.2f}" for x in sec["seconds_per_execution"][mode]),
             f"{1e3 * sec['predicted'][MODES[0]][f'{mode} / own_engine']:.2f}",
             f"{1e3 * sec['predicted'][MODES[0]][f'{mode} / shared_cores']:.2f}"]
            for mode in MODES]
    durations = ", ".join(f"{key} {1e3 * value:.2f}" for key, value in sec["durations"][MODES[0]].items())
    return (head + f"\nA 2-stage pipeline, {sec['bytes'] >> 20} MiB per value over {COMMUNICATOR}; a waits "
            f"{1e3 * sec['waits_s']['a']:.1f} ms and b {1e3 * sec['waits_s']['b']:.1f} ms per execution (a wait "
            f"stands for a GPU kernel: the core is free); {sec['in_flight']} executions in flight; "
            f"{sec['runs']} runs of {sec['iters']} executions per mode, alternating.\n\n"
            + markdown_table(["mode", "b's schedule", "median ms per execution", "each run",
                              "predicted, own engine", "predicted, 2 shared cores"], rows)
            + f"\n\nMeasured gain of running ahead: {sec['measured_gain']:.2f}x; predicted on its own engine "
            f"{sec['predicted_gain_own_engine']:.2f}x (from the per-execution run's recorded op durations, "
            f"{PREDICTED_EXECUTIONS} executions in flight). Measured gains where predicted: "
            f"{'PASS' if sec['ok'] else 'MISS'}.\n\nRecorded op durations (ms, per-execution run): {durations}.\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n", 1)[0], SECTIONS, argv)
    configure_environment({"OMP_NUM_THREADS": "1"})
    import ray

    runs, iters = (2, 20) if args.quick else (5, 60)
    results = new_results("ahead", args, runs=runs, iters=iters)
    with ray_session(num_cpus=2):
        results["host"]["ray"] = ray.__version__
        run_section(results, "cpu", lambda: measure(runs, iters))
        markdown = render(results)
        paths = write_results(args.out, "ahead", results, markdown)
    print(markdown, flush=True)
    log(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
