"""Write the README's benchmark tables (and its GPU status) from the results files, so it
never quotes a number, or a GPU run, that no results file holds.

    .venv/bin/python scripts/readme_tables.py            # rewrite README.md between the markers
    .venv/bin/python scripts/readme_tables.py --check    # exit 1 if README.md is out of date
    .venv/bin/python scripts/readme_tables.py --print    # print the tables

``make bench`` runs it after the benchmarks. Each area reads one file of
benchmarks/results/ (written by the benchmark of the same name) and gives one
table and at most one sentence; the text between ``BEGIN`` and ``END`` in README.md
is this script's output and nothing else. tests/unit/test_readme_tables.py checks
that README.md holds what this script produces from the files now.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN = "<!-- benchmark tables: written by scripts/readme_tables.py from benchmarks/results -->"
END = "<!-- end of benchmark tables -->"


# --------------------------------------------------------------------------- formatting
def num(value: float, decimals: int = 1) -> str:
    """``12.3``; from 1,000 on, whole numbers with a thousands separator."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.{decimals}f}"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def heading(title: str, bench: str, results: str, caption: str) -> str:
    """The area's one-line caption; the table follows on the next line (GFM allows it)."""
    return (f"**{title}** ([{bench}](benchmarks/{bench}), "
            f"[results](benchmarks/results/{results})): {caption}")


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


# --------------------------------------------------------------------------- areas
DAG_LABELS = {"echo": "echo, 1 actor", "chain3": "chain of 3 actors", "fanout3": "fan-out/fan-in, 3+1 actors"}
RUNTIME_SYSTEMS = ("cgraph", "cgraph_colocate", "ray_cgraph", "ray_plain")


def runtime(data: dict[str, Any]) -> str:
    latency, sections = data["sections"]["latency"], data["sections"]
    rows = []
    for name, dag in latency["dags"].items():
        cells = [f"{DAG_LABELS.get(name, name)} ({dag['hops']} hops)"]
        for system in RUNTIME_SYSTEMS:
            s = dag["systems"][system]
            cells.append(f"{num(s['median_us'])} / {num(s['p99_us'], 0)}")
        rows.append(cells)
    compile_s = sections["compile"]["systems"]
    pipelined = {system: _pipelined_share(data, system) for system in ("cgraph", "ray_cgraph")}
    idle = {s: max(v["actor_percent_schedstat"]) for s, v in sections["idle_cpu"]["systems"].items()}
    sentence = (
        f"Compile of the chain: {1e3 * compile_s['cgraph']['median_compile_s']:.0f} ms "
        f"(Ray CG {1e3 * compile_s['ray_cgraph']['median_compile_s']:.0f} ms). 100 MiB arrays "
        f"through 2 actors, 4 in flight: {pipelined['cgraph']} of a one-core memcpy into shared "
        f"memory (Ray CG {pipelined['ray_cgraph']}). An idle actor uses {idle['cgraph']:.1f}% "
        f"of a core (Ray CG {idle['ray_cgraph']:.0f}%: it spins).")
    return "\n".join([
        heading("Runtime", "bench_runtime.py", "runtime.md",
                f"round trip from the driver and back, median / p99 in µs. {sentence}"),
        table(["DAG", "cgraph", "cgraph, `colocate`", "Ray Compiled Graphs", "plain Ray calls"], rows),
    ])


def _pipelined_share(data: dict[str, Any], system: str) -> str:
    sizes = data["sections"]["throughput"]["systems"][system]["sizes"]
    largest = max(sizes, key=int)
    memcpy = data["sections"]["memcpy"]["sizes"][largest]["shm_gbps"]
    return pct(sizes[largest]["pipelined"]["gbps"] / memcpy)


def collective(data: dict[str, Any]) -> str:
    sizes = data["settings"]["sizes_bytes"]
    rows = []
    for section in data["sections"].values():
        if section.get("status") != "ok":
            continue
        cells = [f"{section['nodes']} x {section['ranks_per_node']}"]
        for point in section["points"]:
            cells.append(f"{num(point['best_ms'])} {point['best']} / {num(point['auto_ms'])} / "
                         f"{num(point['gloo_ms'])}")
        rows.append(cells)
    header = ["nodes x ranks"] + [f"{n >> 20} MiB" for n in sizes]
    return "\n".join([
        heading("Allreduce", "bench_collective.py", "collective.md",
                "CPU actors on one node and on a 2-node loopback cluster; median ms of the best "
                "cgraph algorithm / `algorithm=\"auto\"` / gloo's own allreduce."),
        table(header, rows),
    ])


OVERLAP_MODES = (("comm_alone", "comm alone"), ("compute", "compute alone"),
                 ("no_overlap", "no overlap"), ("overlap", "overlap"))


def overlap(data: dict[str, Any]) -> str:
    cpu = data["sections"]["cpu"]
    rows = []
    for system, label in (("cgraph", "cgraph"), ("ray_cgraph", "Ray Compiled Graphs")):
        modes = cpu["systems"][system]["modes"]
        rows.append([label] + [
            num(modes[mode]["median_us"] / 1e3) if modes[mode]["status"] == "ok" else "did not run"
            for mode, _ in OVERLAP_MODES
        ])
    shape = cpu["shape"]
    gpu = data["sections"].get("gpu", {}).get("status", "not run").split(" (")[0]
    if ": " in gpu:  # "skipped: no CUDA device" -> "skipped (no CUDA device)"
        gpu = "{} ({})".format(*gpu.split(": ", 1))
    return "\n".join([
        heading("Overlap", "bench_overlap.py", "overlap.md",
                f"Ray's overlap example (3 senders, 1 receiver) on CPU, {shape['n']}x{shape['n']} "
                f"{shape['dtype']}, median ms per execution. GPU: {gpu}."),
        table(["system"] + [label for _, label in OVERLAP_MODES], rows),
    ])


def crossnode(data: dict[str, Any]) -> str:
    sections = data["sections"]
    echo = sections["echo"]["layouts"]["echo_cross"]["systems"]
    hops = sections["hops"]["layouts"]
    rows = [["echo, driver to an actor on the other node (µs)",
             num(echo["cgraph"]["median_us"]), num(echo["ray_cgraph"]["median_us"]), "-"]]
    cross = hops["hop_cross"]["systems"]
    systems = [s for s in ("cgraph", "ray_cgraph", "raw_tcp") if "sizes" in cross.get(s, {})]
    sizes = sorted(cross["cgraph"]["sizes"], key=int)[1:]  # the first is the 8-byte control
    rows.append([f"{' / '.join(str(int(n) >> 20) for n in sizes)} MiB hop across nodes (GB/s)"] + [
        " / ".join(f"{cross[s]['sizes'][n]['gbps']:.2f}" for n in sizes) for s in systems])
    worker = hops["hop_worker"]["systems"]
    rows.append(["16 MiB hop within the other node (ms)"] + [
        num(worker[s]["sizes"][str(16 << 20)]["median_us"] / 1e3, 2) for s in ("cgraph", "ray_cgraph")] + ["-"])
    tls = {row["measure"]: row["ratio"] for row in sections["tls"]["summary"]}
    return "\n".join([
        heading("Across nodes", "bench_crossnode.py", "crossnode.md",
                "two Ray nodes on one machine (loopback: software overhead, not a network); "
                f"medians. `tls=True` costs {tls['echo across nodes, median']:.2f}x on the echo "
                f"and {tls['16 MiB hop across nodes, median']:.2f}x on a 16 MiB hop. Raw TCP: the "
                "same two actors over one plain TCP connection, copying as the channel does "
                "(the wire's floor)."),
        table(["measure", "cgraph", "Ray CG", "raw TCP"], [row + ["-"] * (4 - len(row)) for row in rows]),
    ])


def scheduler(data: dict[str, Any]) -> str:
    mixed, heavy = data["mixed"], data["nccl_heavy"]
    return heading("Scheduler", "bench_scheduler.py", "scheduler.json",
                   f"lower + verify + deadlock check + overlap of a random {data['call_nodes']:,}-call DAG "
                   f"over {mixed['actors']} actors: {num(1e3 * mixed['median_total_s'])} ms with mixed "
                   f"transports ({mixed['ops']:,} ops), {num(1e3 * heavy['median_total_s'])} ms with every "
                   f"edge on a communicator ({heavy['ops']:,} ops), medians.")


def channels(data: dict[str, Any]) -> str:
    placed, pinned = data["round_trip_scheduled"], data["round_trip_pinned_cpu0"]
    big = data["throughput"]["100MiB"]

    def pair(run: dict[str, Any]) -> str:
        return f"{num(run['channel']['median_us'])} µs (a pipe: {num(run['floors']['pipe']['median_us'])} µs)"

    return heading("Channels", "bench_channels.py", "channels.json",
                   f"round trip between two processes, median: {pair(placed)} placed by the OS, {pair(pinned)} "
                   f"both on one CPU. 100 MiB arrays: {big['channel_two_processes_GBps']:.1f} GB/s, "
                   f"{pct(big['vs_memcpy_warm_shm'])} of a one-core memcpy into shared memory; an idle reader "
                   f"uses {data['idle_reader']['cpu_percent']:.0f}% CPU.")


def forward(data: dict[str, Any]) -> str:
    run = data["sections"]["passthrough"]["systems"]
    mib = data["sections"]["passthrough"]["size_bytes"] >> 20
    return heading("Pass-through stages", "bench_forward.py", "forward.md",
                   f"a {mib} MiB array through 3 actors that return their input: "
                   f"{num(run['cgraph']['median_ms'])} ms per execution forwarding the slot it read "
                   f"({run['cgraph']['copies_worth']:.2f} copies' worth), "
                   f"{num(run['cgraph_copying']['median_ms'])} ms copying at each stage, Ray CG "
                   f"{num(run['ray_cgraph']['median_ms'])} ms; medians.")


def soak(data: dict[str, Any]) -> str:
    total, minutes = data["summary"]["total"], data["seconds"] / 60
    faults = ", ".join(data["summary"]["by_fault"])
    return heading("Fault soak", "fault_soak.py", "fault_soak.md",
                   f"{total['trials']} random DAGs over 2-5 actors, one fault each ({faults}), "
                   f"{minutes:.0f} min: {total['hangs']} hangs, {total['wrong']} wrong results, "
                   f"{total['leaks']} leaks; the survivors' next graph ran right in "
                   f"{total['next_graph_ok']} of {total['trials']}; every typed error came within "
                   f"{total['max_error_s']:.2f} s of its fault.")


def soak_nodes(data: dict[str, Any]) -> str:
    total, minutes = data["summary"]["total"], data["seconds"] / 60
    faults = ", ".join(data["summary"]["by_fault"])
    nodes = data["args"].get("nodes", "?")
    return heading("Fault soak across nodes", "fault_soak.py", "fault_soak_nodes.md",
                   f"{total['trials']} random DAGs over 2-5 actors on {nodes} loopback nodes (shared memory, "
                   f"sockets and gloo edges), one fault each ({faults}), {minutes:.0f} min: "
                   f"{total['hangs']} hangs, {total['wrong']} wrong results, {total['leaks']} leaks on any "
                   f"node; the survivors' next graph ran right in {total['next_graph_ok']} of "
                   f"{total['trials']}; the slowest typed error came {total['max_error_s']:.2f} s after its "
                   f"fault; {total['unnamed_errors']} of {total['typed_errors']} typed errors did not name "
                   "a node, an actor and an op. Loopback nodes share one kernel: a lost node's ports "
                   "refuse at once, and there is no wire.")


def where(data: dict[str, Any]) -> str:
    bare, busy = data["rows"][0], data["rows"][1]
    return heading("Where-record", "bench_where.py", "where.md",
                   f"what each actor's loop pays per op to know where it is (a timeout and `status()` "
                   f"say it): {bare['record_ns_per_op']:.0f} ns over ops that do nothing, "
                   f"{busy['record_ns_per_op']:.0f} ns over 1 µs ops (budget {data['budget_ns']} ns); "
                   f"medians of the loop with and without it, alternated in one run.")


def graphs(data: dict[str, Any]) -> str:
    lat, idle = data["sections"]["latency"], data["sections"]["idle_cpu"]
    return heading("Several graphs on one actor", "bench_graphs.py", "graphs.md",
                   f"a graph's round trip with a second, idle graph on its actors is "
                   f"{lat['ratio']:.2f}x its round trip alone (goal <= {lat['goal']:.2f}x; "
                   f"{lat['idle_second_graph']['median_us']:.0f} vs {lat['alone']['median_us']:.0f} µs); "
                   f"an actor with two idle graphs uses "
                   f"{idle['two idle cgraph graphs']['percent_of_a_core']:.1f}% of a core, a plain Ray "
                   f"actor {idle['plain Ray actor']['percent_of_a_core']:.1f}%, one idle Ray Compiled Graph "
                   f"{idle['one idle Ray Compiled Graph']['percent_of_a_core']:.0f}%.")


def auto(data: dict[str, Any]) -> str:
    sec = data["sections"]["cpu"]
    med = sec["median_seconds"]
    return heading("overlap='auto'", "bench_auto.py", "auto.md",
                   f"on `make run`'s program, auto's median execution is {sec['auto_vs_better']:.2f}x the better "
                   f"of off and on (goal <= {sec['goal']}; {1e3 * med['auto']:.1f} ms against "
                   f"{1e3 * med['False']:.1f} off and {1e3 * med['True']:.1f} on, {sec['runs']} runs each, "
                   f"alternating); it chose {', '.join(f'{k} ({v} runs)' for k, v in sec['choices'].items())}.")


def ahead(data: dict[str, Any]) -> str:
    sec = data["sections"]["cpu"]
    med, own = sec["median_seconds"], sec["predicted"]["per execution"]
    return heading("Run-ahead", "bench_ahead.py", "ahead.md",
                   f"a 2-stage pipeline over gloo ({sec['bytes'] >> 20} MiB per value, {sec['in_flight']} "
                   f"executions in flight) runs {sec['measured_gain']:.2f}x faster with `run_ahead=True` "
                   f"({1e3 * med['run ahead']:.1f} against {1e3 * med['per execution']:.1f} ms per execution, "
                   f"{sec['runs']} runs each, alternating); the simulator predicted "
                   f"{sec['predicted_gain_own_engine']:.2f}x with comm on its own engine "
                   f"({1e3 * own['run ahead / own_engine']:.1f} against {1e3 * own['per execution / own_engine']:.1f} ms) "
                   f"and none on 2 shared cores (its model counts the stages' waits as core time).")


SCRIPTS = {"fault_soak_nodes": "fault_soak"}
"""The script that writes a results file not named after it (``fault_soak.py --nodes 3``)."""

AREAS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("runtime.json", runtime), ("collective.json", collective), ("overlap.json", overlap),
    ("crossnode.json", crossnode), ("forward.json", forward), ("scheduler.json", scheduler),
    ("channels.json", channels), ("fault_soak.json", soak),
    ("fault_soak_nodes.json", soak_nodes), ("where.json", where),
    ("graphs.json", graphs), ("auto.json", auto), ("ahead.json", ahead),
)


def tables() -> str:
    """Every area's table, from the results files as they are now."""
    return "\n\n".join(render(load(name)) for name, render in AREAS)


GPU_BEGIN = "<!-- gpu status: written by scripts/readme_tables.py from benchmarks/results/gpu.json -->"
GPU_END = "<!-- end of gpu status -->"


def gpu_status(data: dict[str, Any]) -> str:
    """What has run on a GPU, from the records ``make gpu-check`` leaves (one per run)."""
    runs = data["runs"]
    if not runs:
        return "**No GPU has run these checks yet.**"
    last = runs[-1]
    checks, sanitizer = last["checks"], last["sanitizer"]
    verdict = "every check passed" if checks["FAIL"] == 0 else f"{checks['FAIL']} checks failed"
    not_run = "; not run: " + ", ".join(last["not_run"]) if last["not_run"] else ""
    return (f"**Last GPU run: {last['date']}, {len(last['gpus'])} GPU ({', '.join(last['gpus'])}), "
            f"torch {last['torch']}, CUDA {last['cuda']}, NCCL {last['nccl']}:** {verdict} that could "
            f"run ({checks['PASS']} passed, {checks['FAIL']} failed, {checks['NOT RUN']} not run"
            f"{not_run}); under the CUDA sanitizer {sanitizer['PASS']} passed, {sanitizer['FAIL']} "
            f"failed; the overlap example: {last['overlap_example']}.{overlap_bench(last)} "
            f"Runs recorded: {len(runs)}.")


def overlap_bench(run: dict[str, Any]) -> str:
    """The overlap benchmark's GPU medians, where the run recorded them."""
    bench = run.get("overlap_bench")
    if not bench:
        return ""
    cg, ray = bench["cgraph_ms"], bench["ray_cg_ms"]
    return (f" The overlap benchmark (four actors on one GPU, 191 MiB float16 tensors): cgraph "
            f"{cg['no_overlap']} ms without overlap, {cg['overlap']} ms with it (compute alone "
            f"{cg['compute_alone']} ms, comm alone {cg['comm_alone']} ms: overlap cut "
            f"{bench['derived']['cgraph_time_cut_by_overlap']}); Ray CG {ray['no_overlap']} ms over "
            f"{bench['ray_cg_transport']}.")


def updated(readme: str, body: str, begin: str = BEGIN, end_marker: str = END) -> str:
    """``readme`` with the text between the markers replaced by ``body``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    start, end = readme.find(begin), readme.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"README.md needs the lines {begin!r} and {end_marker!r}, in that order")
    return readme[: start + len(begin)] + "\n" + body + "\n" + readme[end:]


def generated(readme: str) -> str:
    """``readme`` with both generated parts (the benchmark tables, the GPU status) as the
    results files give them now."""
    return updated(updated(readme, tables()), gpu_status(load("gpu.json")), GPU_BEGIN, GPU_END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    parser.add_argument("--print", action="store_true", help="print the tables only")
    args = parser.parse_args(argv)
    body = tables()
    if args.print:
        print(body)
        return 0
    current = README.read_text()
    new = generated(current)
    if args.check:
        if new != current:
            print("README.md's benchmark tables or GPU status are out of date: run scripts/readme_tables.py")
            return 1
        return 0
    if new != current:
        README.write_text(new)
    print(f"README.md: benchmark tables and GPU status {'rewritten' if new != current else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
