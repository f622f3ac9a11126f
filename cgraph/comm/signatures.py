"""Call signatures as small integer vectors, compared across ranks before a torch collective.

Gloo aborts the whole process when ranks pass tensors of different sizes, and
NCCL hangs; so before a torch collective the ranks ``agree``: one MAX allreduce
of a few integers, each rank's mark (a reason to stop, e.g. a bad input) and its
signature with its negation (a field's max equals minus the max of its negation
only where every rank has the same value). On a mismatch, the rare path, every
rank's signature is gathered to say which call each made, and every rank raises
``CollectiveMismatchError`` with the group still usable. The imperative API's
gloo/nccl backend and a compiled graph's collective nodes both agree this way;
send / recv compare a header and an answer instead::

    encode("allreduce", float32 tensor of shape (2, 3), SUM, -1)
        -> [1, 0, -1, 0, 2, 6, 2, 3, -1, -1, -1, -1]
           kind op root dtype ndim numel shape (up to MAX_DIMS, -1 padded)
    describe(...) -> "allreduce float32(2, 3) sum"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cgraph.comm.algorithms import ALGORITHMS
from cgraph.comm.types import ReduceOp

if TYPE_CHECKING:
    import torch

KINDS = ("none", "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "p2p", "barrier")
"""Call kinds by code."""
OPS = tuple(ReduceOp)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "bool", "complex64", "complex128")
"""dtype names by code (others encode as -2, "other")."""
ALLREDUCE_ALGORITHMS = tuple(sorted(ALGORITHMS))
"""cgraph's allreduce algorithms by code (an allreduce's root field; -1: the backend's own)."""
MAX_DIMS = 6
LENGTH = 6 + MAX_DIMS


def encode(kind: str, tensor: torch.Tensor | None = None, op: ReduceOp | None = None, root: int = -1) -> list[int]:
    """The signature of one call (``tensor`` None for a barrier)."""
    shape = tuple(tensor.shape) if tensor is not None else ()
    dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else ""
    numel = 1
    for d in shape:
        numel *= int(d)
    dims = [int(d) for d in shape[:MAX_DIMS]] + [-1] * (MAX_DIMS - min(len(shape), MAX_DIMS))
    return [KINDS.index(kind), OPS.index(op) if op is not None else -1, root,
            DTYPES.index(dtype) if dtype in DTYPES else -2, len(shape), numel, *dims]


def algorithm_code(name: str) -> int:
    """The code of one of cgraph's allreduce algorithms, for ``encode``'s root field."""
    return ALLREDUCE_ALGORITHMS.index(name)


def describe(header: Sequence[int]) -> str:
    """Readable text of a signature vector."""
    h = [int(x) for x in header]
    kind = KINDS[h[0]] if 0 <= h[0] < len(KINDS) else f"kind {h[0]}"
    if kind == "barrier":
        return "barrier"
    dtype = DTYPES[h[3]] if 0 <= h[3] < len(DTYPES) else "other dtype"
    ndim = h[4]
    shape = tuple(h[6 : 6 + min(ndim, MAX_DIMS)]) + (("...",) if ndim > MAX_DIMS else ())
    text = f"{kind} {dtype}{shape}"
    if h[1] >= 0:
        text += f" {OPS[h[1]].value}"
    if h[2] >= 0 and kind == "allreduce":
        text += f" {ALLREDUCE_ALGORITHMS[h[2]] if h[2] < len(ALLREDUCE_ALGORITHMS) else 'algorithm ?'}"
    elif h[2] >= 0:
        text += f" root {h[2]}"
    return text


def agree(mark: int, signature: Sequence[int], max_allreduce: Callable[[list[int]], list[int]]) -> tuple[int, bool]:
    """Every rank calls with its ``mark`` (0: nothing to stop for) and ``signature``; one
    MAX allreduce (``max_allreduce`` runs it on the group) gives every rank the same
    answer: the largest mark, and whether every rank's signature is the same."""
    sig = [int(x) for x in signature]
    agreed = max_allreduce([mark, *sig, *(-x for x in sig)])
    n = len(sig)
    return agreed[0], agreed[1:1 + n] == [-x for x in agreed[1 + n:]]
