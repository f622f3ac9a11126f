"""The fault soak's records and report: one ``TrialLog`` per trial, a table per fault.

    TrialLog(index, fault, seed)      what one trial saw: outcomes, hangs, wrong, leaks, notes
    summarize(logs) -> {by_fault, total}    counts per fault kind (the JSON's "summary")
    report_markdown(logs, ...)      the table, what each column counts, every problem
"""

from __future__ import annotations

from typing import Any

from common import markdown_table
from soak_run import Outcome

FAULTS = ("kill9", "sigstop", "user_exception", "slow_consumer", "teardown", "driver_exit")
NODE_FAULTS = ("kill9", "sigstop", "node_removed", "comm_raises", "driver_exit", "stranger")  # --nodes
ALL_FAULTS = tuple(dict.fromkeys(FAULTS + NODE_FAULTS))


class TrialLog:
    """What one trial saw; ``problems`` feed the hangs / wrong / leaks columns."""

    def __init__(self, index: int, fault: str, seed: int) -> None:
        self.index, self.fault, self.seed = index, fault, seed
        self.record: dict[str, Any] = {"trial": index, "fault": fault, "seed": seed}
        self.hangs: list[str] = []
        self.wrong: list[str] = []
        self.leaks: list[str] = []
        self.outcomes: list[Outcome] = []
        self.notes: list[str] = []

    def add_outcomes(self, what: str, outcomes: list[Outcome]) -> None:
        self.outcomes += outcomes
        for o in outcomes:
            if o.verdict == "hang":
                self.hangs.append(f"{what} execution {o.execution}: {o.what}")
            elif o.verdict == "wrong":
                self.wrong.append(f"{what} execution {o.execution}: {o.what}")

    def add_notes(self, notes: list[str]) -> None:
        for note in notes:
            if note.startswith("hang:"):
                self.hangs.append(note)
            elif note.startswith("wrong:"):
                self.wrong.append(note)
            else:
                self.notes.append(note)

    def as_dict(self) -> dict[str, Any]:
        return {**self.record, "hangs": self.hangs, "wrong": self.wrong, "leaks": self.leaks,
                "notes": self.notes,
                "outcomes": [f"{o.execution}:{o.verdict}:{o.what}" + (f" (+{o.timeouts} timeouts)"
                                                                       if o.timeouts else "")
                             for o in self.outcomes]}


def summarize(logs: list[TrialLog]) -> dict[str, Any]:
    rows: dict[str, dict[str, int]] = {}
    for log_ in logs:
        row = rows.setdefault(log_.fault, {key: 0 for key in (
            "trials", "right", "typed_errors", "dropped", "not_submitted", "timeouts_retried",
            "hangs", "wrong", "leaks", "next_graph_ok", "dead_driver_segments", "unnamed_errors")})
        row["trials"] += 1
        row["right"] += sum(o.verdict == "ok" and o.what != "dropped" for o in log_.outcomes)
        row["dropped"] += sum(o.what == "dropped" for o in log_.outcomes)
        row["not_submitted"] += sum(o.verdict == "skipped" for o in log_.outcomes)
        row["typed_errors"] += sum(o.verdict == "error" for o in log_.outcomes)
        row["unnamed_errors"] += sum(o.verdict == "error" and o.names != "node actor op" for o in log_.outcomes)
        row["timeouts_retried"] += sum(o.timeouts for o in log_.outcomes)
        row["hangs"] += len(log_.hangs)
        row["wrong"] += len(log_.wrong)
        row["leaks"] += len(log_.leaks)
        row["next_graph_ok"] += log_.record.get("next_graph") == "ok"
        row["dead_driver_segments"] += log_.record.get("dead_driver_segments", 0)
        latencies = [o.after_fault_s for o in log_.outcomes if o.after_fault_s is not None]
        row["max_error_s"] = max([row.get("max_error_s", 0.0), *latencies])
    total = {key: sum(r[key] for r in rows.values()) for key in next(iter(rows.values()), {})}
    total["max_error_s"] = max((r["max_error_s"] for r in rows.values()), default=0.0)
    return {"by_fault": {f: rows[f] for f in ALL_FAULTS if f in rows}, "total": total}


COLUMNS = ("trials", "right", "typed_errors", "max_error_s", "unnamed_errors", "dropped", "not_submitted",
           "timeouts_retried", "hangs", "wrong", "leaks", "next_graph_ok")


def table(summary: dict[str, Any]) -> str:
    rows = [[fault, *(row[c] for c in COLUMNS)] for fault, row in summary["by_fault"].items()]
    rows.append(["**all**", *(f"**{summary['total'].get(c, 0)}**" for c in COLUMNS)])
    return markdown_table(["fault", *COLUMNS], rows)


def report_markdown(logs: list[TrialLog], command: str, seconds: float, timeout: float, slack: float,
           seed: int, nodes: int = 1) -> str:
    summary = summarize(logs)
    problems = [f"- trial {lg.index} ({lg.fault}): {kind}: {text}" for lg in logs
                for kind, items in (("hang", lg.hangs), ("wrong", lg.wrong), ("leak", lg.leaks))
                for text in items]
    dead = summary["by_fault"].get("driver_exit", {}).get("dead_driver_segments", 0)
    lines = [
        "# Fault soak" + (f" across {nodes} nodes" if nodes > 1 else ""), "",
        f"`{command}`: {len(logs)} trials in {seconds / 60:.1f} min, "
        f"get timeout {timeout:g} s (+{slack:g} s slack), seed {seed}.", "",
        table(summary), "",
        "- Per execution of the faulted graphs: right: the right value (or the armed "
        "exception, as cgraph.TaskError that is also a ValueError); typed_errors: "
        "ActorDiedError / ChannelClosedError after a kill, GraphTornDownError after a "
        "teardown, NodeDiedError after a node's removal, CommunicatorError or the send's own "
        "error after a communicator raised; max_error_s: the longest such an error took to "
        "come after its fault hit; unnamed_errors: typed errors whose message does not name "
        "all of a node, an actor and an op; "
        "dropped: its ref deleted unread (the graph reads it away); not_submitted: after "
        "execute() raised; timeouts_retried: cgraph.TimeoutError raised (short first tries, "
        "SIGSTOP, slow consumers) and the get retried.",
        "- hangs: a call past its timeout + slack, or still timing out after the fault ended; "
        "wrong: a wrong value, an untyped error, an error the fault does not explain; "
        "leaks: cgraph segments in /dev/shm, actor or other processes, listening sockets "
        "left after the trial (its actors killed), on any node (loopback nodes share this "
        "machine's /dev/shm and process table); next_graph_ok: the survivors' next graph "
        "ran three executions right.",
        f"- driver_exit: the dead drivers left {dead} segment(s) in /dev/shm, all removed by "
        "the next compile (os._exit skips every handler; cgraph removes segments of dead "
        "creators at compile), so none is counted as a leak unless it outlived that compile.",
        *([NODES_NOTE] if nodes > 1 else []),
        "", "## Problems", "", *(problems or ["none"]),
    ]
    return "\n".join(lines)


NODES_NOTE = (
    "- Across nodes: `ray.cluster_utils.Cluster` nodes on this one machine (a head and worker "
    "nodes, each a Ray node with its own raylet), actors placed on all of them, edges of "
    "shared memory, sockets and a communicator (gloo; a user's FlakyGloo in comm_raises) "
    "between them. node_removed kills a worker node that holds an actor of the graph "
    "(`cluster.remove_node`, no grace, and SIGKILL to the graph's actors on it, as a machine "
    "that dies) while a method of that node runs; comm_raises makes a communicator's "
    "send raise in one execution; stranger connects to every listening socket of the "
    "graph without its secret (garbage, forged lines, a huge frame). Loopback nodes share "
    "one kernel: a removed node's processes die and its ports refuse at once, where a real "
    "node's loss can leave connections silent until keepalive; there is no wire latency.")

