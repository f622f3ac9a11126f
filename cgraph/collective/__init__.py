"""cgraph's collective library: allreduce and friends over point-to-point transports.

The algorithm core lives in ``types`` (reduce ops), ``transport`` (the
point-to-point protocol and an in-memory implementation), ``algorithms``
(one module per algorithm, selected by name through ``ALGORITHMS``),
``cost_model`` (alpha-beta-gamma predictions and fitting) and ``teams``
(sub-teams of a transport, as in NVSHMEM). The public API is re-exported later.
"""
