"""A communicator call that raises fails its execution and its group, never the loop.

A fault leaves the communicator in a state nobody knows (half a message sent,
one buffered that nobody will take), so after it the group carries no data
again in this graph. Each member keeps the same table of its groups::

    a.SEND2>b: comm.send raises ValueError          b: RECV2<a, blocked in comm.recv
      fault(): the value is ValueError + a note       .
               group failed: "in execution 2 on a"     .
               posted on the group's fault board       .
      retract(): Failed(2, error) ──side channel──►    .
      spread(): close the group's control (shm) ──►  watcher: reads the board: group failed;
                                                     comm.abort()
                                                     recv raises: cut short, so settle():
                                                     side Meta(2) Failed(2) -> the ValueError
    execution 3, SEND3>b: no comm call;              RECV3<a: no comm call; skip(): side
      skip(): Failed(3, "group failed") ─────────►   items up to Failed(3) (a bounded wait,
                                                     SETTLE_S), else its own error

    what raised                           this op's value              group
    anything, the group's control open    the error + a note (fault)   failed, then spread
    anything, the control closed          the board's error in its     failed (a peer's fault,
      (the watcher saw it)                execution, else Communica-   or teardown: the loop's
                                          torError "cut short"; a      next channel op ends it)
                                          RECV: a side Failed first
    ChannelClosedError, control open      -                            the loop ends (as before)
    ChannelLostError (a dead peer)        -                            the loop ends (as before)

The control channel is the one the driver closes at teardown (``communicators``):
one shared-memory channel per group on the driver's node, which any member may
close too. Beside it, the group's ``FaultBoard`` (shared memory, one slot per
member, each written by its member alone) holds what failed: the failing member
posts its record and error there, then closes the control, so every watcher
reads why, and a member whose op of the same execution was cut short gives the
original error too (a collective: whichever member's result the driver reads).
A failed SEND also writes ``Failed(seq)`` before the control closes, for its
receiver. A group with a member on another node has a control socket per member
and no board: ``spread`` closes this member's socket, and the driver's control
server closes every other member's with it (they were linked at compile), so every
watcher aborts its communicator within a round trip; the peers learn the fault's
record from the side channel's ``Failed`` items, else name it "aborted after a
fault on another member".
"""

from __future__ import annotations

import pickle
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from cgraph import _threads
from cgraph.channels.base import ChannelReader
from cgraph.channels.opener import open_endpoint
from cgraph.channels.segments import create_segment, open_segment, segment_name, unlink_quietly
from cgraph.channels.shm_channel import ShmHandle
from cgraph.channels.socket_endpoint import close_remotely
from cgraph.errors import ChannelClosedError, CommunicatorError, add_note
from cgraph.runtime.error_value import ErrorValue

if TYPE_CHECKING:
    import mmap

    from cgraph.comm.communicator import Communicator
    from cgraph.comm.kinds import GroupEndpoint

_T = TypeVar("_T")

NOTICE_S = 1.0
"""How long a ``ChannelClosedError`` waits for the watcher to see the control closed:
a peer's abort may close shared links (the CPU communicator) just before."""

SETTLE_S = 2.0
"""How long a receiver of a failed group waits for the writer's ``Failed`` item of a
value (it carries the upstream error, the original fault's in the faulting execution);
then it gives the group's error itself. The item comes at once unless the writer is
still computing, or sent the value before it saw the group fail (then none comes)."""


@dataclass(frozen=True, slots=True)
class GroupFailure:
    """Why a group failed, as every later op of it says (picklable: rides in ``Failed``)."""

    execution: int
    actor: str
    what: str  # "ValueError: ..."; "" when this member only saw the abort

    def describe(self, group: str) -> str:
        if self.what:
            return f"communicator group {group} failed in execution {self.execution} on actor {self.actor}: {self.what}"
        return (f"communicator group {group} was aborted in execution {self.execution} (seen on actor "
                f"{self.actor}) after a fault on another member")


class FaultBoard:
    """A group's fault board on the driver's node: ``n`` slots of ``SLOT`` bytes, slot r
    written only by rank r (a length word, written last, then its pickled fault)."""

    SLOT = 1 << 14

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    @classmethod
    def create(cls, tag: str, group: str, n: int) -> FaultBoard:
        board = cls(segment_name(tag, f"{group}.faults"), n)
        create_segment(board.name, n * cls.SLOT).close()  # zeros: nothing posted
        return board

    def handle(self, rank: int) -> BoardHandle:
        return BoardHandle(self.name, self.n, rank)

    def close(self) -> None:
        """Nothing waits on a board (``CommResources`` closes every resource)."""

    def unlink(self) -> list[str]:
        return [self.name] if unlink_quietly(self.name) else []


@dataclass(frozen=True, slots=True)
class BoardHandle:
    """One member's end of a ``FaultBoard`` (picklable)."""

    name: str
    n: int
    rank: int

    def post(self, failure: GroupFailure, error: ErrorValue) -> None:
        """Write this member's fault in its slot (before the control closes)."""
        size = FaultBoard.SLOT - 4
        data = pickle.dumps((failure, error))
        if len(data) > size:  # a huge error: its record alone, the text cut to fit
            data = pickle.dumps((GroupFailure(failure.execution, failure.actor, failure.what[:size // 2]), None))
        with _mapped(self.name) as mm:
            at = self.rank * FaultBoard.SLOT
            mm[at + 4:at + 4 + len(data)] = data
            mm[at:at + 4] = struct.pack("<I", len(data))  # last: a reader sees all or nothing

    def first(self) -> tuple[GroupFailure, ErrorValue | None] | None:
        """The earliest fault posted (by execution, then rank), or None."""
        posted = []
        with _mapped(self.name) as mm:
            for rank in range(self.n):
                at = rank * FaultBoard.SLOT
                (length,) = struct.unpack("<I", mm[at:at + 4])
                if length:
                    failure, error = pickle.loads(mm[at + 4:at + 4 + length])
                    posted.append((failure.execution, rank, failure, error))
        return min(posted, key=lambda p: p[:2])[2:] if posted else None


class _mapped:  # noqa: N801 - a context manager read as a phrase
    def __init__(self, name: str) -> None:
        self.mm = open_segment(name)

    def __enter__(self) -> mmap.mmap:
        return self.mm

    def __exit__(self, *exc: object) -> None:
        self.mm.close()


@dataclass(frozen=True, slots=True)
class Site:
    """One communicator op of an actor, as its errors name it."""

    group: str
    where: str  # "send of node n1 to b (rank 1)"
    method: str  # the producing method (for the error value)
    execution: int


class GroupFaults:
    """One actor loop's communicator groups: which failed and why; their watchers."""

    def __init__(self, label: str, execution: Callable[[], int]) -> None:
        self.label = label
        self.execution = execution  # the loop's current execution (for the watcher's record)
        self.failures: dict[str, GroupFailure] = {}
        self.origins: dict[str, ErrorValue] = {}  # the failing member's error, from the board
        self.aborted: dict[str, threading.Event] = {}
        self.groups: dict[str, tuple[GroupEndpoint, Communicator | None]] = {}  # name -> (endpoint, communicator once made)

    def watch(self, name: str, group: GroupEndpoint, on_close: Callable[[], None] | None = None) -> threading.Event | None:
        """Fail and abort the group when its control channel closes (a member's fault,
        teardown, a death): a thread waits on it, from before the communicator is made
        (``adopt``), so that a close also ends the wait for the group's making. Returns
        the event the close sets (None: the group has no control); ``on_close`` runs then."""
        self.groups[name] = (group, None)
        if group.control is None:
            return None
        event = self.aborted[name] = threading.Event()

        def wait() -> None:
            try:
                reader = cast(ChannelReader, open_endpoint(group.control))
                try:
                    reader.read()
                finally:
                    reader.detach()
            except ChannelClosedError:
                pass
            posted = quietly(group.board.first) if group.board is not None else None
            if posted is not None:
                self.learn(name, posted[0])
                if posted[1] is not None:
                    self.origins.setdefault(name, posted[1])
            self.failures.setdefault(name, GroupFailure(self.execution(), self.label, ""))
            event.set()  # before the abort: a call it fails finds the group aborted
            comm = self.groups[name][1]
            if comm is not None:
                quietly(comm.abort)
            if on_close is not None:
                on_close()

        _threads.start(wait, f"cgraph-abort-{group.name}")
        return event

    def adopt(self, name: str, comm: Communicator) -> None:
        """The group's communicator, made: the watcher aborts it when the control closes
        (at once, if it closed while the group was being made)."""
        group, _ = self.groups[name]
        self.groups[name] = (group, comm)
        event = self.aborted.get(name)
        if event is not None and event.is_set():
            quietly(comm.abort)

    def failed(self, name: str) -> GroupFailure | None:
        return self.failures.get(name)

    def fault(self, site: Site, exc: Exception) -> ErrorValue:
        """``exc``, raised by the op at ``site``, as the op's value; its group is failed
        from now on.

        Raises:
            ChannelLostError: ``exc`` is one and the group was not aborted (a dead peer: the
                loop ends, the monitor reports it).
            ChannelClosedError: ``exc`` is one and the group was not aborted (a link closed
                under it: teardown or a death; the loop ends as before).
        """
        event = self.aborted.get(site.group)
        closed = isinstance(exc, ChannelClosedError)  # ChannelLostError too
        if event is not None and event.wait(NOTICE_S if closed else 0):
            return self._cut_short(site, exc)  # the group's abort (a peer's fault) closed it
        if closed:
            raise exc
        group, comm = self.groups[site.group]
        assert comm is not None  # an op runs only on an adopted communicator
        failure = self.failures.setdefault(
            site.group, GroupFailure(site.execution, self.label, f"{type(exc).__name__}: {exc}"))
        add_note(exc, f"cgraph: communicator {type(comm).__name__} of group {site.group} raised in {site.where} "
                      f"on actor {self.label} (execution {site.execution}); the group carries nothing more in "
                      "this graph (its later ops fail at once): recompile the graph to use it again")
        value = ErrorValue.capture(exc, actor=self.label, method=site.method, execution_index=site.execution)
        if group.board is not None:  # before spread() closes the control: the watchers read it then
            quietly(lambda: group.board.post(failure, value))
        return value

    def _cut_short(self, site: Site, exc: Exception) -> ErrorValue:
        """The value of an op that the group's abort (another member's fault) cut short:
        in the execution of the fault, that fault's error; else a ``CommunicatorError``."""
        failure = self.failures.setdefault(site.group, GroupFailure(site.execution, self.label, ""))
        origin = self.origins.get(site.group)
        if origin is not None and failure.execution == site.execution:
            return origin  # as a collective's bad input: every member's result is that error
        error = CommunicatorError(f"{failure.describe(site.group)}: {site.where} on actor {self.label} was cut "
                                  f"short ({type(exc).__name__}: {exc}); recompile the graph to use the group again")
        return ErrorValue.capture(error, actor=self.label, method=site.method, execution_index=site.execution)

    def later(self, site: Site) -> ErrorValue:
        """The value of an op of a failed group, which calls no communicator."""
        failure = self.failures[site.group]
        error = CommunicatorError(f"{failure.describe(site.group)}; recompile the graph to use it "
                                  f"again ({site.where} on actor {self.label} did not run)")
        return ErrorValue.capture(error, actor=self.label, method=site.method, execution_index=site.execution)

    def learn(self, name: str, failure: GroupFailure | None) -> None:
        """A writer's record of the group's failure (from a ``Failed`` item): the group is
        failed here too (across nodes, the only news of it), and the record replaces one
        that knew no more than that the group was aborted."""
        if isinstance(failure, GroupFailure):
            known = self.failures.get(name)
            if known is None or (failure.what and not known.what):
                self.failures[name] = failure

    def spread(self, name: str) -> None:
        """Wake the group's other members after this member's fault: close the group's
        control, whose watchers abort their communicators. Shared memory: any member
        closes it. Sockets (a member on another node): this member's control, which the
        driver's control server closes with every other member's (``link_closing``)."""
        group, comm = self.groups[name]
        assert comm is not None  # an op that faulted ran on it
        if isinstance(group.control, ShmHandle):
            try:
                reader = open_endpoint(group.control)
            except ChannelClosedError:  # torn down already
                return
            reader.close()
            reader.detach()
            return
        if group.control is not None:
            close_remotely(group.control)
        quietly(comm.abort)


def quietly(fn: Callable[[], _T]) -> _T | None:
    """``fn()``, or None if it raised: closing or failing anyway (teardown, a board gone)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
