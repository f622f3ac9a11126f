"""The one home of communicators: how tensors move between the ranks of a group.

    communicator   the ``Communicator`` interface (send/recv and collectives, in place)
    types          ``ReduceOp`` and its one table (numpy ufunc, torch function, torch.distributed op)
    transport      the point-to-point protocol the algorithms run over; an in-memory fabric
    algorithms     star, chain, tree, butterfly, ring, reduction server (numpy, any transport)
    teams          sub-teams of a transport (strided, 2-D, one per node)
    cost_model     alpha-beta-gamma predictions of the algorithms, and their fitting
    cpu_mesh       the CPU mesh: one shared-memory link per ordered rank pair, cgraph's algorithms
    framed_transport  the mesh with every message tagged by its call (the public collective API)
    process_group  one torch.distributed process-group communicator: "gloo" on CPUs, "nccl" on GPUs
    cuda_ipc       actors sharing one GPU: CUDA IPC handles over shared-memory links
    ray_store      the one rendezvous: a torch ``Store`` whose keys live in a Ray actor
    streams        the comm-stream seam (CUDA streams, inline, or ``stream_model`` for CI)

Layer 2: imports ``errors``, ``channels`` and ``ir`` below it, never the runtime,
the compiler or the user API above it (``cgraph.collective`` builds on this).
"""

from __future__ import annotations

from cgraph.comm.communicator import Communicator
from cgraph.comm.types import ReduceOp

__all__ = ["Communicator", "ReduceOp"]
