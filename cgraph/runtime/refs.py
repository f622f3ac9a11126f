"""Refs returned by ``CompiledGraph.execute``: read once with ``get()`` or ``ray.get``.

``CompiledRef`` subclasses Ray's ``CompiledDAGRef`` so that ``ray.get(ref)`` and
``ray.get([ref, ...])`` dispatch to ``ref.get()`` exactly as they do for Ray's own
compiled refs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from ray.experimental.compiled_dag_ref import CompiledDAGFuture, CompiledDAGRef

from cgraph.errors import CapacityError, RefConsumedError, TimeoutError


class Results(Protocol):
    """What a ref reads its result from: the compiled graph (``CompiledGraph``)."""

    def get_id(self) -> str: ...

    def _get_result(self, index: int, timeout: float | None, output: int | None = None) -> Any: ...

    def _discard_result(self, index: int, output: int | None = None) -> None: ...


class _RayText:
    """Ray's text for a compiled ref or future (``CompiledDAGRef(<graph id>,
    execution_index=i, channel_index=k)``: ``k`` the output of a MultiOutputNode, None for
    a graph's whole result) and Ray's refusals to copy or pickle one."""

    _ray_name = ""

    def _fields(self) -> tuple[Any, int, int | None]:
        raise NotImplementedError

    def __str__(self) -> str:
        graph, index, output = self._fields()
        return f"{self._ray_name}({graph.get_id()}, execution_index={index}, channel_index={output})"

    __repr__ = __str__

    def __copy__(self) -> Any:
        raise ValueError(f"{self._ray_name} cannot be copied.")

    def __deepcopy__(self, memo: Any) -> Any:
        raise ValueError(f"{self._ray_name} cannot be deep copied.")

    def __reduce__(self) -> Any:
        raise ValueError(f"{self._ray_name} cannot be pickled. (cgraph: nor passed to another task "
                         "or actor; read it in the process that executed the graph.)")


class CompiledRef(_RayText, CompiledDAGRef):
    """The result of one execution. ``get()`` may be called once."""

    _ray_name = "CompiledDAGRef"

    def __init__(  # noqa: D107
        self, graph: Results, execution_index: int, output: int | None = None
    ) -> None:
        # Ray's __init__ expects its own CompiledDAG; set the fields we use directly.
        self._graph = graph
        self._execution_index = execution_index
        self._output = output  # which output of a MultiOutputNode; None: the whole result
        self._consumed = False

    @property
    def execution_index(self) -> int:
        """The index of the execution this ref belongs to (0 for the first ``execute``)."""
        return self._execution_index

    def get(self, timeout: float | None = None) -> Any:
        """Wait for and return this execution's result (a list for MultiOutputNode).

        Raises:
            cgraph.TaskError: a method in the graph raised (original type preserved).
            cgraph.TimeoutError: ``timeout`` expired (``None``: the graph's get_timeout;
                negative: no limit); the ref can be read again later.
            cgraph.CapacityError: reading it would buffer more than
                ``max_buffered_results`` earlier results; it can be read again later.
            cgraph.ActorDiedError: an actor of the graph died.
            cgraph.RefConsumedError: this ref was already read.
        """
        if self._consumed:
            raise RefConsumedError(
                "ray.get() can only be called once on a CompiledDAGRef, and it was already "
                f"called. (cgraph: the result of execution {self._execution_index} was already "
                "read; keep the value the first get() returned.)"
            )
        try:
            value = self._graph._get_result(self._execution_index, timeout, self._output)
        except (TimeoutError, CapacityError):
            raise  # still unread: get() may be called again
        except BaseException:
            self._consumed = True  # the error was this ref's result
            raise
        self._consumed = True
        return value

    def _fields(self) -> tuple[Any, int, int | None]:
        return self._graph, self._execution_index, self._output

    def _drop(self) -> None:
        """Give up this result unread (its slot is freed as if the ref were deleted)."""
        if not self._consumed:
            self._consumed = True
            self._graph._discard_result(self._execution_index, self._output)

    def __del__(self) -> None:
        graph = getattr(self, "_graph", None)
        if graph is not None and not self._consumed:
            graph._discard_result(self._execution_index, self._output)


class CompiledRefList(list):  # type: ignore[type-arg]
    """The refs of one execution of a MultiOutputNode graph, one per output.

    A plain list to Ray (``ray.get(refs)``, ``a, b = refs``, ``refs[1].get()``),
    as Ray's Compiled Graphs return; ``get()`` reads every output in order.
    """

    def get(self, timeout: float | None = None) -> list[Any]:
        """Every output's value, in order. An output's error is raised and the
        outputs after it are dropped (the execution was read as a whole); a
        timeout or a CapacityError leaves the unread ones readable."""
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        values = []
        for i, ref in enumerate(self):
            try:
                values.append(
                    ref.get(None if deadline is None else max(0.0, deadline - time.monotonic()))
                )
            except (TimeoutError, CapacityError):
                raise  # this one and the rest stay readable
            except BaseException:
                for rest in self[i + 1 :]:
                    rest._drop()
                raise
        return values


class CompiledFuture(_RayText, CompiledDAGFuture):
    """An awaitable result, from ``await compiled.execute_async(...)``; awaited once.

    Subclasses Ray's ``CompiledDAGFuture`` (``isinstance`` checks hold); the result
    is read by a worker thread, so the event loop never blocks.
    """

    _ray_name = "CompiledDAGFuture"

    def __init__(self, ref: CompiledRef) -> None:  # noqa: D107 - Ray's __init__ wants its own DAG
        self._ref = ref
        self._awaited = False

    def _fields(self) -> tuple[Any, int, int | None]:
        return self._ref._fields()

    def __await__(self) -> Any:
        if self._awaited:
            raise RefConsumedError(
                "CompiledDAGFuture can only be awaited upon once, and it has already been "
                f"awaited upon. (cgraph: execution {self._ref.execution_index}.)")
        self._awaited = True
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self._ref.get).__await__()

    def __del__(self) -> None:
        pass  # the ref it holds gives its result up when it goes (CompiledRef.__del__)


class CompiledFutureList(list):  # type: ignore[type-arg]
    """One future per output of a MultiOutputNode; awaiting the list gives every value."""

    def __await__(self) -> Any:
        return asyncio.gather(*self).__await__()
