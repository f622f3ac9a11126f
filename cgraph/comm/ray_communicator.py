"""A Ray Compiled Graphs ``Communicator`` (a user's subclass of Ray's) run as cgraph's.

Ray's interface (``ray.experimental.channel.communicator.Communicator``) and cgraph's
(``cgraph.comm.Communicator``) move the same tensors between the same actors, but say
it differently:

    Ray's                                        cgraph's (this adapter calls Ray's)
    ranks its actors itself: get_rank(actor)     ranks a group's members in graph order
    initialize(rank)                             initialize(rank, world_size, group_name)
    recv(shape, dtype, peer, allocator) -> t     recv(buf, src): fills the caller's buffer
    allreduce(send_buf, recv_buf, op)            allreduce(t, op): in place
    allgather(send_buf, recv_buf):               allgather(outs, t): outs[r] = rank r's t
      recv_buf = every rank's send_buf along dim 0, in Ray's rank order
    reducescatter(send_buf, recv_buf, op):       reducescatter(out, parts, op)
      send_buf = the chunks along dim 0, in Ray's rank order

``RayCommunicator`` holds the user's object and, for each of cgraph's ranks, the
rank Ray's object gives that member (``ranks``, read on the driver with
``get_rank(handle)``), and translates every call. cgraph ships one pickled copy to
each member and calls ``initialize`` there at compile, as Ray does. Ray's
``CPUCommunicator`` moves nothing point to point (Ray sends those edges through
host memory): the front end reads a hint with a "cpu" communicator as host memory
("shm"), so only communicators that really send reach this adapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from cgraph.comm.communicator import Communicator, as_reduce_op, only_auto, split_chunks
from cgraph.comm.types import ReduceOp

if TYPE_CHECKING:
    import torch
    from ray.experimental.channel.communicator import Communicator as RayBase
    from ray.experimental.util.types import ReduceOp as RayReduceOp

    from cgraph._boundary import ActorHandle


def _ray_op(op: ReduceOp) -> RayReduceOp:
    from ray.experimental.util.types import ReduceOp as RayReduceOp

    return cast(RayReduceOp, getattr(RayReduceOp, op.name))


class RayCommunicator(Communicator):
    """cgraph's interface over a Ray ``Communicator`` (see the module docstring).

    Args:
        ray_comm: the user's Ray communicator object.
        ranks: for each of cgraph's ranks in this group, the member's rank in ``ray_comm``.
    """

    def __init__(self, ray_comm: RayBase, ranks: tuple[int, ...]) -> None:
        self.ray_comm = ray_comm
        self.ranks = ranks
        self._rank = -1

    def __repr__(self) -> str:
        return f"RayCommunicator({type(self.ray_comm).__name__}, ranks={list(self.ranks)})"

    def initialize(self, rank: int, world_size: int, group_name: str) -> None:
        self._rank = rank
        self.ray_comm.initialize(self.ranks[rank])

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def device(self) -> torch.device:
        """The GPU this actor was given when there is one (Ray's communicators move tensors on
        the actor's default device), else the CPU."""
        import torch

        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.ray_comm.send(tensor, self.ranks[dst])
        self.synchronize()  # Ray's send may return once queued: cgraph's callers expect it done

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        got = self.ray_comm.recv(tuple(tensor.shape), tensor.dtype, self.ranks[src],  # type: ignore[arg-type]  # Ray's shape is Tuple[int]
                                 lambda shape, dtype: tensor)
        if got is not None and got is not tensor:
            tensor.copy_(got)

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        only_auto(self, "allreduce", algorithm)
        out = tensor.new_empty(tensor.shape)
        self.ray_comm.allreduce(tensor, out, _ray_op(as_reduce_op(op)))
        tensor.copy_(out)

    def allgather(self, out: list[torch.Tensor], tensor: torch.Tensor, algorithm: str = "auto") -> None:
        only_auto(self, "allgather", algorithm)
        flat = tensor.reshape(1, -1) if tensor.dim() == 0 else tensor
        gathered = flat.new_empty((flat.shape[0] * self.world_size, *flat.shape[1:]))
        self.ray_comm.allgather(flat, gathered)
        chunks = gathered.reshape(self.world_size, -1)
        for rank, part in enumerate(out):
            part.copy_(chunks[self.ranks[rank]].reshape(part.shape))

    def reducescatter(self, out: torch.Tensor, tensors: torch.Tensor | list[torch.Tensor],
                      op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
        import torch

        only_auto(self, "reducescatter", algorithm)
        parts = split_chunks(out, tensors, self.world_size)
        by_ray_rank = sorted(range(self.world_size), key=lambda rank: self.ranks[rank])
        send = torch.cat([parts[rank].reshape(1, -1) for rank in by_ray_rank])
        got = out.new_empty((1, out.numel()))
        self.ray_comm.reducescatter(send, got, _ray_op(as_reduce_op(op)))
        out.copy_(got.reshape(out.shape))

    def synchronize(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # unannotated in torch
            torch.cuda.synchronize()

    def destroy(self) -> None:
        self.ray_comm.destroy()


def ranks_of(ray_comm: RayBase, handles: list[ActorHandle], labels: list[str]) -> tuple[int, ...]:
    """Each member's rank in ``ray_comm`` (driver side), checking that the communicator joins
    exactly these actors: Ray initializes a communicator in all of its actors, cgraph in the
    graph's members that use it.

    Raises:
        ValueError: a member is not one of its actors, or it has actors no member is.
    """
    try:
        ranks = tuple(int(ray_comm.get_rank(h)) for h in handles)
    except Exception as exc:  # noqa: BLE001 - Ray's own raise ValueError; a user's may raise anything
        raise ValueError(f"actors {', '.join(labels)} use communicator {type(ray_comm).__name__}, "
                         f"which does not rank all of them: {type(exc).__name__}: {exc}") from exc
    size = len(ray_comm.get_actor_handles())
    if sorted(ranks) != list(range(size)):
        raise ValueError(f"communicator {type(ray_comm).__name__} joins {size} actors, and the graph's "
                         f"actors that use it ({', '.join(labels)}) have its ranks {list(ranks)}: cgraph "
                         "initializes it in those actors only, so they must be all of its actors")
    return ranks
