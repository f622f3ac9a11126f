"""How a compiled graph reads ``execute``'s arguments, checked where execute is called."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from cgraph.errors import ExecuteArgumentError


@dataclass(frozen=True)
class InputUsage:
    """How the DAG reads ``execute``'s arguments, to check them at the call site."""

    whole: bool  # the InputNode itself is an argument somewhere
    positions: frozenset[int]
    keys: frozenset[str]

    @functools.cached_property
    def need(self) -> int:
        """How many positional arguments ``execute`` takes (as Ray counts them)."""
        return 1 if self.whole else max(self.positions, default=-1) + 1

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``ExecuteArgumentError`` (a ``ValueError``, with Ray's sentence first) when
        ``execute``'s arguments do not fit how the DAG reads them."""
        need = self.need
        if len(args) != need:
            raise ExecuteArgumentError(f"{_RAY} {need} positional args, got {len(args)}: {self._why()}")
        if self.whole and kwargs:
            raise ExecuteArgumentError(
                f"{_RAY} {need} positional args and no keyword arguments, got "
                f"{', '.join(sorted(kwargs))}: {self._why()}")
        for key in sorted(self.keys):
            if key not in kwargs:
                raise ExecuteArgumentError(
                    f"{_RAY} kwarg `{key}`: this graph reads inp.{key}; got keyword arguments "
                    f"{sorted(kwargs) or 'none'}")

    def _why(self) -> str:
        if self.whole:
            return ("this graph passes the InputNode itself to a method, so execute() takes exactly "
                    "one positional argument (use inp[i] / inp.key to read several)")
        if self.positions:
            return f"this graph reads inp[{self.need - 1}]"
        return "this graph reads no positional argument" + (
            f" (only inp.{sorted(self.keys)[0]} and other keywords)" if self.keys else "")


_RAY = "dag.execute() or dag.execute_async() must be called with"
"""Ray's sentence for execute() arguments that do not fit the DAG (users search for it)."""
