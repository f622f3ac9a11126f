"""Scheduler speed on a large random DAG: lower + verify + deadlock check + overlap.

    python benchmarks/bench_scheduler.py [--nodes 1000] [--actors 32] [--runs 7] [--quick]
                                         [--out benchmarks/results/scheduler.json]

The DAG is seeded (the same on every run): ``--nodes`` CALL nodes spread over
``--actors`` actors, half of them with a GPU; each call reads one to three
recent values (sometimes an input attribute or a constant), some return two
values, and about a third of the GPU actors' results carry an ``auto``
transport hint, so edges between two GPU actors go over NCCL. A second,
worst-case DAG gives every actor a GPU and every call the hint. Each phase is
timed separately; the figure is the median over ``--runs`` runs of the sum.
Target: under 1 second for 1,000 nodes over 32 actors. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cgraph.ir import Actor, Arg, Const, Graph, Node, NodeKind, Ref, TensorHint  # noqa: E402
from cgraph.scheduler import (  # noqa: E402
    COMM_KINDS,
    ChannelPlan,
    Schedule,
    find_deadlock,
    lower,
    overlap,
    plan_channels,
    verify,
)

TARGET_S = 1.0


def random_graph(n_nodes: int, n_actors: int, seed: int = 0, nccl_heavy: bool = False) -> Graph:
    """A seeded random DAG of ``n_nodes`` calls (plus their items) over ``n_actors`` actors.

    ``nccl_heavy``: every actor has a GPU and every call an ``auto`` hint, so
    nearly every edge between two actors is a rendezvous (the worst case).
    """
    rng = random.Random(seed)
    actors = tuple(
        Actor(f"w{i}", "Worker", gpus=1.0 if nccl_heavy or i % 2 == 0 else 0.0) for i in range(n_actors)
    )
    share = 1.0 if nccl_heavy else 0.33
    nodes = [Node("n0", NodeKind.INPUT)]
    readable = ["n0"]
    held: list[str] = []
    for _ in range(n_nodes):
        actor = rng.choice(actors)
        args: list[Arg] = []
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.05:
                attr = Node(f"n{len(nodes)}", NodeKind.INPUT_ATTR, args=(Ref("n0"),), key=rng.randint(0, 3))
                nodes.append(attr)
                args.append(Ref(attr.id))
            elif roll < 0.1:
                args.append(Const(0))
            else:
                args.append(Ref(rng.choice(readable[-40:])))
        hint = TensorHint("auto", static_shape=True) if actor.gpus and rng.random() < share else None
        returns = 2 if rng.random() < 0.1 else 1
        call = Node(f"n{len(nodes)}", NodeKind.CALL, actor.id, "step", tuple(args),
                    num_returns=returns, hint=hint)  # fmt: skip
        nodes.append(call)
        made = [call.id] if returns == 1 else []
        for key in range(returns if returns > 1 else 0):
            item = Node(f"n{len(nodes)}", NodeKind.ITEM, actor.id, args=(Ref(call.id),), key=key)
            nodes.append(item)
            made.append(item.id)
        readable += made
        held += made
    return Graph(actors, tuple(nodes), tuple(held[-16:]), True, (0,))


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run_once(graph: Graph, plan: ChannelPlan) -> dict[str, float]:
    """One pass of the pipeline's scheduling work; seconds per phase."""
    t_lower, lowered = _timed(lambda: lower(graph, plan))
    schedule: Schedule = lowered  # type: ignore[assignment]
    t_verify, problems = _timed(lambda: verify(graph, plan, schedule))
    t_deadlock, deadlock = _timed(lambda: find_deadlock(schedule))
    t_overlap, overlapped = _timed(lambda: overlap(schedule))
    if problems or deadlock is not None:
        raise SystemExit(f"the lowered schedule is not valid: {problems[:3]} {deadlock}")
    if find_deadlock(overlapped) is not None:  # type: ignore[arg-type]
        raise SystemExit("the overlapped schedule deadlocks")
    return {"lower": t_lower, "verify": t_verify, "find_deadlock": t_deadlock, "overlap": t_overlap}


def measure(graph: Graph, runs: int) -> dict[str, object]:
    """Median seconds per phase and in total over ``runs`` runs, plus the graph's size."""
    t_plan, plan_obj = _timed(lambda: plan_channels(graph))
    plan: ChannelPlan = plan_obj  # type: ignore[assignment]
    samples = [run_once(graph, plan) for _ in range(runs)]
    totals = sorted(sum(s.values()) for s in samples)
    schedule = lower(graph, plan)
    return {
        "nodes": len(graph.nodes),
        "actors": len(graph.actors),
        "channels": len(plan.channels),
        "ops": sum(len(lane) for lane in schedule.values()),
        "comm_ops": sum(op.kind in COMM_KINDS for lane in schedule.values() for op in lane),
        "plan_channels_s": round(t_plan, 4),
        "median_s": {k: round(statistics.median(s[k] for s in samples), 4) for k in samples[0]},
        "median_total_s": round(statistics.median(totals), 4),
        "min_total_s": round(totals[0], 4),
    }


def _print(name: str, row: dict[str, object], runs: int) -> None:
    print(f"{name}: {row['nodes']} nodes, {row['actors']} actors, {row['ops']} ops "
          f"({row['comm_ops']} comm), {row['channels']} channels")  # fmt: skip
    for phase, value in row["median_s"].items():  # type: ignore[attr-defined]
        print(f"  {phase:<14} {value * 1000:8.1f} ms")
    total = float(row["median_total_s"])  # type: ignore[arg-type]
    verdict = "PASS" if total < TARGET_S else "MISS"
    print(f"  {'total':<14} {total * 1000:8.1f} ms  (median of {runs}; target < {TARGET_S:g} s: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--actors", type=int, default=32)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 runs")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "scheduler.json"))
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs

    mixed = measure(random_graph(args.nodes, args.actors, args.seed), runs)
    heavy = measure(random_graph(args.nodes, args.actors, args.seed, nccl_heavy=True), runs)
    _print(f"scheduler, {args.nodes} calls (half the actors with GPUs, some nccl edges)", mixed, runs)
    _print("scheduler, nccl-heavy worst case (every actor a GPU, every edge nccl)", heavy, runs)
    report = {
        "benchmark": "scheduler",
        "what": "lower + verify + find_deadlock + overlap, median seconds",
        "call_nodes": args.nodes,
        "seed": args.seed,
        "runs": runs,
        "target_s": TARGET_S,
        "mixed": mixed,
        "nccl_heavy": heavy,
        "median_total_s": mixed["median_total_s"],
        "verdict": "PASS" if float(mixed["median_total_s"]) < TARGET_S else "MISS",  # type: ignore[arg-type]
        "host": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "platform": platform.platform()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
