"""Fault soak: random DAGs over 2-5 actors, one random fault per trial, nothing lost.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fault_soak.py --trials 200 --seed 1
    make soak
    make soak SOAK_ARGS="--nodes 3 --trials 100"     across loopback nodes (soak_nodes.py)

Each trial builds a random DAG (``soak_dag.py``: chains, fan-in, fan-out, pass-through
stages, ints, dicts, tuples, small and large numpy arrays) over fresh actors on one local
Ray cluster,
compiles it with ``cgraph.compile``, runs a few executions checking every value, and
injects one fault at a random execution (``soak_run.py``):

    kill9           SIGKILL of an actor process, a random moment after execution k is submitted
    sigstop         SIGSTOP of an actor for longer than the get timeout, then SIGCONT
    user_exception  a node raises in execution k (cgraph.TaskError, also a ValueError)
    slow_consumer   a node sleeps in execution k (up to 1.5x the get timeout)
    teardown        compiled.teardown() from another thread while a get is pending
    driver_exit     a child driver process builds a graph and os._exit(0)s mid-way

With ``--nodes N`` (2 or 3) the cluster is ``ray.cluster_utils.Cluster`` nodes on this
machine (``soak_nodes.py``), the actors are spread over them, some values are torch tensors
on communicator edges (gloo), and the faults are those across nodes: kill9 (of an actor
off the head), sigstop, node_removed (``cluster.remove_node`` of a worker node that holds
an actor, and its actors' processes killed with it, inside a method of that node), comm_raises (a user communicator's send raises in one
execution), driver_exit, and stranger (a party without the secret at every listening
socket of the graph).

The driver keeps up to three executions in flight, reads a later one first now and
then (earlier results are buffered), drops a ref unread now and then, and sometimes
tries a get with a zero or tiny timeout first (then retries). Then it checks: every
get returned the right value or a typed cgraph error the fault explains, within its
timeout plus slack (no hang); the survivors' next graph (fresh actors after
driver_exit) works; and nothing of cgraph is left (``soak_leaks.py``: /dev/shm
segments, processes, listening sockets) once the trial's actors are killed. Prints a
table (``soak_report.py``) and writes ``--out``.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import configure_environment, host_info, log  # noqa: E402

configure_environment()

import ray  # noqa: E402
from soak_dag import (  # noqa: E402
    SoakWorker,
    build,
    crossing_tensors,
    digest,
    make_input,
    node_values,
    random_dag,
)
from soak_leaks import cgraph_segments, identify, leaks, snapshot, still_running  # noqa: E402
from soak_nodes import FlakyGloo, Nodes, Stranger, place  # noqa: E402
from soak_report import FAULTS, NODE_FAULTS, TrialLog, report_markdown, summarize  # noqa: E402
from soak_run import SLACK_S, Hang, Injector, Plan, guarded, run_executions  # noqa: E402

import cgraph  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "fault_soak"
NODES_OUT = Path(__file__).resolve().parent / "results" / "fault_soak_nodes"
CHILD_LIMIT_S = 120.0  # a child driver's whole life
EXIT_WAIT_S = 30.0  # for killed actors' processes to be gone


NODES: Nodes | None = None  # --nodes: the cluster of loopback nodes


# ------------------------------------------------------------------ actors
def start_actors(n: int, rng: random.Random, nodes: int = 1) -> tuple[list[Any], list[int], list[int]]:
    """``n`` fresh actors, their pids and their nodes (spread over ``nodes`` nodes)."""
    where = place(rng, n, nodes) if nodes > 1 else [0] * n
    actors = [SoakWorker.options(resources={f"node{k}": 1}).remote() if nodes > 1 else SoakWorker.remote()
              for k in where]
    return actors, ray.get([a.getpid.remote() for a in actors], timeout=120), where


def kill_actors(actors: list[Any], processes: dict[int, int], log_: TrialLog) -> None:
    """ray.kill each actor, then wait for its process (``identify``'s) to be gone."""
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead
            pass
    wait_gone(processes, log_, "after ray.kill")


def wait_gone(processes: dict[int, int], log_: TrialLog, what: str) -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while (alive := still_running(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive:
        log_.leaks.append(f"processes {alive} still run {EXIT_WAIT_S:.0f}s {what}")


def teardown(compiled: Any, log_: TrialLog, what: str) -> None:
    start = time.monotonic()
    try:
        guarded(compiled.teardown, 30.0, f"{what} teardown")
    except Hang as exc:
        log_.hangs.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - reported
        log_.wrong.append(f"{what} teardown raised {type(exc).__name__}: {exc}")
    log_.record[f"{what}_teardown_s"] = round(time.monotonic() - start, 3)


def where_now(compiled: Any) -> str:
    """Where each actor of a graph that hung is (``compiled.status()``), for the record."""
    try:
        return str(guarded(compiled.status, 30.0, "status"))
    except Exception as exc:  # noqa: BLE001 - a record, not a verdict
        return f"status failed: {type(exc).__name__}: {exc}"


def compile_graph(spec: Any, actors: list[Any], **options: Any) -> Any:
    return guarded(lambda: cgraph.compile(build(spec, actors), **options), 120.0, "compile")


# ------------------------------------------------------------------ one graph with a fault
def fault_plan(rng: random.Random, fault: str, spec: Any, actors: list[Any], pids: list[int],
               where: list[int], timeout: float, trial: int) -> Plan:
    """Where and how the trial's fault hits. A kill, a stop or a node's removal comes
    before the last execution (so some execution waits on it), at a random moment after
    execution ``at`` is submitted, often while a node of it sleeps a little (the fault
    then lands inside a method; a node's removal always does); a teardown comes while a
    node of execution ``at`` sleeps."""
    executions = rng.randint(3, 7)
    timed = fault in ("kill9", "sigstop", "node_removed", "stranger")
    at = rng.randrange(executions - 1 if timed else executions)
    delay = rng.choice((0.0, rng.uniform(0.0, 0.002), rng.uniform(0.0, 0.02)))  # executions take ~1 ms
    if fault == "teardown":
        delay = rng.choice((delay, rng.uniform(0.0, 0.3)))
    injector = Injector(fault, at, delay_s=delay)
    fails: set[int] = set()
    node = rng.choice(spec.nodes)
    seconds = 0.0
    used = sorted({n.actor for n in spec.nodes})
    if timed:
        off_head = [a for a in used if where[a] > 0]
        if fault == "kill9":  # across nodes: an actor off the head
            injector.pid = pids[rng.choice(off_head or used)]
        elif fault == "sigstop":
            injector.pid = pids[rng.choice(used)]
            injector.stop_s = injector.span_s = timeout + rng.uniform(0.5, 2.0)
        seconds = rng.choice((0.0, 0.0, rng.uniform(0.01, 0.3)))
        if fault == "node_removed" and NODES is not None:
            lost = where[rng.choice(off_head)] if off_head else rng.randrange(1, NODES.n)
            on_node = [pids[a] for a in range(len(pids)) if where[a] == lost]
            injector.call, injector.pid = (lambda: NODES.remove(lost, on_node)), -lost  # -k: node k
            on_lost = [n for n in spec.nodes if where[n.actor] == lost]
            if on_lost:  # the node is lost inside a method of execution ``at``: a waiter for
                # sure (executions take ~1 ms, a node's removal longer: it could miss them all)
                node, seconds = rng.choice(on_lost), rng.uniform(0.5, 1.5)
    elif fault == "user_exception":
        fails = {node.index}
        ray.get(actors[node.actor].arm.remote(spec.gid, node.index, "raise", at), timeout=60)
    elif fault == "slow_consumer":
        seconds = rng.choice((0.3, 1.0, 1.5 * timeout))
    elif fault == "teardown":
        seconds = rng.choice((0.0, rng.uniform(0.2, 1.5)))
    if seconds:
        injector.span_s = max(injector.span_s, seconds)
        ray.get(actors[node.actor].arm.remote(spec.gid, node.index, "sleep", at, seconds), timeout=60)
    return Plan(spec, trial, executions, rng.randint(1, 3), timeout, injector, fails, rng)


def graph_trial(rng: random.Random, log_: TrialLog, args: argparse.Namespace,
                actors: list[Any], pids: list[int], where: list[int]) -> list[int]:
    """The faulted graph; returns the indices of the actors that survive it."""
    spec = trial_dag(rng, log_, len(actors), where)
    options = {"submit_timeout": args.timeout, "max_inflight_executions": rng.choice((1, 2, 3, 10)),
               "buffer_size_bytes": rng.choice((1 << 20, 1 << 20, 4096))}
    log_.record.update(dag=spec.text(), actors=len(actors), nodes=where, options=options)
    plan = fault_plan(rng, log_.fault, spec, actors, pids, where, args.timeout, log_.index)
    plan.window = min(plan.window, options["max_inflight_executions"])  # more: CapacityError
    log_.record.update(fault_at=plan.injector.at, executions=plan.executions, window=plan.window)
    store = None
    if log_.fault == "comm_raises":
        options["default_communicator"], store = flaky_communicator(spec, plan)
    elif any(n.kind == "tensor" for n in spec.nodes):
        options["default_communicator"] = "gloo"
    compiled = compile_graph(spec, actors, **options)
    plan.injector.compiled = compiled
    if log_.fault == "stranger":
        stranger = Stranger(compiled._tag)
        plan.injector.call = stranger.attack
    try:
        log_.add_outcomes("faulted graph", run_executions(compiled, plan))
        if log_.hangs:
            log_.record["status"] = where_now(compiled)
    finally:
        plan.injector.finish()
        log_.add_notes(plan.injector.notes)
        teardown(compiled, log_, "faulted")
        del store
    if log_.fault == "stranger":
        log_.record.update(stranger_doors=len(stranger.doors), stranger_sent=stranger.sent)
    mine = {name for name in cgraph_segments(os.getpid()) if compiled._tag in name}
    log_.leaks += [f"shm {name} (after teardown)" for name in sorted(mine)]
    killed = plan.injector.pid if plan.injector.kind == "kill9" else None
    lost = -plan.injector.pid if plan.injector.kind == "node_removed" else None
    return [i for i, pid in enumerate(pids) if pid != killed and where[i] != lost]


def trial_dag(rng: random.Random, log_: TrialLog, n_actors: int, where: list[int]) -> Any:
    """The trial's random DAG; across nodes, with tensors on communicator edges, and for
    comm_raises one whose tensor another actor reads (else no communicator call is made)."""
    tensors = NODES is not None
    spec = random_dag(rng, 10 * log_.index, n_actors, tensors=tensors)
    for attempt in range(1, 30):
        if log_.fault != "comm_raises" or crossing_tensors(spec):
            break
        spec = random_dag(rng, 10 * log_.index + 1000 * attempt, n_actors, tensors=tensors)
    return spec


def flaky_communicator(spec: Any, plan: Plan) -> tuple[FlakyGloo, Any]:
    """comm_raises: a FlakyGloo whose send raises for the first crossing tensor's value in
    execution ``at``, and the TCPStore its ranks meet at (the trial holds it)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    host = ray.util.get_node_ip_address()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    crossing = crossing_tensors(spec)
    values, _, _ = node_values(spec, make_input(spec, plan.injector.at, plan.trial))
    poison = digest(values[crossing[0]]) if crossing else -1
    return FlakyGloo(host, store.port, poison), store


def next_graph(rng: random.Random, log_: TrialLog, args: argparse.Namespace, actors: list[Any]) -> None:
    """The survivors' next graph: three executions, every value right."""
    spec = random_dag(rng, 10 * log_.index + 1, len(actors), big=False, tensors=NODES is not None)
    no_fault = Injector("none", -1)
    plan = Plan(spec, log_.index, 3, 1, args.timeout, no_fault, set(), rng)
    options = {"default_communicator": "gloo"} if any(n.kind == "tensor" for n in spec.nodes) else {}
    try:
        compiled = compile_graph(spec, actors, **options)
    except Exception as exc:  # noqa: BLE001 - reported
        log_.wrong.append(f"next graph: compile failed: {type(exc).__name__}: {str(exc)[:200]}")
        log_.record["next_graph"] = "compile failed"
        return
    try:
        outcomes = run_executions(compiled, plan)
        if any(o.verdict == "hang" for o in outcomes):
            log_.record["next_status"] = where_now(compiled)
    finally:
        teardown(compiled, log_, "next")
    log_.record.update(next_dag=spec.text(), next_outcomes=[f"{o.execution}:{o.verdict}:{o.what}" for o in outcomes])
    bad = [o for o in outcomes if o.verdict != "ok"]
    for o in bad:
        (log_.hangs if o.verdict == "hang" else log_.wrong).append(f"next graph execution {o.execution}: {o.what}")
    log_.record["next_graph"] = "ok" if not bad else "failed"


# ------------------------------------------------------------------ a driver that exits
def driver_exit_trial(rng: random.Random, log_: TrialLog, args: argparse.Namespace) -> None:
    """A child driver builds a graph on this cluster and ``os._exit(0)``s without teardown:
    its actors must die with it, and its segments go at the next compile (anyone's)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child-driver",
               "--address", ray.get_runtime_context().gcs_address,
               "--seed", str(rng.randrange(1 << 30)), "--timeout", str(args.timeout),
               "--trials", str(log_.index), "--nodes", str(args.nodes)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True, text=True)
    try:
        out, _ = child.communicate(timeout=CHILD_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)
        out, _ = child.communicate()
        log_.hangs.append(f"child driver still running after {CHILD_LIMIT_S:.0f}s")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1]) if lines else {}
    log_.record.update(child=report, child_rc=child.returncode)
    if not report:
        log_.wrong.append(f"child driver printed no report (rc {child.returncode})")
        return
    log_.add_notes(report.get("problems", []))
    actor_pids = report.get("actors", [])
    wait_gone({int(pid): int(started) for pid, started in report.get("identities", {}).items()},
              log_, "after their driver exited (its actors)")
    left = cgraph_segments(child.pid)
    log_.record["dead_driver_segments"] = len(left)  # removed by the next compile, checked below
    log_.record["owners"] = [child.pid, *actor_pids]


def child_driver(args: argparse.Namespace) -> None:
    """``--child-driver``: connect, compile, run, and exit without teardown."""
    ray.init(address=args.address, log_to_driver=False, logging_level="error")
    rng = random.Random(args.seed)
    actors, pids, _ = start_actors(rng.randint(2, 3), rng, args.nodes)
    spec = random_dag(rng, 7, len(actors))
    report: dict[str, Any] = {"driver": os.getpid(), "actors": pids, "identities": identify(pids),
                              "dag": spec.text(), "problems": []}
    compiled = cgraph.compile(build(spec, actors), submit_timeout=args.timeout)
    plan = Plan(spec, args.trials, rng.randint(1, 3), 1, args.timeout, Injector("none", -1), set(), rng)
    report["problems"] = [f"wrong: child execution {o.execution}: {o.what}"
                          for o in run_executions(compiled, plan) if o.verdict != "ok"]
    how = report["exit"] = rng.choice(("idle", "in flight", "get pending"))
    if how != "idle":
        node = rng.choice(spec.nodes)
        ray.get(actors[node.actor].arm.remote(spec.gid, node.index, "sleep", plan.executions, 2.0))
        refs = [compiled.execute(*_child_input(spec, plan, i)) for i in range(2)]
        report["segments"] = len(cgraph_segments(os.getpid()))
        if how == "get pending":  # exit from another thread while the main one waits
            _exit_later(report, rng.uniform(0.05, 0.5))
            refs[-1].get(timeout=30)
    print(json.dumps(report), flush=True)
    os._exit(0)


def _child_input(spec: Any, plan: Plan, i: int) -> tuple[Any, ...]:
    from soak_dag import make_input

    return make_input(spec, plan.executions + i, plan.trial)


def _exit_later(report: dict[str, Any], seconds: float) -> None:
    import threading

    def bye() -> None:
        time.sleep(seconds)
        print(json.dumps(report), flush=True)
        os._exit(0)

    threading.Thread(target=bye, daemon=True).start()


# ------------------------------------------------------------------ trials
def run_trial(index: int, fault: str, args: argparse.Namespace) -> TrialLog:
    seed = args.seed * 100_003 + index
    rng = random.Random(seed)
    log_ = TrialLog(index, fault, seed)
    if NODES is not None:
        NODES.restore()  # a node removed by the last trial comes back before the snapshot
    driver = os.getpid()
    before = snapshot(driver)
    start = time.monotonic()
    actors: list[Any] = []
    pids: list[int] = []
    processes: dict[int, int] = {}
    try:
        if fault == "driver_exit":
            driver_exit_trial(rng, log_, args)
            actors, pids, where = start_actors(2, rng, args.nodes)
            processes = identify(pids)
            survivors = [0, 1]  # fresh actors: this compile also removes the dead driver's segments
        else:
            actors, pids, where = start_actors(rng.randint(2, 5), rng, args.nodes)
            processes = identify(pids)
            survivors = graph_trial(rng, log_, args, actors, pids, where)
        if not survivors:  # a node's removal took every actor: the next graph gets fresh ones
            more, more_pids, _ = start_actors(2, rng, 1)
            actors, pids = actors + more, pids + more_pids
            processes.update(identify(more_pids))
            survivors = [len(actors) - 2, len(actors) - 1]
        next_graph(rng, log_, args, [actors[i] for i in survivors])
    except Hang as exc:
        log_.hangs.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - the soak goes on; reported
        log_.wrong.append(f"trial failed: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        kill_actors(actors, processes, log_)
    owners = set(log_.record.get("owners", [])) | set(pids)
    log_.leaks += leaks(before, _settled_snapshot(before, driver, owners), driver, owners)
    log_.record["seconds"] = round(time.monotonic() - start, 2)
    return log_


def _settled_snapshot(before: Any, driver: int, owners: set[int]) -> Any:
    """A snapshot once Ray's worker pool has settled (a killed actor's process may take a
    moment to go): retried for a few seconds while it still shows something new."""
    deadline = time.monotonic() + 10.0
    while True:
        after = snapshot(driver)
        if not leaks(before, after, driver, owners) or time.monotonic() > deadline:
            return after
        time.sleep(0.5)


def fault_schedule(trials: int, seed: int, faults: tuple[str, ...] = FAULTS) -> list[str]:
    """One fault per trial: every kind equally often (shuffled), then at random."""
    rng = random.Random(seed)
    kinds = [faults[i % len(faults)] for i in range(trials - trials % len(faults))]
    kinds += rng.sample(faults, trials % len(faults))
    rng.shuffle(kinds)
    return kinds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3.0, help="get / submit timeout, seconds")
    parser.add_argument("--faults", default="", help="comma-separated fault kinds to draw from "
                        "(default: every kind of the mode)")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2, 3),
                        help="loopback Ray nodes (ray.cluster_utils); 2 or 3: the faults across nodes")
    parser.add_argument("--out", type=Path, default=None,
                        help="results path without suffix: writes OUT.json and OUT.md")
    parser.add_argument("--child-driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    global NODES
    args = parse_args()
    if args.child_driver:
        child_driver(args)
        return
    args.out = args.out or (NODES_OUT if args.nodes > 1 else DEFAULT_OUT)
    if args.nodes > 1:
        NODES = Nodes(args.nodes)
        ray.init(address=NODES.address, log_to_driver=False, logging_level="error")
    else:
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
                 logging_level="error", runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    start = time.monotonic()
    logs = []
    faults = tuple(args.faults.split(",")) if args.faults else NODE_FAULTS if args.nodes > 1 else FAULTS
    try:
        for index, fault in enumerate(fault_schedule(args.trials, args.seed, faults)):
            log_ = run_trial(index, fault, args)
            logs.append(log_)
            flags = [f"{len(v)} {k}" for k, v in (("hang", log_.hangs), ("wrong", log_.wrong),
                                                  ("leak", log_.leaks)) if v]
            log(f"trial {index:3d} {fault:14s} {log_.record['seconds']:6.1f}s "
                f"{' '.join(o.verdict[0] for o in log_.outcomes):20s} {', '.join(flags) or 'clean'}")
            for problem in (*log_.hangs, *log_.wrong, *log_.leaks):
                log(f"    {problem}")
    finally:
        ray.shutdown()
        if NODES is not None:
            NODES.shutdown()
    seconds = time.monotonic() - start
    command = " ".join(["fault_soak.py", *sys.argv[1:]])
    text = report_markdown(logs, command, seconds, args.timeout, SLACK_S, args.seed, args.nodes)
    print(text)
    results = {"benchmark": "fault_soak", "args": {k: str(v) for k, v in vars(args).items()},
               "host": host_info(), "seconds": round(seconds, 1), "summary": summarize(logs),
               "trials": [lg.as_dict() for lg in logs]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    args.out.with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
