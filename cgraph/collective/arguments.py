"""Argument checks of the collective API, made before anything is sent.

Ranks that hold the same arguments all refuse alike, so nobody is left waiting
and the group stays usable. Each error names the call, the group and the fix.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, SupportsIndex, cast

from cgraph.collective import groups
from cgraph.comm import kinds
from cgraph.comm.tensor_views import kind_of, working
from cgraph.comm.tuning.autotune import TunedComm
from cgraph.comm.types import ReduceOp
from cgraph.errors import CollectiveGroupError

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    import torch

    from cgraph._boundary import UserValue

    Tensor: TypeAlias = torch.Tensor | np.ndarray
    """What the collective API takes: a torch tensor or a numpy array (or a cupy array: cupy
    is untyped, so no name of it is needed here)."""


def as_op(op: object) -> ReduceOp:
    """``op`` as a ReduceOp: a member, its name in any case, or Ray's ``ReduceOp``."""
    if isinstance(op, ReduceOp):
        return op
    try:
        return ReduceOp(str(getattr(op, "name", op)).lower())
    except ValueError:
        raise ValueError(f"unknown reduce op {op!r}; use one of {[o.name for o in ReduceOp]}") from None


_NUMERIC_KINDS = frozenset("biufc")
"""numpy dtype kinds a reduction takes: bool, signed and unsigned integers, floats, complex."""


def reduce_op(group: groups.Group, tensor: Tensor, op: object, call: str) -> ReduceOp:
    """``op`` as a ReduceOp, once ``tensor``'s dtype is known to reduce with it.

    Checked before anything is sent: ranks holding the same dtype all refuse
    alike, so nobody is left waiting and the group stays usable.
    """
    op = as_op(op)
    kind_of(tensor)  # a TypeError for anything but a tensor, before its dtype is asked
    dtype = tensor.dtype
    kind = getattr(dtype, "kind", None)  # numpy and cupy dtypes; torch's are all numeric
    if kind is not None and kind not in _NUMERIC_KINDS:
        raise ValueError(f"{call} on group {group.name!r}: cannot reduce dtype {dtype}; use a "
                         "bool, integer, floating or complex dtype")
    is_complex = kind == "c" or bool(getattr(dtype, "is_complex", False))
    if is_complex and (op in (ReduceOp.MIN, ReduceOp.MAX)
                       or (op is ReduceOp.PRODUCT and group.backend.name != "cpu")):
        raise ValueError(f"{call} on group {group.name!r}: {op.name} is not defined for complex "
                         f"dtype {dtype} on the {group.backend.name!r} backend; use SUM"
                         f"{' or PRODUCT' if op is not ReduceOp.PRODUCT else ''}, or reduce the "
                         "real and imaginary parts yourself")
    return op


def check_peer(group: groups.Group, peer: SupportsIndex, what: str, other: bool = False) -> int:
    """``peer`` as an int (numpy integers welcome) once it names another rank of ``group``."""
    try:
        rank = operator.index(peer)
    except TypeError:
        rank = -1
    if not 0 <= rank < group.world_size or (other and rank == group.rank):
        self_note = f", and not this rank ({group.rank})" if other else ""
        raise CollectiveGroupError(
            f"{what}={peer!r} is outside group {group.name!r}: use an integer rank in "
            f"0..{group.world_size - 1}{self_note}", group.name, group.rank)
    return rank


def check_parts(group: groups.Group, parts: Sequence[Tensor], tensor: Tensor, call: str, what: str) -> None:
    """``parts`` holds ``world_size`` tensors of ``tensor``'s shape and dtype (else ValueError)."""
    shape, dtype = tuple(tensor.shape), dtype_name(tensor)
    if len(parts) != group.world_size or any(tuple(t.shape) != shape for t in parts):
        raise ValueError(
            f"{call} on group {group.name!r}: {what} must hold world_size={group.world_size} "
            f"tensors shaped like the tensor {shape}, got "
            f"{[tuple(t.shape) for t in parts]}")
    if any(dtype_name(t) != dtype for t in parts):
        raise ValueError(
            f"{call} on group {group.name!r}: {what} must hold tensors of the tensor's dtype "
            f"{dtype}, got {[dtype_name(t) for t in parts]} (nothing is cast)")


def dtype_name(tensor: Tensor) -> str:
    """``float32`` for numpy, cupy and torch alike."""
    return str(tensor.dtype).removeprefix("torch.")


def tuned_comm(group_name: str, call: str) -> TunedComm:
    """The communicator of a group whose "auto" the cost model serves (every backend's
    group; a team or user object without ``tune``: ValueError)."""
    group = groups.lookup(group_name)
    if not hasattr(group.comm, "tune"):
        raise ValueError(f"{call}: group {group_name!r} ({group.backend.name!r}) has no cost "
                         "model to tune")
    return cast(TunedComm, group.comm)  # the backends' comms, the only ones with tune


@contextlib.contextmanager
def all_working(tensors: Sequence[Tensor], row: kinds.Kind, write: bool = True) -> Iterator[list[UserValue]]:
    """``working`` for every tensor of a list at once."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(working(t, row.tensor, row.device, write)) for t in tensors]
