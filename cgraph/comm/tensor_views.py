"""Working views of the caller's tensors in the kind a backend computes on, written back after.

The API takes torch tensors, numpy arrays and cupy arrays and works in place.
A backend computes on numpy arrays ("cpu") or torch tensors on a device
("gloo": CPU, "nccl": CUDA). ``working(t, kind, device, write)`` yields a
view that shares ``t``'s memory whenever it can, and otherwise a contiguous
copy that is copied back into ``t`` on a clean exit (``write=True``)::

    caller's tensor            numpy working view            torch working view (cpu)
    numpy, contiguous          itself                        torch.from_numpy (shared)
    numpy, strided             copy, written back            copy, written back
    torch CPU, contiguous      .numpy() (shared)             itself
    torch bfloat16 / CUDA      float32 / host copy           .to(device) copy
    cupy                       .get() copy, .set() back      torch.as_tensor (cuda: shared)

A read-only numpy array (``ray.get`` returns those) cannot be written in place:
the error says to pass a copy.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

from cgraph._boundary import UserValue

if TYPE_CHECKING:
    import torch

SOURCE = "cgraph_source_dtype"
"""Key of a working numpy view's dtype metadata naming the caller's dtype where numpy has
none (torch.bfloat16 works as float32): ranks holding bfloat16 and float32 differ in
``dtype_name`` and so in their calls' tags."""

Converted = tuple[UserValue, Callable[[UserValue], None] | None]
"""A working view and how to write it back (None: it shares the caller's memory)."""


def kind_of(tensor: object) -> str:
    """ "numpy", "torch" or "cupy".

    Raises:
        TypeError: anything else.
    """
    if isinstance(tensor, np.ndarray):
        return "numpy"
    module = type(tensor).__module__.split(".")[0]
    if module in ("torch", "cupy") and hasattr(tensor, "shape"):
        return module
    raise TypeError(
        f"collectives take torch tensors, numpy arrays or cupy arrays, got "
        f"{type(tensor).__name__}; wrap the value, e.g. np.asarray(x)"
    )


@contextlib.contextmanager
def working(tensor: UserValue, target: str, device: str = "cpu", write: bool = True) -> Iterator[UserValue]:
    """A view of ``tensor`` as ``target`` ("numpy" or "torch" on ``device``); see the module doc."""
    source = kind_of(tensor)
    if write and source == "numpy" and not tensor.flags.writeable:
        raise ValueError(
            "the collective writes into this numpy array, but it is read-only (arrays from "
            "ray.get are): pass arr.copy()"
        )
    view, back = CONVERT[(source, target)](tensor, device)
    yield view
    if write and back is not None:
        back(view)


def _numpy_from_numpy(arr: np.ndarray, device: str) -> Converted:
    if arr.flags.c_contiguous:
        return arr, None
    return np.ascontiguousarray(arr), functools.partial(np.copyto, arr)


def _numpy_from_torch(t: torch.Tensor, device: str) -> Converted:
    import torch

    direct = t.device.type == "cpu" and t.is_contiguous() and t.dtype in _numpy_dtypes()
    if direct:
        return t.detach().numpy(), None
    if t.dtype in _numpy_dtypes():
        work = t.detach().to("cpu").contiguous().numpy()
    else:  # computed in float32; the dtype remembers the caller's, which the call's tag names
        work = t.detach().to("cpu", torch.float32).contiguous().numpy()
        work = work.view(np.dtype(work.dtype, metadata={SOURCE: str(t.dtype)}))
    return work, functools.partial(_copy_into_torch, t)


def _numpy_from_cupy(arr: UserValue, device: str) -> Converted:
    import cupy

    def back(work: np.ndarray) -> None:
        arr[...] = cupy.asarray(work)

    return cupy.asnumpy(arr), back


def _torch_from_torch(t: torch.Tensor, device: str) -> Converted:
    if t.device.type == device and t.is_contiguous():
        return t.detach(), None
    return t.detach().to(device).contiguous(), functools.partial(_copy_into_torch, t)


def _torch_from_numpy(arr: np.ndarray, device: str) -> Converted:
    import torch

    work = torch.from_numpy(np.ascontiguousarray(arr) if arr.flags.writeable else arr.copy())
    shared = device == "cpu" and arr.flags.c_contiguous and arr.flags.writeable
    if shared:
        return work, None
    return work.to(device), lambda w: np.copyto(arr, w.cpu().numpy().reshape(arr.shape))


def _torch_from_cupy(arr: UserValue, device: str) -> Converted:
    import torch

    if device == "cuda" and arr.flags.c_contiguous:
        return torch.as_tensor(arr, device="cuda"), None
    import cupy

    work = torch.from_numpy(cupy.asnumpy(arr)).to(device)

    def back(w: torch.Tensor) -> None:
        arr[...] = cupy.asarray(w.cpu().numpy())

    return work, back


CONVERT: dict[tuple[str, str], Callable[[UserValue, str], Converted]] = {
    ("numpy", "numpy"): _numpy_from_numpy,
    ("torch", "numpy"): _numpy_from_torch,
    ("cupy", "numpy"): _numpy_from_cupy,
    ("torch", "torch"): _torch_from_torch,
    ("numpy", "torch"): _torch_from_numpy,
    ("cupy", "torch"): _torch_from_cupy,
}
"""How each (caller's kind, backend's kind) pair is viewed (a test checks every pair)."""


def _copy_into_torch(t: torch.Tensor, work: np.ndarray | torch.Tensor) -> None:
    import torch

    source = torch.from_numpy(work) if isinstance(work, np.ndarray) else work
    with torch.no_grad():
        t.copy_(source.reshape(t.shape))


@functools.cache
def _numpy_dtypes() -> frozenset[torch.dtype]:
    """torch dtypes numpy holds (and reduces) without a conversion."""
    import torch

    return frozenset({
        torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
        torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    })


def dtype_name(arr: np.ndarray) -> str:
    """The caller's dtype of a working view: numpy's, or the torch dtype it stands for."""
    metadata: Mapping[str, str] = arr.dtype.metadata or {}
    return metadata.get(SOURCE, str(arr.dtype))
