"""One error hierarchy for cgraph.

Compile-time errors subclass ``ValueError`` (the user's DAG is a bad value);
runtime errors carry the actor, the method and the original traceback. Every
message says what went wrong, where (the node in text form), why, and how to fix
it.
"""

from __future__ import annotations

import builtins
import sys
from typing import TypeVar, cast


class CGraphError(Exception):
    """Base class of every error cgraph raises on purpose."""


# --------------------------------------------------------------------------- compile time
class CompileError(CGraphError, ValueError):
    """The DAG cannot be compiled as written."""


class DAGValidationError(CompileError):
    """The DAG breaks a rule of the front end (nested node, free function, ...)."""


class NestedNodeError(DAGValidationError):
    """A DAG node sits inside a list, tuple or dict argument."""


class FunctionNodeError(DAGValidationError):
    """A free function (``f.bind``) instead of an actor method."""


class UnknownMethodError(DAGValidationError):
    """The actor class has no method of the bound name."""


class EmptyDAGError(DAGValidationError):
    """The DAG has no actor method to run."""


class UnusedInputError(DAGValidationError):
    """The InputNode is never read by any node."""


class MultipleInputsError(DAGValidationError):
    """Nodes of one DAG come from two different InputNodes."""


class TransportError(CompileError):
    """An edge asks for a transport its actors cannot use."""


class GraphSyntaxError(CompileError):
    """Text given to a ``parse_*`` function is not in the expected form."""


class ScheduleInvariantError(CompileError):
    """A scheduler pass produced a schedule that breaks an invariant (a cgraph bug)."""


class DeadlockError(CompileError):
    """The schedule can never finish: the message prints the grid with ``<-- here``.

    Attributes:
        evidence: the wait-for cycle or the blocked frontier that proves it.
    """

    def __init__(self, message: str, evidence: object = None) -> None:
        super().__init__(message)
        self.evidence = evidence


# --------------------------------------------------------------------------- run time
class RuntimeGraphError(CGraphError, RuntimeError):
    """A compiled graph failed while running."""


class ChannelClosedError(RuntimeGraphError):
    """A channel was closed (teardown or a failure elsewhere) while in use."""


class ChannelLostError(ChannelClosedError):
    """The other end of a channel went away (its process exited, its node became
    unreachable, or the stream broke): names the channel and the peer. Not an
    actor's death: the actor that reports it is alive."""


class ChannelTimeoutError(RuntimeGraphError, builtins.TimeoutError):
    """A channel operation did not complete in time."""


class TimeoutError(RuntimeGraphError, builtins.TimeoutError):  # noqa: A001 - mirrors ray.exceptions
    """``get(timeout=...)`` or a submit timeout expired; the graph stays usable."""


class ActorDiedError(RuntimeGraphError):
    """An actor of the graph died; the graph is torn down.

    Attributes:
        actor: the dead actor's label in the graph.
    """

    def __init__(self, message: str, actor: str | None = None) -> None:
        super().__init__(message)
        self.actor = actor


class NodeDiedError(ActorDiedError):
    """A node of the graph was lost (its raylet gone or unreachable), and the graph's
    actors on it with it; the graph is torn down.

    Attributes:
        actor: the label of the dead actor that was reported first.
        node: the lost node's Ray node id.
    """

    def __init__(self, message: str, actor: str | None = None, node: str | None = None) -> None:
        super().__init__(message, actor)
        self.node = node


class CommunicatorError(RuntimeGraphError):
    """A communicator group of the graph failed: one of its calls raised in an earlier
    execution, so the group carries nothing more in this graph and each later op of it
    fails with this error (the rest of the graph keeps working); recompile the graph to
    use the group again. Also the error of a member woken by that fault's abort."""


class GraphTornDownError(RuntimeGraphError):
    """The compiled graph was torn down (explicitly, or after a fatal failure)."""


class ExecuteArgumentError(CGraphError, TypeError, ValueError):
    """``execute()`` was called with arguments the DAG cannot take; nothing was submitted.

    A ``TypeError`` (Python's error for a call with the wrong arguments) and a
    ``ValueError`` (what Ray Compiled Graphs raises for them)."""


class CapacityError(RuntimeGraphError):
    """More unread executions than ``max_inflight_executions`` allows."""


class RefConsumedError(RuntimeGraphError, ValueError):
    """A compiled ref's result was already read (a ``ValueError``, as in Ray)."""


class TaskError(RuntimeGraphError):
    """A user method raised; ``get()`` re-raises it and the graph stays usable.

    ``TaskError.wrap`` builds an instance that is also an instance of the
    original exception's type where Python allows it, so ``except ValueError``
    still works around ``compiled.execute(...).get()``. Attributes the user's
    exception had read through to it.

    Attributes:
        actor: the actor's label in the graph.
        method: the method that raised.
        execution_index: which execution (0 for the first).
        traceback_str: the traceback in the actor, as text.
        cause: the user's exception.
    """

    def __init__(
        self,
        message: str = "",
        *,
        actor: str = "",
        method: str = "",
        execution_index: int = -1,
        traceback_str: str = "",
        cause: BaseException | None = None,
    ) -> None:
        # Not super(): in a dual type another base may come next in the MRO, e.g.
        # TaskError(RuntimeError) puts Ray's RayTaskError, whose __init__ wants
        # more arguments, before RuntimeError. Every base is an exception whose
        # state is its args plus the attributes set here.
        BaseException.__init__(self, message)
        self.actor = actor
        self.method = method
        self.execution_index = execution_index
        self.traceback_str = traceback_str
        self.cause = cause

    def __str__(self) -> str:
        head = self.args[0] if self.args else ""
        return f"{head}\n{self.traceback_str}".rstrip()

    def __getattr__(self, name: str) -> object:
        """Attributes the user's exception had (``err.code``, ...) read through to it."""
        cause = self.__dict__.get("cause")
        if cause is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(cause, name)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (
            _rebuild_task_error,
            (
                self.args[0] if self.args else "",
                self.actor,
                self.method,
                self.execution_index,
                self.traceback_str,
                self.cause,
            ),
        )

    @classmethod
    def wrap(
        cls,
        cause: BaseException,
        *,
        actor: str,
        method: str,
        execution_index: int,
        traceback_str: str,
    ) -> TaskError:
        """A ``TaskError`` for ``cause``, also an instance of ``type(cause)`` where possible.

        Args:
            cause: the exception the user's method raised.
            actor: the actor's label in the graph.
            method: the method's name.
            execution_index: which execution raised.
            traceback_str: the traceback in the actor, as text.

        Returns:
            An instance of a subclass of both ``TaskError`` and ``type(cause)``
            (made once per type), or a plain ``TaskError`` when Python cannot
            combine the two classes' layouts.
        """
        message = (
            f"{type(cause).__name__} in {actor}.{method} "
            f"(execution {execution_index}): {cause}"
        )
        cause_type = type(cause)
        if cause_type is not cls and not issubclass(cause_type, TaskError):
            try:
                dual = _dual_type(cls, cause_type)
                err: TaskError = _blank(dual)
            except TypeError:
                pass  # layout conflict (e.g. OSError subclasses): a plain TaskError
            else:
                TaskError.__init__(
                    err,
                    message,
                    actor=actor,
                    method=method,
                    execution_index=execution_index,
                    traceback_str=traceback_str,
                    cause=cause,
                )
                if isinstance(cause, OSError):  # C-level fields: not reached by __getattr__
                    for field in ("errno", "strerror", "filename", "filename2"):
                        setattr(err, field, getattr(cause, field))
                return err
        return cls(
            message,
            actor=actor,
            method=method,
            execution_index=execution_index,
            traceback_str=traceback_str,
            cause=cause,
        )


_DUAL_TYPES: dict[tuple[type, type], type] = {}
_COMPAT: dict[type, tuple[type, ...]] = {}
_COMPAT_TYPES: dict[type, type] = {}


def register_compat(cls: type[CGraphError], *bases: type[BaseException]) -> None:
    """Make instances built by ``TaskError.wrap`` / ``with_compat`` also ``bases``.

    The runtime registers Ray's exception classes here (``RayTaskError`` for
    ``TaskError``, ``ray.exceptions.ActorDiedError`` for ``ActorDiedError``), so
    code written for Ray Compiled Graphs that catches those keeps working; this
    module itself stays free of Ray.
    """
    _COMPAT[cls] = bases
    _COMPAT_TYPES.pop(cls, None)


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, which Python 3.10 lacks: there the note goes to
    ``__notes__`` all the same (3.10's tracebacks do not print it)."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        vars(exc).setdefault("__notes__", []).append(note)


_E = TypeVar("_E", bound=CGraphError)


def with_compat(err: _E) -> _E:
    """``err`` as an instance of a subclass that also has the registered bases."""
    cls = type(err)
    bases = _COMPAT.get(cls)
    if not bases:
        return err
    try:
        dual = _COMPAT_TYPES.get(cls)
        if dual is None:
            attrs = {"__str__": cls.__str__, "__module__": cls.__module__}
            dual = type(cls.__name__, (cls, *bases), attrs)
            _COMPAT_TYPES[cls] = dual
        out: _E = _blank(dual)
    except TypeError:  # the bases' layouts cannot be combined: keep cgraph's own type
        return err
    out.args = err.args
    out.__dict__.update(err.__dict__)
    out.__dict__.setdefault("error_msg", str(err.args[0]) if err.args else "")
    return out


def _blank(cls: type[_E]) -> _E:
    """An uninitialised instance of an exception class with several bases.

    ``cls.__new__`` resolves to the first base that defines ``__new__`` (often
    ``RuntimeError``), which refuses when another base has a larger C layout
    (``OSError``: ``TimeoutError``, ``FileNotFoundError``, ...); that base's own
    ``__new__`` is the safe one, so try them in MRO order.

    Raises:
        TypeError: no base can build one (the layouts cannot be combined).
    """
    error: TypeError | None = None
    for base in cls.__mro__[1:]:
        if "__new__" in vars(base):
            try:
                return cast("type[object]", base).__new__(cls)  # mypy reads type.__new__ here
            except TypeError as exc:
                error = exc
    raise error or TypeError(f"cannot instantiate {cls.__name__}")


def _dual_type(cls: type[TaskError], cause_type: type[BaseException]) -> type[TaskError]:
    """``TaskError(ValueError)``: a subclass of both, made once per cause type."""
    key = (cls, cause_type)
    dual = _DUAL_TYPES.get(key)
    if dual is None:
        extra = tuple(b for b in _COMPAT.get(TaskError, ()) if not issubclass(cause_type, b))
        dual = type(f"TaskError({cause_type.__name__})", (cls, *extra, cause_type), {})
        _DUAL_TYPES[key] = dual
    return dual


def _rebuild_task_error(
    message: str,
    actor: str,
    method: str,
    execution_index: int,
    traceback_str: str,
    cause: BaseException | None,
) -> TaskError:
    if cause is not None:
        return TaskError.wrap(
            cause,
            actor=actor,
            method=method,
            execution_index=execution_index,
            traceback_str=traceback_str,
        )
    return TaskError(
        message,
        actor=actor,
        method=method,
        execution_index=execution_index,
        traceback_str=traceback_str,
    )


# --------------------------------------------------------------------------- collectives
class CollectiveError(CGraphError, RuntimeError):
    """A call of ``cgraph.collective`` failed; carries the group and this process's rank."""

    def __init__(self, message: str, group: str | None = None, rank: int | None = None) -> None:
        super().__init__(message)
        self.group = group
        self.rank = rank

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.args[0] if self.args else "", self.group, self.rank))


class CollectiveGroupError(CollectiveError):
    """An unknown, destroyed or aborted group, or a rank outside the group."""


class CollectiveMismatchError(CollectiveError, ValueError):
    """Ranks entered one collective with different dtypes, shapes, ops or calls."""


class CollectiveTimeoutError(CollectiveError, builtins.TimeoutError):
    """A peer of the group did not arrive in time; names the group, the rank and the peer."""
