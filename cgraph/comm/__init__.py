"""The one home of communicators: how tensors move between the ranks of a group.

    communicator   ``Communicator``: the one interface of a group's calls, for graphs and the API
    transport      the point-to-point protocol the algorithms run over (numpy arrays)
    types          ``ReduceOp`` and its one table (numpy ufunc, torch function, torch.distributed op)
    signatures     call signatures, compared across ranks before a collective
    algorithms     star, chain, tree, butterfly, ring, reduction server (numpy, any transport)
    teams          sub-teams of a transport (strided, 2-D, one per node)
    kinds          every kind of group, one row each: made and opened for a graph, API backend
    custom         a user's communicator object: checked, copied per group, initialized at compile
    gpu_placement  which GPU a member's communicator opens on, from Ray's assignment
    rendezvous     one small named store actor per collective group: membership, keys, a backend's hooks
    ray_store      the store's server and a torch ``Store`` whose keys live in that Ray actor
    tensor_views   working views of the caller's tensors in the kind a backend computes on
    cpu/           cgraph's own links: node meshes, sockets between nodes, the "cpu" backend
    torch/         torch.distributed process groups: "gloo" on CPUs, "nccl" on GPUs
    tuning/        the cost model, measuring it, and ``algorithm="auto"``
    cuda_ipc       actors sharing one GPU: CUDA IPC handles over shared-memory links
    ray_communicator  a user's subclass of Ray's ``Communicator``, run as cgraph's
    streams        the comm-stream seam (CUDA streams, inline, or ``stream_model`` for CI)

Layer 2: imports ``errors``, ``channels`` and ``ir`` below it, never the runtime,
the compiler or the user API above it (``cgraph.collective`` builds on this).
"""

from __future__ import annotations

from cgraph.comm.communicator import Communicator
from cgraph.comm.types import ReduceOp

__all__ = ["Communicator", "ReduceOp"]
