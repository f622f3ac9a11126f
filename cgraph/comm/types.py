"""Reduce operations, and the one table of how each is applied: numpy's ufunc, torch's
function, torch.distributed's op (gloo and NCCL)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cgraph._boundary import TorchObject


class ReduceOp(enum.Enum):
    """How an allreduce combines the ranks' values, element by element."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


UFUNC: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}
"""The binary ufunc of each op; every op has a row (a test checks)."""

TORCH_FN: dict[ReduceOp, str] = {
    ReduceOp.SUM: "add",
    ReduceOp.PRODUCT: "mul",
    ReduceOp.MIN: "minimum",
    ReduceOp.MAX: "maximum",
}
"""The torch function combining two tensors for each op (every op has a row)."""


def dist_op(op: ReduceOp) -> TorchObject:
    """``torch.distributed.ReduceOp`` of ``op`` (gloo, NCCL): the member of the same name."""
    import torch.distributed as dist

    return getattr(dist.ReduceOp, op.name)


def combine(op: ReduceOp, left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
    """Write ``op(left, right)`` into ``out`` (which may alias either operand).

    The operand order is part of the contract: algorithms in which two ranks
    compute the same combination (butterfly) pass the lower rank's data as
    ``left`` on both, so the results agree bitwise even where an op is not
    bitwise commutative (``minimum(0.0, -0.0)``, NaN payloads).
    """
    UFUNC[op](left, right, out=out)
