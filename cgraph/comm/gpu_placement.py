"""Which GPU each actor of a NCCL edge uses, decided from Ray's assignment, not CUDA's state.

At compile, the driver asks every actor once where Ray put it (``placement``: its node
and the GPU ids Ray assigned, ``ray.get_gpu_ids()``); the planner picks each group's
kind from that (``scheduler.groups.gpu_kind``: "cuda_ipc" when all share one GPU,
"nccl" when each has its own). Ray's logical GPUs (``ray.init(num_gpus=...)`` on a
machine without one) answer the same way, so this planning runs in CI.

In the actor, the communicator is opened on the *first GPU Ray assigned it*: its index
among the devices this process sees (``CUDA_VISIBLE_DEVICES``, which Ray sets), made
the current device (``bind_assigned_gpu``). A method that called ``torch.cuda.set_device``
to some other GPU does not move the communicator.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def placement(_self: object = None) -> tuple[str, tuple[str, ...]]:
    """In an actor: its node id and the GPU ids Ray assigned it (``__ray_call__`` target)."""
    import ray

    return ray.get_runtime_context().get_node_id(), tuple(str(g) for g in ray.get_gpu_ids())


def device_index(gpu_ids: Sequence[str | int], visible: str | None) -> int:
    """The CUDA device index, in this process, of the first GPU in ``gpu_ids``.

    Args:
        gpu_ids: ``ray.get_gpu_ids()`` of this process.
        visible: ``CUDA_VISIBLE_DEVICES`` (None: unset, every GPU visible in order).

    Raises:
        RuntimeError: Ray assigned no GPU, or the one it assigned is not visible here.
    """
    if not gpu_ids:
        raise RuntimeError(
            "this actor has a GPU communicator but Ray assigned it no GPU; create it with num_gpus"
        )
    first = str(gpu_ids[0])
    if visible is None:
        return int(first)
    order = [v.strip() for v in visible.split(",") if v.strip()]
    if first not in order:
        raise RuntimeError(
            f"Ray assigned GPU {first} to this actor but CUDA_VISIBLE_DEVICES={visible!r} hides it; "
            "leave CUDA_VISIBLE_DEVICES to Ray in actors of a compiled graph"
        )
    return order.index(first)


def bind_assigned_gpu() -> int:
    """In an actor, before a GPU communicator opens: make Ray's first assigned GPU the
    current CUDA device; returns its index (-1 without CUDA: the communicator says why).
    (CUDA: ``torch.cuda.set_device``.)"""
    import ray
    import torch

    if not torch.cuda.is_available():
        return -1
    index = device_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    torch.cuda.set_device(index)  # CUDA
    return index
