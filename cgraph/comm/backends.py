"""The backends of the imperative API, one row per backend name.

A backend turns a ``Membership`` (what the group's store handed this rank)
into a ``GroupComm`` (``comm.group``): the object that runs the group's calls in
this process.

    backend  tensors           transport                      allreduce algorithms
    cpu      numpy (host)      shm links in a node, TCP between   cgraph's (ALGORITHMS; "auto")
    gloo     torch CPU         TCP, any nodes (ProcessGroupGloo)   cgraph's and gloo's own ("native"; "auto")
    nccl     torch CUDA        NCCL (ProcessGroupNCCL)        cgraph's and NCCL's own ("native"; "auto")

The API converts the caller's tensors (numpy, torch, cupy) to the kind in the
``tensor`` column, in place where it can, and copies back where it must.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cgraph.comm.group import GroupComm, Hooks
from cgraph.comm.torch.process_group import backend_available

if TYPE_CHECKING:
    from cgraph.comm.rendezvous import Membership


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend's row: whether it can run here, its tensor kind and its constructor."""

    name: str
    tensor: str  # "numpy" or "torch": what its GroupComm takes
    device: str  # "cpu" or "cuda": where torch tensors must live
    available: Callable[[], bool]
    connect: Callable[[Membership, Hooks], GroupComm]


def _cpu_connect(membership: Membership, hooks: Hooks) -> GroupComm:
    from cgraph.comm.cpu.backend import connect

    return connect(membership, hooks)


def _torch_connect(membership: Membership, hooks: Hooks) -> GroupComm:
    from cgraph.comm.torch.backend import connect

    return connect(membership, hooks)


def gloo_available() -> bool:
    """True when torch.distributed has the gloo backend."""
    return backend_available("gloo")


def nccl_available() -> bool:
    """True when torch.distributed has NCCL and this process sees a CUDA device."""
    return backend_available("nccl")


BACKENDS: dict[str, Backend] = {
    "cpu": Backend("cpu", "numpy", "cpu", lambda: True, _cpu_connect),
    "gloo": Backend("gloo", "torch", "cpu", gloo_available, _torch_connect),
    "nccl": Backend("nccl", "torch", "cuda", nccl_available, _torch_connect),
}
"""Every backend by name (a test checks each row)."""


def backend(name: str) -> Backend:
    """The row of ``name``.

    Raises:
        ValueError: an unknown backend name.
    """
    try:
        return BACKENDS[str(name).lower()]
    except KeyError:
        raise ValueError(
            f"unknown collective backend {name!r}; choose one of {sorted(BACKENDS)}"
        ) from None
