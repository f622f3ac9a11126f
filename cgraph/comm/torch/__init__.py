"""torch.distributed process groups: "gloo" on CPUs, "nccl" on GPUs.

    process_group  the communicator of a compiled graph's edges and collective nodes
    backend        the "gloo" and "nccl" backends of the imperative API
    transport      cgraph's ``Transport`` over a process group (the algorithms on gloo and NCCL)

This package is named after the library it wraps: ``import torch`` inside it is
PyTorch (absolute imports), never this package.
"""
