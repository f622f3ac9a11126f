"""overlap="auto" in an actor: a loop's one change of schedule, between two executions.

The driver decides (``scheduler/decide.py``) from the durations the loops recorded, then
asks every actor of the graph, with one call each (``request``), to run the chosen
schedule from execution ``at`` on. It asks while it holds back execution ``at - 1``'s
input, which every op of every actor waits on (compile checks it), so no loop can have
passed that boundary yet: every actor changes schedules at the same one, and values of
one execution never meet ops of two schedules. The loop reads its cell once per
execution, after ``end_execution``; the cell costs no lock on that path. A cell is per
loop (graph and actor), so threads that stand for actors in one process (the unit tests'
harness) each switch.

    Cell(at=-1: none asked, schedule, record, switched_at)
"""

from __future__ import annotations

import threading
from collections import OrderedDict

NONE = -1
class Cell:
    """One loop's switch: from execution ``at`` on, run ``schedule``; ``record``: keep
    recording op events; ``switched_at``: where the loop did (None: not yet)."""

    __slots__ = ("at", "record", "schedule", "switched_at")

    def __init__(self) -> None:
        self.at = NONE
        self.schedule = ""
        self.record = False
        self.switched_at: int | None = None


_CELLS: OrderedDict[tuple[str, str], Cell] = OrderedDict()  # (graph tag, actor) -> cell
_LOCK = threading.Lock()
_KEEP = 64  # the cells of this many latest loops


def cell(tag: str, actor: str) -> Cell:
    """The cell of ``actor``'s loop of graph ``tag``, made on first use (by the loop, or by a
    request that came first)."""
    with _LOCK:
        found = _CELLS.get((tag, actor))
        if found is None:
            found = _CELLS[(tag, actor)] = Cell()
            while len(_CELLS) > _KEEP:
                _CELLS.popitem(last=False)
        return found


def request(instance: object, tag: str, actor: str, at: int, schedule: str, record: bool) -> None:
    """From the driver (a Ray call): ``actor``'s loop runs ``schedule`` from execution ``at``
    on; ``record``: it keeps recording op events after it."""
    del instance  # Ray's __ray_call__ passes it
    target = cell(tag, actor)
    target.schedule, target.record = schedule, record
    target.at = at  # last: the loop acts on ``at``


def switched_at(instance: object, tag: str, actor: str) -> int | None:
    """The execution from which ``actor``'s loop of graph ``tag`` ran the schedule asked for."""
    del instance
    found = _CELLS.get((tag, actor))
    return None if found is None else found.switched_at
