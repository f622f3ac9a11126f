"""overlap_gpu_communication="auto" against off and on, on `make run`'s program (issue 30).

    python benchmarks/bench_auto.py [--quick] [--out DIR]

`examples/overlap.py`'s graph (three senders, one receiver, tensor edges on this
machine's transport) is compiled ``runs`` times in each of the three modes, the modes
alternating run by run on the same actors; each run times ``iters`` executions after
its warm-up ("auto" warms up until it has decided, so its time is the schedule it
chose). The figure is each mode's median run, and auto's median against the better of
off's and on's. Goal: auto never more than 3% slower than the better fixed mode.
Results: ``benchmarks/results/auto.{json,md}``.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
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

GOAL = 1.03
SECTIONS = ("cpu",)


def measure(runs: int, iters: int) -> dict[str, Any]:
    import torch

    from examples import overlap as example

    gpus = torch.cuda.device_count()
    size, dtype, side = (10_000, torch.float16, None) if gpus else (2048, torch.float32, 768)
    actors = example.make_actors(gpus)
    seconds: dict[str, list[float]] = {str(m): [] for m in example.MODES}
    choices: list[str] = []
    for r in range(runs):
        for mode in example.MODES:
            took, decision = example.run(mode, actors, (size, size), dtype, iters, side)
            seconds[str(mode)].append(took / iters)
            if decision is not None:
                choices.append(decision.choice)
                log(f"  run {r + 1}/{runs} auto chose {decision}")
            log(f"  run {r + 1}/{runs} {mode!r}: {1e3 * took / iters:.1f} ms per execution")
    medians = {mode: statistics.median(xs) for mode, xs in seconds.items()}
    better = min(medians["False"], medians["True"])
    ratio = medians["auto"] / better
    return {"tensor": f"{size}x{size} {str(dtype).replace('torch.', '')}", "iters": iters, "runs": runs,
            "seconds_per_execution": seconds, "median_seconds": medians, "auto_vs_better": ratio,
            "goal": GOAL, "ok": ratio <= GOAL, "choices": dict(Counter(choices))}


def render(results: dict[str, Any]) -> str:
    sec = results["sections"].get("cpu", {})
    head = (f"# overlap='auto' against off and on\n\nMeasured {results['created']}; `bench_auto.py` on "
            "`examples/overlap.py`'s program. A shared VM: compare within this run only.\n")
    if sec.get("status") != "ok":
        return head + f"\n{sec.get('status')}\n"
    rows = [[mode, f"{1e3 * sec['median_seconds'][mode]:.1f}",
             ", ".join(f"{1e3 * x:.1f}" for x in sec["seconds_per_execution"][mode])]
            for mode in ("False", "True", "auto")]
    return (head + f"\n{sec['tensor']}, {sec['runs']} runs of {sec['iters']} executions per mode, alternating.\n\n"
            + markdown_table(["overlap_gpu_communication", "median ms per execution", "each run"], rows)
            + f"\n\nauto's median is {sec['auto_vs_better']:.3f}x the better fixed mode's (goal <= {GOAL}: "
            f"{'PASS' if sec['ok'] else 'MISS'}); auto chose {sec['choices']}.\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n", 1)[0], SECTIONS, argv)
    configure_environment({"OMP_NUM_THREADS": "1"})
    import ray

    runs, iters = (2, 5) if args.quick else (5, 20)
    results = new_results("auto", args, runs=runs, iters=iters)
    with ray_session(num_cpus=2):
        results["host"]["ray"] = ray.__version__
        run_section(results, "cpu", lambda: measure(runs, iters))
        markdown = render(results)
        paths = write_results(args.out, "auto", results, markdown)
    print(markdown, flush=True)
    log(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
