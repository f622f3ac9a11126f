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
        """How many positional arguments ``execute`` needs at least."""
        return max(self.positions, default=-1) + 1

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.whole and (len(args) != 1 or kwargs):
            raise ExecuteArgumentError(
                "this graph passes the InputNode itself to a method, so execute() takes "
                f"exactly one positional argument; got {len(args)} positional and "
                f"{len(kwargs)} keyword arguments. Use inp[i] / inp.key to read several."
            )
        need = self.need
        if len(args) != need and (self.positions or len(args) < need):
            raise ExecuteArgumentError(
                f"this graph reads inp[{need - 1}], so execute() takes {need} positional "
                f"argument(s); got {len(args)}"
            )
        if self.keys and not self.keys <= kwargs.keys():
            missing = sorted(self.keys - kwargs.keys())
            raise ExecuteArgumentError(
                f"this graph reads inp.{missing[0]}, so execute() needs the keyword "
                f"argument(s) {', '.join(missing)}; got {sorted(kwargs) or 'none'}"
            )
