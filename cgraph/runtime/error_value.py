"""An exception raised by a user's method, travelling through the graph as a value.

When a method raises, its outputs become an ``ErrorValue``; every downstream
COMPUTE that receives one skips the method and forwards the error, and the
driver's ``get()`` re-raises it as ``cgraph.TaskError`` (also an instance of the
original exception's type where Python allows). The graph keeps running: the
next execution is unaffected.
"""

from __future__ import annotations

import pickle
import traceback

from cgraph.errors import TaskError, with_compat


class ErrorValue:
    """A picklable carrier for a user exception and where it happened."""

    __slots__ = ("actor", "method", "execution_index", "traceback_str", "cause", "message")

    def __init__(
        self,
        *,
        actor: str,
        method: str,
        execution_index: int,
        traceback_str: str,
        cause: BaseException | None,
        message: str,
    ) -> None:
        self.actor = actor
        self.method = method
        self.execution_index = execution_index
        self.traceback_str = traceback_str
        self.cause = cause
        self.message = message

    @classmethod
    def capture(cls, exc: BaseException, *, actor: str, method: str, execution_index: int) -> ErrorValue:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        cause: BaseException | None = exc
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # an exception that cannot cross processes: keep its text
            cause = None
        return cls(
            actor=actor,
            method=method,
            execution_index=execution_index,
            traceback_str=tb,
            cause=cause,
            message=f"{type(exc).__name__}: {exc}",
        )

    def to_exception(self) -> TaskError:
        if self.cause is not None:
            return TaskError.wrap(
                self.cause,
                actor=self.actor,
                method=self.method,
                execution_index=self.execution_index,
                traceback_str=self.traceback_str,
            )
        return with_compat(TaskError(
            f"{self.message} in {self.actor}.{self.method} (execution {self.execution_index})",
            actor=self.actor,
            method=self.method,
            execution_index=self.execution_index,
            traceback_str=self.traceback_str,
        ))

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (
            _rebuild,
            (self.actor, self.method, self.execution_index, self.traceback_str, self.cause, self.message),
        )

    def __repr__(self) -> str:
        return f"ErrorValue({self.message!r} from {self.actor}.{self.method})"


def _rebuild(actor, method, execution_index, traceback_str, cause, message):  # type: ignore[no-untyped-def]
    return ErrorValue(
        actor=actor,
        method=method,
        execution_index=execution_index,
        traceback_str=traceback_str,
        cause=cause,
        message=message,
    )
