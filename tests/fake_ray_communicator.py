"""The part of a Ray ``Communicator`` (``ray.experimental.channel.communicator``) that a test's
fake does not vary: actors and ranks, streams, transport name. A fake subclasses ``RayFake``
and implements how tensors move (``send``, ``recv`` and the collectives it needs)."""

from __future__ import annotations

from typing import Any

import torch
from ray.experimental.channel.communicator import Communicator as RayBase
from ray.experimental.util.types import ReduceOp as RayReduceOp

COMBINE = {RayReduceOp.SUM: torch.add, RayReduceOp.MAX: torch.maximum}
"""The reductions the fakes support (cgraph's signature check uses MAX)."""


def reduce_all(op: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """``op`` over ``parts``, in rank order."""
    acc = parts[0].clone()
    for part in parts[1:]:
        acc = COMBINE[op](acc, part)
    return acc


class RayFake(RayBase):
    """Ranks are positions in ``actors`` (handles, or any stand-ins compared with ``key``)."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors, self.me = actors, None

    @staticmethod
    def key(actor: Any) -> Any:
        return getattr(actor, "_ray_actor_id", actor)

    def initialize(self, rank: int) -> None:
        self.me = rank

    def get_actor_handles(self) -> list[Any]:
        return self.actors

    def get_rank(self, actor: Any) -> int:
        return [self.key(a) for a in self.actors].index(self.key(actor))

    def get_self_rank(self) -> int | None:
        return self.me

    def get_world_size(self) -> int:
        return len(self.actors)

    @property
    def recv_stream(self) -> None:
        return None

    @property
    def send_stream(self) -> None:
        return None

    def allgather(self, send_buf: Any, recv_buf: Any) -> None:
        raise NotImplementedError

    def reducescatter(self, send_buf: Any, recv_buf: Any, op: Any = RayReduceOp.SUM) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        pass

    def get_transport_name(self) -> str:
        return "accelerator"  # it moves tensors itself (a "cpu" one would be host memory)

    @classmethod
    def generate_communicator_id(cls) -> str:
        return cls.__name__
