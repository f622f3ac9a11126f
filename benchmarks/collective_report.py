"""The markdown of ``bench_collective.py``'s results: one table per layout, the targets,
what loopback "nodes" are, and what the model predicts for a real two-node cluster."""

from __future__ import annotations

from typing import Any

from common import fmt, markdown_table

MIB = 1 << 20
ENTRIES = ("star", "chain", "tree", "butterfly", "ring", "reduction_server", "shared", "auto", "gloo")
REAL_INTER_BYTES_PER_S = 25e9
"""The link between two real nodes the model is asked about (a 200 Gb/s NIC)."""
REAL_INTER_ALPHA_S = 10e-6
"""Its latency per message in the model (kernel TCP across a switch: ~10 us)."""

LOOPBACK = (
    "**Loopback \"nodes\" are not real ones.** The 2-node layouts run two Ray nodes "
    "(`ray.cluster_utils.Cluster`) on this one machine: they share one kernel, the same two "
    "CPU cores and the loopback interface. cgraph keeps each node's ranks on their own "
    "shared memory and sends between nodes through one TCP connection per pair of ranks, as "
    "it would on real machines, but here a TCP byte between \"nodes\" is a copy through the kernel's socket "
    "buffers on the same cores, with no wire latency and no NIC bandwidth limit, and the "
    "ranks of both nodes compete for two cores. Real nodes have cores of their own "
    "(more parallelism) and a real link (more latency, bandwidth set by the NIC), so the "
    "cluster tables show which algorithms avoid the costlier link, not what a real cluster "
    "would measure."
)


def render_markdown(results: dict[str, Any]) -> str:
    s = results["settings"]
    out = ["# Allreduce on CPU actors: cgraph's algorithms vs gloo, on one node and across two", "",
           f"`{results['command']}` on {results['host']['cpu_count']} cores "
           f"({results['host']['cpu_model']}). Layout = nodes x ranks per node. Each point runs "
           f"every entry in at least {s['repeats']} rounds (up to {s.get('max_repeats')} within "
           f"{s.get('point_budget_s')} s; each table says how many) of {s['iters']} timed calls "
           "after a warm-up, entries rotated every round. A cell is the median over rounds of "
           "the round's median call (the slowest rank's time), with the 25th-75th percentile "
           "of the round medians in brackets. pred = what `auto` compares (the cost model with "
           "the group's fitted parameters times the algorithm's measured/model ratio); "
           "err = largest |result - float64 sum| (inputs in [0, 1)). \"cpu\" groups run "
           "cgraph's algorithms over shared memory within a node and their own authenticated "
           "TCP connections between nodes; "
           "gloo (baseline) is `ProcessGroupGloo.allreduce` called directly.", "", LOOPBACK, ""]
    for name, section in results["sections"].items():
        if section.get("status") != "ok":
            out += [f"## {name}: {section.get('status')}", ""]
            continue
        out += _md_layout(section)
    out += ["## Targets", "", markdown_table(["target", "point", "measured", "verdict"],
            [[t["target"], t["point"], t["value"], t["verdict"]] for t in results["targets"]]), ""]
    out += real_cluster_model(results)
    return "\n".join(out)


def _md_layout(section: dict[str, Any]) -> list[str]:
    points, params = section["points"], section["params"] or {}
    headers = ["algorithm"]
    for point in points:
        size = f"{point['nbytes'] // MIB} MiB"
        headers += [f"{size} ms", f"{size} pred", f"{size} err"]
    rows = []
    for entry in ENTRIES:
        row = [entry if entry != "gloo" else "gloo (baseline)"]
        for point in points:
            r = point["rows"][entry]
            mark = " *" if entry == point["best"] else ""
            row += [f"{fmt(r['median_ms'], 1)} ({fmt(r['q25_ms'], 1)}-{fmt(r['q75_ms'], 1)}){mark}",
                    fmt(r["predicted_ms"], 1), f"{r['max_error']:.2e}"]
        rows.append(row)
    picks = ", ".join(f"{pt['nbytes'] // MIB} MiB -> {' then '.join(pt['auto_history'])}" for pt in points)
    rounds = ", ".join(f"{pt['nbytes'] // MIB} MiB {pt['rounds']}" for pt in points)
    load = section.get("load_average_1m", [None, None])
    inter = ""
    if section["nodes"] > 1 and params.get("beta_inter_s_per_byte") is not None:
        inter = (f"; between nodes alpha {params['alpha_inter_s'] * 1e6:.1f} us, beta "
                 f"{params['beta_inter_s_per_byte'] * 1e9:.3f} ns/B")
    return [f"## {section['layout']}: {section['nodes']} node(s) x {section['ranks_per_node']} ranks", "",
            f"Load average of the shared 2-core machine (1 min) {load[0]} at the start, {load[1]} "
            "at the end.", "",
            f"Fitted: alpha {params.get('alpha_s', 0) * 1e6:.1f} us, beta "
            f"{params.get('beta_s_per_byte', 0) * 1e9:.3f} ns/B, gamma "
            f"{params.get('gamma_s_per_byte', 0) * 1e9:.3f} ns/B{inter} (tune took "
            f"{section['tune_seconds']:.2f} s). auto picks: {picks}. Rounds: {rounds}. "
            "* = best algorithm.", "",
            markdown_table(headers, rows), ""]


def real_cluster_model(results: dict[str, Any]) -> list[str]:
    """The model's table for two real nodes of 4 ranks, 16 MiB, 25 GB/s between them: with
    this host's fitted within-node parameters, and with a GPU-class node's."""
    from cgraph.comm.tuning.cost_model import CostParams, explain

    one_node = [sec for sec in results["sections"].values()
                if sec.get("status") == "ok" and sec["nodes"] == 1 and sec.get("params")]
    if not one_node:
        return []
    fitted = one_node[-1]["params"]
    between = {"alpha_inter": REAL_INTER_ALPHA_S, "beta_inter": 1 / REAL_INTER_BYTES_PER_S}
    host = CostParams(fitted["alpha_s"], fitted["beta_s_per_byte"], fitted["gamma_s_per_byte"], **between)
    gpu = CostParams(2e-6, 1 / 100e9, 1 / 50e9, **between)
    return ["## What the model predicts for two real nodes", "",
            f"A model, not a measurement: two nodes of 4 ranks, 16 MiB, and between the nodes "
            f"{REAL_INTER_BYTES_PER_S / 1e9:g} GB/s with {REAL_INTER_ALPHA_S * 1e6:g} us per "
            "message. Real nodes each have their own cores, so the ranks of both reduce at once, "
            "which the model assumes and this machine cannot give.", "",
            f"Within a node, this host's parameters as fitted on layout {one_node[-1]['layout']} "
            "(here the fit puts the copy cost in gamma and beta near 0, so the reduction "
            "dominates and the inter-node link matters little):", "",
            "```text", explain(8, 16 * MIB, host, 4), "```", "",
            "Within a node, a GPU-class link (100 GB/s, 2 us; reduction at 50 GB/s), where "
            "the link between the nodes dominates and the two-level algorithms win:", "",
            "```text", explain(8, 16 * MIB, gpu, 4), "```", ""]
