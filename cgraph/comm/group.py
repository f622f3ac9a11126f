"""One rank's side of an imperative collective group: what every backend returns.

``GroupComm`` is the interface the user API (``cgraph.collective``) calls, on the
backend's own tensor kind (numpy for "cpu", torch for "gloo" and "nccl");
``Hooks`` is what a backend may ask of the group layer. The backends live in
``comm.cpu.backend`` and ``comm.torch.backend``; their table is ``comm.backends``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cgraph.comm.teams import Team
from cgraph.comm.types import ReduceOp


class GroupComm(Protocol):
    """One rank's side of a group (or team): blocking, in-place calls on the backend's tensors."""

    rank: int
    world_size: int

    @property
    def nodes(self) -> tuple[Hashable, ...]: ...

    def allreduce(self, tensor: Any, op: ReduceOp, algorithm: str) -> None: ...
    def reduce(self, tensor: Any, dst: int, op: ReduceOp) -> None: ...
    def broadcast(self, tensor: Any, src: int) -> None: ...
    def allgather(self, outs: Sequence[Any], tensor: Any, algorithm: str = "auto") -> None: ...
    def reducescatter(self, out: Any, parts: Sequence[Any], op: ReduceOp,
                      algorithm: str = "auto") -> None: ...
    def send(self, tensor: Any, dst: int) -> None: ...
    def recv(self, tensor: Any, src: int) -> None: ...
    def barrier(self) -> None: ...
    def split(self, team: Team) -> GroupComm:
        """The comm of ``team`` (ranks of this comm), on this comm's transport."""
        ...
    def destroy(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a backend may ask of the group layer: this process's node, the abort channel."""

    group: str
    node: str  # this process's Ray node id
    report_abort: Callable[[str], None]  # tell the store why this rank gives up
    abort_reason: Callable[[], str | None]  # why another rank gave up, if it said
