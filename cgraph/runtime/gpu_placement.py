"""Which GPU each actor of a NCCL edge uses, decided from Ray's assignment, not CUDA's state.

At compile, the driver asks every member of a "nccl" group where Ray put it (its node
and the GPU ids Ray assigned, ``ray.get_gpu_ids()``) and picks the transport; Ray's
logical GPUs (``ray.init(num_gpus=...)`` on a machine without one) answer the same way,
so this planning runs in CI::

    members' (node, first GPU id)          transport
    all the same, two or more members      cuda_ipc  (NCCL refuses two ranks on one GPU)
    all different                          nccl
    some shared, some not                  refused: CompileError naming the actors that share
    a member without a GPU                 refused: CompileError naming it

In the actor, the communicator is opened on the *first GPU Ray assigned it*: its index
among the devices this process sees (``CUDA_VISIBLE_DEVICES``, which Ray sets), made
the current device (``bind_assigned_gpu``). A method that called ``torch.cuda.set_device``
to some other GPU does not move the communicator.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cgraph.errors import CompileError


def placement(_self: Any = None) -> tuple[str, tuple[str, ...]]:
    """In an actor: its node id and the GPU ids Ray assigned it (``__ray_call__`` target)."""
    import ray

    return ray.get_runtime_context().get_node_id(), tuple(str(g) for g in ray.get_gpu_ids())


def gpu_kind(members: Sequence[str], places: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    """"cuda_ipc" or "nccl" for a group whose members sit at ``places`` (see the module docstring).

    Raises:
        CompileError: a member has no GPU, or some members share a GPU and others do not.
    """
    without = [m for m, (_, ids) in zip(members, places, strict=True) if not ids]
    if without:
        raise CompileError(
            f"actor{'s' if len(without) > 1 else ''} {', '.join(without)} exchange tensors over "
            "NCCL but Ray assigned no GPU to them; create them with num_gpus (fractional on one "
            'GPU for CUDA IPC), or compile with default_communicator="cpu" for CPU actors'
        )
    devices = [(node, ids[0]) for node, ids in places]
    if len(devices) > 1 and len(set(devices)) == 1:
        return "cuda_ipc"
    if len(set(devices)) != len(devices):
        shared: dict[tuple[str, str], list[str]] = {}
        for member, device in zip(members, devices, strict=True):
            shared.setdefault(device, []).append(member)
        crowded = "; ".join(f"{', '.join(ms)} on GPU {gpu}" for (_, gpu), ms in shared.items() if len(ms) > 1)
        raise CompileError(
            f"actors {', '.join(members)} exchange tensors over NCCL, but some of them share a GPU "
            f"({crowded}) and others do not; NCCL needs one GPU per actor and CUDA IPC one GPU for "
            "all. Place them on distinct GPUs (num_gpus=1), or all on one GPU (fractional num_gpus)"
        )
    return "nccl"


def plan_gpu_kind(members: Sequence[str], handles: Mapping[str, Any]) -> str:
    """``gpu_kind`` of a group, asking each member actor where Ray placed it."""
    import ray

    places = ray.get([handles[m].__ray_call__.remote(placement) for m in members])
    return gpu_kind(members, places)


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
