"""Several graphs on one actor: what a second, idle graph costs (issue 29).

    python benchmarks/bench_graphs.py [--quick] [--out DIR]

Two questions, each answered against its baseline in the same run:

- **latency**: the round trip of graph A (driver -> actor a -> actor b -> driver, a
  small int), alone and with a second graph B compiled over the same two actors and
  left idle. Rounds alternate the two cases (B is compiled before an "idle B" round
  and torn down after it); the figure is the ratio of the medians over all rounds.
  Goal: at most 1.10x.
- **idle CPU**: the % of a core an actor process uses over a window while nothing
  executes: a plain Ray actor (no graph), one idle cgraph graph, two idle cgraph
  graphs, and one idle Ray Compiled Graph (its loop polls). Goal: two idle graphs cost
  no more than a plain Ray actor (within the kernel's 10 ms tick: one tick over the
  window).

The where-record's cost per op is ``bench_where.py``'s. Results:
``benchmarks/results/graphs.{json,md}``.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    configure_environment,
    fmt,
    log,
    markdown_table,
    new_results,
    parse_args,
    percentile,
    process_cpu_seconds,
    ray_session,
    run_section,
    summarize_ns,
    time_calls,
    write_results,
)

SECTIONS = ("latency", "idle_cpu")
LATENCY_GOAL = 1.10


@dataclass(frozen=True)
class Settings:
    rounds: int
    iters: int
    warmup: int
    idle_seconds: float


FULL = Settings(rounds=6, iters=2000, warmup=200, idle_seconds=5.0)
QUICK = Settings(rounds=2, iters=200, warmup=20, idle_seconds=1.0)


class Echo:
    def echo(self, x: int) -> int:
        return x

    def pid(self) -> int:
        return os.getpid()

    def ready(self) -> bool:
        import torch  # noqa: F401 - as an actor of a real graph would: Ray CG's anchor needs it

        return True


def _actors(n: int) -> list[Any]:
    import ray

    cls = ray.remote(num_cpus=0)(Echo)
    actors = [cls.remote() for _ in range(n)]
    ray.get([a.ready.remote() for a in actors], timeout=120)
    return actors


@contextmanager
def _graph(first: Any, second: Any, ray_cg: bool = False) -> Iterator[Any]:
    """driver -> first.echo -> second.echo -> driver, compiled by cgraph (or Ray)."""
    import cgraph

    if ray_cg:
        from ray.dag import InputNode

        with InputNode() as inp:
            dag = second.echo.bind(first.echo.bind(inp))
        compiled = dag.experimental_compile()
    else:
        with cgraph.InputNode() as inp:
            dag = second.echo.bind(first.echo.bind(inp))
        compiled = cgraph.compile(dag)
    try:
        yield compiled
    finally:
        compiled.teardown()


def measure_latency(s: Settings) -> dict[str, Any]:
    import ray

    a, b = _actors(2)
    counter = itertools.count()
    samples: dict[str, list[int]] = {"alone": [], "idle_second_graph": []}
    round_medians: dict[str, list[float]] = {k: [] for k in samples}
    try:
        with _graph(a, b) as main:
            def one() -> None:
                i = next(counter)
                if main.execute(i).get(timeout=60) != i:
                    raise RuntimeError("wrong result")

            for r in range(s.rounds):
                for case in (("alone", "idle_second_graph") if r % 2 == 0 else ("idle_second_graph", "alone")):
                    if case == "alone":
                        got = time_calls(one, s.iters, s.warmup)
                    else:
                        with _graph(b, a) as idle:  # the other way round, over the same actors
                            if idle.execute(1).get(timeout=60) != 1:
                                raise RuntimeError("wrong result")
                            got = time_calls(one, s.iters, s.warmup)
                    samples[case] += got
                    round_medians[case].append(percentile(got, 50) / 1e3)
                    log(f"  latency round {r + 1}/{s.rounds} {case}: median {round_medians[case][-1]:.1f} us")
    finally:
        for actor in (a, b):
            ray.kill(actor)
    out: dict[str, Any] = {case: {**summarize_ns(xs), "round_medians_us": round_medians[case]}
                           for case, xs in samples.items()}
    out["ratio"] = out["idle_second_graph"]["median_us"] / out["alone"]["median_us"]
    out["goal"] = LATENCY_GOAL
    out["ok"] = out["ratio"] <= LATENCY_GOAL
    return out


def _idle_percent(pid: int, seconds: float) -> float:
    import time

    before, start = process_cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (process_cpu_seconds(pid) - before) / (time.monotonic() - start)


def measure_idle_cpu(s: Settings) -> dict[str, Any]:
    import ray

    cases: dict[str, Callable[[Any, Any], Any]] = {
        "plain Ray actor": lambda a, b: _stacked(),
        "one idle cgraph graph": lambda a, b: _stacked(_graph(a, b)),
        "two idle cgraph graphs": lambda a, b: _stacked(_graph(a, b), _graph(b, a)),
        "one idle Ray Compiled Graph": lambda a, b: _stacked(_graph(a, b, ray_cg=True)),
    }
    out: dict[str, Any] = {}
    for name, make in cases.items():
        a, b = _actors(2)
        try:
            pid = ray.get(a.pid.remote(), timeout=60)
            with make(a, b) as graphs:
                for g in graphs:  # one execution each, then rest
                    ref = g.execute(1)
                    if (ref.get(timeout=60) if hasattr(ref, "get") else ray.get(ref, timeout=60)) != 1:
                        raise RuntimeError("wrong result")
                percent = _idle_percent(pid, s.idle_seconds)
        finally:
            for actor in (a, b):
                ray.kill(actor)
        out[name] = {"percent_of_a_core": percent}
        log(f"  idle cpu, {name}: {percent:.1f}% of a core")
    tick = 100.0 / os.sysconf("SC_CLK_TCK") / s.idle_seconds  # one clock tick over the window, in %
    out["tick_percent"] = tick
    out["ok"] = out["two idle cgraph graphs"]["percent_of_a_core"] <= out["plain Ray actor"]["percent_of_a_core"] + tick
    return out


@contextmanager
def _stacked(*managers: Any) -> Iterator[tuple[Any, ...]]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield tuple(stack.enter_context(m) for m in managers)


def render(results: dict[str, Any]) -> str:
    host = results["host"]
    lines = [f"# Several graphs on one actor\n\nMeasured {results['created']} on {host.get('cpu_model', '?')} "
             f"({host.get('cpu_count', '?')} cores), Ray {host.get('ray', '?')}; `bench_graphs.py`. A shared VM: "
             "compare within this run only.\n"]
    lat = results["sections"].get("latency", {})
    if lat.get("status") == "ok":
        rows = [[case.replace("_", " "), fmt(lat[case]["median_us"]), fmt(lat[case]["p99_us"]),
                 ", ".join(f"{x:.0f}" for x in lat[case]["round_medians_us"])]
                for case in ("alone", "idle_second_graph")]
        lines.append("## A graph's round trip, alone and with a second idle graph on its actors\n\n"
                     + markdown_table(["case", "median (us)", "p99 (us)", "round medians (us)"], rows)
                     + f"\n\nRatio {lat['ratio']:.2f}x (goal <= {lat['goal']:.2f}x: "
                     f"{'PASS' if lat['ok'] else 'MISS'}).\n")
    idle = results["sections"].get("idle_cpu", {})
    if idle.get("status") == "ok":
        rows = [[name, f"{v['percent_of_a_core']:.1f}%"] for name, v in idle.items()
                if isinstance(v, dict) and "percent_of_a_core" in v]
        lines.append("## An idle actor's CPU\n\n" + markdown_table(["actor", "% of a core"], rows)
                     + f"\n\nTwo idle cgraph graphs vs a plain Ray actor, within one clock tick "
                     f"({idle['tick_percent']:.1f}%): {'PASS' if idle['ok'] else 'MISS'}.\n")
    for name, sec in results["sections"].items():
        if sec.get("status") != "ok":
            lines.append(f"## {name}\n\n{sec.get('status')}\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n", 1)[0], SECTIONS, argv)
    s = QUICK if args.quick else FULL
    configure_environment({"RAY_CGRAPH_get_timeout": "300"})
    import ray

    results = new_results("graphs", args, **s.__dict__)
    with ray_session(num_cpus=2):
        results["host"]["ray"] = ray.__version__
        if "latency" in args.sections:
            run_section(results, "latency", lambda: measure_latency(s))
        if "idle_cpu" in args.sections:
            run_section(results, "idle_cpu", lambda: measure_idle_cpu(s))
        markdown = render(results)
        paths = write_results(args.out, "graphs", results, markdown)
    print(markdown, flush=True)
    log(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
