"""The runtime benchmark's report: its targets (PASS/MISS) and runtime.md.

``bench_runtime.py`` measures and builds the results dict (saved as
runtime.json); this module only reads that dict, so a report can be rendered
again from a saved run:

    results["targets"] = evaluate_targets(results)
    markdown = render_markdown(results)

``DEFINITIONS`` says what every section measures; runtime.md ends with it.
"""

from __future__ import annotations

from typing import Any

from common import fmt, fmt_ratio, markdown_table, ok_entry, status_note, system_rows, verdict

MiB = 1 << 20
LABELS = {
    "cgraph": "cgraph",
    "cgraph_colocate": 'cgraph, cpu_affinity="colocate"',
    "cgraph_timeline": "cgraph, timeline=True (recording)",
    "ray_cgraph": "Ray Compiled Graphs",
    "ray_plain": "plain Ray calls",
}
PIPELINED_SHARE_NEEDED = 0.5  # of memcpy into shm, on the largest array
TIMELINE_OVERHEAD_ALLOWED = 0.10  # recording on: at most 10% added to the median

DEFINITIONS = """\
    floor       two bare forked processes waking each other: a byte through two
                pipes, or two blocking os.eventfd's; a round trip = two wake-ups;
                the targets use the best of 10 batch medians (noise only adds)
    memcpy      single-core np.copyto of each array size into a pre-faulted POSIX
                shared-memory mapping (how a shm channel writes) and into an
                ordinary numpy array; "both cores at once": two forked processes
                each copying its own array into its own mapping at the same time,
                the median time of one copy (the slower process's): the speed of
                each of the pipelined chain's two concurrent copies at best
    latency     one execute + get of the int 1, one at a time, on three DAGs:
                  echo     driver -> A -> driver                          hops 2
                  chain3   driver -> A -> B -> C -> driver                hops 4
                  fanout3  driver -> A, B, C -> D.combine(A, B, C) -> driver
                           (4 actors, 7 channels)                         hops 3
                hops = channel hops on the critical path, driver to driver;
                per-hop median = median round trip / hops. "timeline=True":
                the same graph recording one event per op per execution
                (compiled.timeline()); its target compares its median with
                plain cgraph's, same run
    throughput  a uint8 array through driver -> A.echo -> B.checksum -> driver;
                B returns (nbytes, first, last), so the array crosses two channels
                (two copies) and the driver gets a few bytes back. Two rates, in
                GB/s (1 GB = 1e9 B), each next to memcpy into shm of the same size:
                  sequential  ("latency-bound") one execution at a time:
                              array bytes / median time of one execute + get.
                              The two copies run one after the other, so copying
                              at memcpy speed on both hops gives 50% of memcpy.
                              "sustained": array bytes x N / the sum of the N
                              times (a window of k = 1; noise counts in full, as
                              it does in the pipelined rate)
                  pipelined   k executions in flight (k = the compiled graph's
                              max_inflight_executions, the same for cgraph and
                              Ray CG; plain Ray: k chained .remote calls): submit
                              k, then read the oldest result and submit the next
                              as soon as it is read (a sliding window), N
                              executions from the first submit to the last read;
                              array bytes x N / that wall time, median of R
                              repeats. Copies of different executions may
                              overlap. Before each submit the array's first and
                              last bytes are set to the execution's number, and
                              every result is checked against them
    idle_cpu    % of a core used by each actor of a compiled chain3 that waits
                for input: utime+stime from /proc/<pid>/stat (pids from
                actor.getpid before compiling), and the same from
                /proc/<pid>/task/*/schedstat (ns resolution). Per thread, in the
                same window: schedstat ns and voluntary context switches
                (wake-ups) of /proc/<pid>/task/<tid>, split into the main thread
                (tid == pid), the graph's executor loop thread (by name: cgraph
                "ray::cgraph_loo...", Ray CG "ray::Node.__ray..." = __ray_call__)
                and all others. Every Ray actor's main thread wakes every 10 ms
                (Ray's core worker checks for Python signals, taking the GIL):
                that costs most of what the plain Ray row shows, so no Ray
                actor's process-level idle CPU can go below plain Ray's
    compile     compile of chain3 on 3 existing actors that imported torch;
                median of several compile / first execute / teardown cycles

Systems: ``cgraph`` (cgraph.compile, compiled.execute(x).get()), ``ray_cgraph``
(dag.experimental_compile, ray.get(compiled.execute(x))) and ``ray_plain`` (the
same methods chained with .remote, one ray.get). Both compiled systems get the
same buffer_size_bytes and max_inflight_executions: 1 MiB and 10 (Ray's
defaults) for latency; for throughput 1.2x the largest array per slot and k
slots per channel (k fewer than asked when k slots on every channel would not
fit in memory: the throughput section records why). Each (system, DAG) pair
gets fresh actors, killed afterwards. Until cgraph's runtime can execute, its
entries read "cgraph runtime not available: <error>"."""


# ================================================================== targets
def _target(name: str, requirement: str, cgraph: str, anchor: str, ok: bool | None) -> dict[str, Any]:
    return {"target": name, "requirement": requirement, "cgraph": cgraph, "anchor": anchor,
            "verdict": verdict(ok)}


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with cgraph's value, the anchor's, and PASS/MISS/n/a."""
    sec = results["sections"]
    floor = ok_entry(sec.get("floor"))
    floor_rt = floor["floor_round_trip_us"] if floor else None
    rows = []
    for dag, entry in (ok_entry(sec.get("latency")) or {}).get("dags", {}).items():
        rows += _latency_targets(dag, entry["systems"], floor_rt)
        if dag in ("echo", "chain3"):
            rows.append(_timeline_target(dag, entry["systems"]))
    rows.append(_throughput_target(ok_entry(sec.get("throughput")), ok_entry(sec.get("memcpy"))))
    rows += _idle_targets((ok_entry(sec.get("idle_cpu")) or {}).get("systems", {}))
    comp = (ok_entry(sec.get("compile")) or {}).get("systems", {})
    cg, anchor = ok_entry(comp.get("cgraph")), ok_entry(comp.get("ray_cgraph"))
    rows.append(_target("compile chain3", "< 1 s (median)", fmt(cg and cg["median_compile_s"], 3, "s"),
                        f"Ray CG {fmt(anchor and anchor['median_compile_s'], 3, 's')}",
                        cg and cg["median_compile_s"] < 1.0))
    return rows


def _timeline_target(dag: str, systems: dict[str, Any]) -> dict[str, Any]:
    """Recording a timeline costs at most 10% of the median, same run, same DAG."""
    off, on = ok_entry(systems.get("cgraph")), ok_entry(systems.get("cgraph_timeline"))
    ratio = on and off and on["median_us"] / off["median_us"]
    return _target(f"timeline recording {dag}", f"median on <= {1 + TIMELINE_OVERHEAD_ALLOWED:.2f}x off",
                   f"{fmt(on and on['median_us'], 1, 'us')} on vs {fmt(off and off['median_us'], 1, 'us')} off "
                   f"({fmt_ratio(ratio)})", "-", ratio and ratio <= 1 + TIMELINE_OVERHEAD_ALLOWED)


def _idle_targets(idle: dict[str, Any]) -> list[dict[str, Any]]:
    """Idle CPU per actor process, and of the graph's executor thread alone (when recorded)."""
    cg, anchor = ok_entry(idle.get("cgraph")), ok_entry(idle.get("ray_cgraph"))
    rows = [_target("idle actor CPU", "< 1% of a core (max over actors, schedstat)",
                    fmt(cg and max(cg["actor_percent_schedstat"]), 2, "%"),
                    f"Ray CG {fmt(anchor and max(anchor['actor_percent_schedstat']), 1, '%')}",
                    cg and max(cg["actor_percent_schedstat"]) < 1.0)]
    if cg and "loop_thread_percent" not in cg:
        return rows  # a results file from before per-thread CPU was recorded
    loop, anchor_loop = max_loop_thread(cg), max_loop_thread(anchor)
    rows.append(_target("idle CPU of the graph's executor thread", "< 1% of a core (max over actors)",
                        fmt(loop, 2, "%"), f"Ray CG {fmt(anchor_loop, 1, '%')}",
                        None if loop is None else loop < 1.0))
    return rows


def max_loop_thread(entry: dict[str, Any] | None) -> float | None:
    """The busiest actor's executor loop thread, % of a core; None when not identified."""
    found = [p for p in (entry or {}).get("loop_thread_percent") or [] if p is not None]
    return max(found) if found else None


def _latency_targets(dag: str, systems: dict[str, Any], floor_rt: float | None) -> list[dict[str, Any]]:
    rows = []
    for system, suffix in (("cgraph", ""), ("cgraph_colocate", ", colocate")):
        cg = ok_entry(systems.get(system))
        if cg or system == "cgraph":
            rows += _latency_rows(f"{dag}{suffix}", cg, ok_entry(systems.get("ray_cgraph")), floor_rt)
    return rows


def _latency_rows(dag: str, cg: Any, anchor: Any, floor_rt: float | None) -> list[dict[str, Any]]:
    need = anchor["median_us"] / 4 if anchor else None
    hop_need = 3 * floor_rt if floor_rt else None
    anchor_p99 = anchor and anchor["p99_us"] / anchor["median_us"]
    return [
        _target(f"latency {dag}", f"median <= 1/4 of Ray CG (<= {fmt(need, 1, 'us')})",
                fmt(cg and cg["median_us"], 1, "us"), f"Ray CG {fmt(anchor and anchor['median_us'], 1, 'us')}",
                cg and need and cg["median_us"] <= need),
        _target(f"per-hop {dag}", f"<= 3x bare wake-up round trip (<= {fmt(hop_need, 1, 'us')})",
                fmt(cg and cg["per_hop_median_us"], 1, "us"),
                f"Ray CG {fmt(anchor and anchor['per_hop_median_us'], 1, 'us')}",
                cg and hop_need and cg["per_hop_median_us"] <= hop_need),
        _target(f"p99 {dag}", "p99 <= 5x own median", fmt_ratio(cg and cg["p99_us"] / cg["median_us"]),
                f"Ray CG {fmt_ratio(anchor_p99)}", cg and cg["p99_us"] <= 5 * cg["median_us"]),
    ]


def _throughput_target(tput: dict[str, Any] | None, memcpy: dict[str, Any] | None) -> dict[str, Any]:
    """Judged on the pipelined rate; the sequential one is shown beside it."""
    name = "throughput, largest array"
    if not tput or not memcpy:
        return _target(name, ">= 50% of memcpy into shm, pipelined", "-", "-", None)
    size = max(int(k) for k in memcpy["sizes"])
    ref = memcpy["sizes"][str(size)]["shm_gbps"]

    def shares(system: str) -> tuple[float | None, float | None]:
        entry = ok_entry(tput["systems"].get(system))
        row = entry and entry["sizes"].get(str(size))
        if not row:
            return None, None
        return row["pipelined"]["gbps"] / ref, row["gbps"] / ref

    def cell(pipelined: float | None, sequential: float | None) -> str:
        return (f"{fmt(pipelined and 100 * pipelined, 0, '%')} pipelined "
                f"({fmt(sequential and 100 * sequential, 0, '%')} sequential)")

    (cg, cg_seq), anchor = shares("cgraph"), shares("ray_cgraph")
    paired = memcpy["sizes"][str(size)].get("shm_paired_gbps")
    ceiling = (f"; with both cores copying at once each copy runs at {fmt(100 * paired / ref, 0, '%')} of it"
               if paired else "")
    return _target(f"{name} ({size // MiB} MiB)",
                   f">= 50% of memcpy into shm ({ref:.2f} GB/s{ceiling}), pipelined k={tput['window']['k']}",
                   cell(cg, cg_seq), f"Ray CG {cell(*anchor)}", cg and cg >= PIPELINED_SHARE_NEEDED)


# ================================================================== Markdown
def render_markdown(results: dict[str, Any]) -> str:
    """runtime.md: the targets, one table per section, notes, and the definitions."""
    host, sec = results["host"], results["sections"]
    parts = [
        "# Runtime: cgraph vs Ray Compiled Graphs vs plain Ray",
        f"Measured {results['created']} on {host['cpu_model']} ({host['cpu_count']} cores), "
        f"Python {host['python']}, Ray {host.get('ray', '?')}, numpy {host.get('numpy', '?')}; "
        f"`{results['command']}`" + (" (**quick run: few iterations, small arrays**)" if results["quick"] else "")
        + ". All systems measured in this one run; every (system, DAG) pair on fresh actors. "
        f"Before the run {fmt(host.get('background_busy_percent'), 0, '%')} of all cores were busy "
        f"(load average {fmt(host.get('load_average_1m'), 2)}): the machine is shared, so "
        "absolute numbers move between runs; compare the ratios within one run.",
        "## Targets",
        markdown_table(["target", "requirement", "cgraph", "anchor", "verdict"],
                       [list(t.values()) for t in results.get("targets", [])]),
    ]
    for title, render in (("Round-trip latency", _md_latency), ("Throughput of numpy arrays", _md_throughput),
                          ("Physical floor: bare wake-up round trip", _md_floor),
                          ("Idle CPU of a compiled 3-actor chain", _md_idle), ("Compile time", _md_compile)):
        parts += [f"## {title}", render(sec)]
    notes = _notes(results)
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    return "\n\n".join([*parts, "## Definitions", f"```\n{DEFINITIONS}\n```"])


def _md_latency(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "latency"):
        return status
    rows = []
    for dag, entry in sec["latency"]["dags"].items():
        anchor = ok_entry(entry["systems"].get("ray_cgraph"))

        def cells(r: dict[str, Any], anchor: dict[str, Any] | None = anchor) -> list[list[str]]:
            return [[fmt(r["median_us"]), fmt(r["p99_us"]), fmt(r["per_hop_median_us"]),
                     fmt_ratio(r["p99_us"] / r["median_us"]),
                     fmt_ratio(r["median_us"] / anchor["median_us"]) if anchor else "-",
                     " / ".join(fmt(m) for m in r.get("round_medians_us", []))]]

        rows += system_rows([f"{dag} ({entry['hops']} hops)"], entry["systems"], LABELS, 8, cells)
    lat = sec["latency"]
    rounds = lat.get("rounds", 1)
    return (f"Microseconds. {rounds} round(s) x {lat['iterations']} executions per row after warm-up, each "
            "round on fresh actors with the systems' order rotated; the statistics pool the rounds.\n\n"
            + markdown_table(["DAG", "system", "median us", "p99 us", "per-hop median us", "p99/median",
                              "median vs Ray CG", "round medians us"], rows))


THROUGHPUT_HEADERS = ["system", "array", "sequential median ms", "sequential p99 ms", "sequential GB/s",
                      "sequential % of memcpy", "sequential sustained GB/s", "pipelined GB/s",
                      "pipelined GB/s min-max", "pipelined % of memcpy", "pipelined / sequential sustained"]


def _md_throughput(sec: dict[str, Any]) -> str:
    tput, memcpy = ok_entry(sec.get("throughput")), ok_entry(sec.get("memcpy"))
    refs = (memcpy or {}).get("sizes", {})
    width = len(THROUGHPUT_HEADERS)
    rows = [[name, "all", status, *[""] * (width - 3)] for name in ("throughput", "memcpy")
            if (status := status_note(sec, name))]

    def share(gbps: float, size: str) -> str:
        return fmt(100 * gbps / refs[size]["shm_gbps"], 0, "%") if size in refs else "-"

    def cells(entry: dict[str, Any]) -> list[list[str]]:
        return [[f"{int(size) // MiB} MiB", fmt(r["median_us"] / 1e3, 2), fmt(r["p99_us"] / 1e3, 2),
                 fmt(r["gbps"], 2), share(r["gbps"], size), fmt(r["sustained_gbps"], 2), fmt(p["gbps"], 2),
                 f"{min(p['gbps_each']):.2f}-{max(p['gbps_each']):.2f}", share(p["gbps"], size),
                 fmt_ratio(p["gbps"] / r["sustained_gbps"])]
                for size, r in entry["sizes"].items() if (p := r["pipelined"])]

    rows += system_rows([], (tput or {}).get("systems", {}), LABELS, width, cells)
    labels = {"shm": "memcpy into shm (1 core)", "numpy": "memcpy into numpy (1 core)",
              "shm_paired": "memcpy into shm, both cores at once (per copy)"}
    for size, ref in refs.items():
        rows += [[label, f"{int(size) // MiB} MiB", fmt(ref[f"{dst}_median_ms"], 2), "", fmt(ref[f"{dst}_gbps"], 2),
                  share(ref[f"{dst}_gbps"], size) if dst != "numpy" else "", *[""] * (width - 6)]
                 for dst, label in labels.items() if f"{dst}_gbps" in ref]
    return _throughput_preamble(tput) + markdown_table(THROUGHPUT_HEADERS, rows)


def _throughput_preamble(tput: dict[str, Any] | None) -> str:
    if not tput:
        return ""
    window = tput["window"]
    reduced = f" ({window['reason']})" if window["reason"] else ""
    return (f"`{tput['dag']}`; GB/s = 1e9 B/s. **Sequential** (latency-bound): array bytes / median time of one "
            "execute + get, one execution at a time, so the two copies never overlap; **sustained**: array bytes "
            "x N / the sum of the N times, comparable with the pipelined rate, which also counts every stall. "
            "**Pipelined**: "
            f"k = {window['k']} executions in flight{reduced} (a sliding window: the next is submitted as soon "
            f"as the oldest is read), array bytes x N / wall time of N executions (N = "
            f"{', '.join(f'{n} for {int(s) // MiB} MiB' for s, n in tput['pipelined_executions'].items())}); "
            f"median (and min-max) of {tput['pipelined_repeats']} repeats. Compiled graphs: "
            f"buffer_size_bytes = {tput['buffer_size_bytes'] / MiB:.0f} MiB per slot, "
            f"max_inflight_executions = {window['k']}. See Definitions.\n\n")


def _md_floor(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "floor"):
        return status
    floor = sec["floor"]
    rows = [[kind, "scheduler's choice", fmt(floor[kind]["median_us"]), fmt(floor[kind]["p99_us"]),
             fmt(floor[kind]["min_us"]), fmt(floor[kind]["best_batch_median_us"])] for kind in ("pipe", "eventfd")]
    for name, where in (("pipe_one_cpu", "both on CPU {0}"), ("pipe_two_cpus", "CPU {0} and CPU {1}")):
        if name in floor:
            f = floor[name]
            rows.append(["pipe", where.format(*f["cpus"]), fmt(f["median_us"]), fmt(f["p99_us"]),
                         fmt(f["min_us"]), ""])
    return (f"Two forked processes, {floor['iterations']} round trips each in {floor['batches']} batches; "
            "other work on the shared cores only adds to a wake-up, so the floor the targets use is the "
            "cheapest seen: the best batch median of either primitive or the median with both processes "
            f"on one CPU: {floor['floor_round_trip_us']:.1f} us.\n\n"
            + markdown_table(["primitive", "processes pinned", "median us", "p99 us", "min us",
                              "best batch median us"], rows)
            + _placement_note(sec))


def _placement_note(sec: dict[str, Any]) -> str:
    """What the pinned floors say about the echo target (2 hops = 1 round trip)."""
    floor = sec["floor"]
    echo = ((ok_entry(sec.get("latency")) or {}).get("dags", {}).get("echo") or {}).get("systems", {})
    anchor = ok_entry(echo.get("ray_cgraph"))
    if "pipe_two_cpus" not in floor or not anchor:
        return ""
    two, one = floor["pipe_two_cpus"]["median_us"], floor["pipe_one_cpu"]["median_us"]
    budget = anchor["median_us"] / 4
    head = (f"\n\nPlacement decides the floor: a bare round trip between processes on two CPUs costs "
            f"{two:.1f} us (an idle vCPU halts and is woken through the hypervisor), on one CPU "
            f"{one:.1f} us. The echo target (1/4 of Ray CG: {budget:.1f} us) ")
    if budget >= two:
        return head + "lies above the two-CPU bare round trip."
    return head + ("lies below the two-CPU bare round trip, so processes on two CPUs that sleep while "
                   "they wait cannot meet it here; Ray CG's actors busy-wait instead (see the idle CPU "
                   "table), and `cpu_affinity=\"colocate\"` puts cgraph's processes on one CPU.")


IDLE_HEADERS = ["system", "each actor (stat)", "max actor (stat)", "each actor (schedstat)", "driver (stat)"]
THREAD_HEADERS = ["main thread (Ray's 10 ms CheckSignal timer)", "main thread wake-ups/s",
                  "graph's loop thread", "other threads"]


def _md_idle(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "idle_cpu"):
        return status
    systems = sec["idle_cpu"]["systems"]
    threads = any("main_thread_percent" in e for e in systems.values())  # absent in older results

    def each(values: list[Any] | None, digits: int = 2, unit: str = "%") -> str:
        return ", ".join(fmt(v, digits, unit) for v in values) if values else "-"

    def cells(r: dict[str, Any]) -> list[list[str]]:
        row = [each(r["actor_percent"], 1), fmt(r["max_actor_percent"], 1, "%"),
               each(r["actor_percent_schedstat"]), fmt(r["driver_percent"], 1, "%")]
        if threads:
            row += [each(r.get("main_thread_percent")), each(r.get("main_thread_wakeups_per_s"), 0, ""),
                    each(r.get("loop_thread_percent")), each(r.get("other_threads_percent"))]
        return [row]

    headers = IDLE_HEADERS + (THREAD_HEADERS if threads else [])
    rows = system_rows([], systems, LABELS, len(headers), cells)
    text = (f"% of one core over {sec['idle_cpu']['idle_seconds']:g} s after 20 executions (plain Ray: the "
            "same actors, nothing compiled). /proc/<pid>/stat counts 10 ms ticks (charged to whatever runs "
            "at the tick), schedstat the nanoseconds each thread ran: the target uses schedstat"
            + ("; the thread columns use schedstat ns, one value per actor" if threads else "") + ".\n\n"
            + markdown_table(headers, rows))
    if threads:
        text += "\n\nBusiest threads of the first actor (name, % of a core, wake-ups/s): " + "; ".join(
            f"{LABELS.get(system, system)}: " + ", ".join(f"{n} {p:.2f}% {w:.0f}/s" for n, p, w in e["top_threads"][0])
            for system, e in systems.items() if ok_entry(e) and e.get("top_threads")) + "."
    return text


def _md_compile(sec: dict[str, Any]) -> str:
    if status := status_note(sec, "compile"):
        return status

    def cells(r: dict[str, Any]) -> list[list[str]]:
        return [[fmt(r["median_compile_s"], 3), fmt(r["median_first_execute_s"], 3),
                 fmt(r["median_teardown_s"], 3), ", ".join(f"{t:.3f}" for t in r["compile_s"])]]

    rows = system_rows([], sec["compile"]["systems"], LABELS, 5, cells)
    return (f"Seconds; chain3 on 3 existing actors, {sec['compile']['cycles']} cycles.\n\n"
            + markdown_table(["system", "median compile s", "median first execute s", "median teardown s",
                              "each compile s"], rows))


def _notes(results: dict[str, Any]) -> list[str]:
    """What a reader of the tables should know, derived from this run's numbers."""
    sec, notes = results["sections"], []
    tput = ok_entry(sec.get("throughput"))
    ray_tput = ok_entry((tput or {}).get("systems", {}).get("ray_cgraph"))
    if ray_tput and (ray_tput.get("teardown_s") or 0) > 4:
        timeout = results["settings"].get("environment", {}).get("RAY_CGRAPH_teardown_timeout", "?")
        notes.append(f"Ray Compiled Graphs' teardown of the throughput graph did not finish: after "
                     f"RAY_CGRAPH_teardown_timeout={timeout} s it killed the actors "
                     f"({ray_tput['teardown_s']:.1f} s).")
    if tput:
        notes += _throughput_notes(tput, results["host"].get("cpu_count"))
    idle = (ok_entry(sec.get("idle_cpu")) or {}).get("systems", {})
    plain = ok_entry(idle.get("ray_plain"))
    if plain:
        notes.append(f"For scale: an idle plain Ray actor with nothing compiled uses up to "
                     f"{max(plain['actor_percent_schedstat']):.2f}% of a core (Ray's own threads, schedstat).")
    if plain and plain.get("main_thread_percent"):
        notes.append(_idle_thread_note(plain, ok_entry(idle.get("cgraph"))))
    return notes


def _idle_thread_note(plain: dict[str, Any], cg: dict[str, Any] | None) -> str:
    main = [p for p in plain["main_thread_percent"] if p is not None]
    wakes = [w for w in plain["main_thread_wakeups_per_s"] if w is not None]
    note = (f"Every Ray actor's main thread wakes every 10 ms (Ray's core worker checks for Python signals, "
            f"taking the GIL): in the plain Ray actors it used up to {max(main):.2f}% of a core (of their "
            f"{max(plain['actor_percent_schedstat']):.2f}% in all) at {min(wakes):.0f}-{max(wakes):.0f} "
            "wake-ups/s, and it runs in every Ray actor, so no Ray actor's process-level idle CPU can go "
            "below plain Ray's.")
    loop = max_loop_thread(cg)
    if loop is not None:
        note += f" cgraph's own executor thread adds at most {loop:.2f}% of a core."
    return note


def _throughput_notes(tput: dict[str, Any], cores: int | None) -> list[str]:
    notes = [
        "Sequential throughput: the array crosses two channels one after the other, so an executor that "
        "copies it at memcpy speed on both hops reaches 50% of memcpy; more needs fewer copies.",
        f"Pipelined throughput: with k executions in flight the driver's copy of one execution can run while "
        f"A copies an earlier one, so up to 100% of memcpy, but only with a free core for each (the driver, A "
        f"and B are three processes on this machine's {cores or '?'} cores) and memory bandwidth for two "
        "copies at once: the row \"both cores at once\" is the most each of the two concurrent copies can "
        "reach, so the pipelined chain's ceiling is that row's % of memcpy (two copies per execution, one "
        "per core).",
    ]
    checked = {LABELS.get(sy, sy): sum(r["pipelined"]["results_checked"] for r in e["sizes"].values())
               for sy, e in tput["systems"].items() if ok_entry(e)}
    if checked:
        notes.append("Every pipelined result matched its execution's (nbytes, first byte, last byte): "
                     + ", ".join(f"{n} results from {label}" for label, n in checked.items()) + ".")
    if tput["window"]["reason"]:
        notes.append(f"Pipelined window: {tput['window']['reason']}.")
    return notes
