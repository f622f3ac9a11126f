"""Compile options, with Ray's defaults where Ray has one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompileOptions:
    overlap_gpu_communication: bool = False
    max_inflight_executions: int = 10
    max_buffered_results: int = 1000
    buffer_size_bytes: int = 1 << 20
    submit_timeout: float | None = 10.0
    get_timeout: float | None = None
    enable_asyncio: bool = False
    default_communicator: Any = None
    cpu_affinity: Any = None  # None | "colocate" | set of CPU ids (see runtime/affinity.py)
    max_value_bytes: int = 16 << 30  # the largest value a cross-node channel carries
    tls: bool | None = None  # TLS on every socket; None: CGRAPH_TLS / RAY_USE_TLS decide

    def __post_init__(self) -> None:
        for name in ("submit_timeout", "get_timeout"):  # Ray's -1 (any negative): no limit
            value = getattr(self, name)
            if value is not None and value < 0:
                object.__setattr__(self, name, None)
        if self.max_buffered_results < 1:
            raise ValueError(f"max_buffered_results must be >= 1, got {self.max_buffered_results}")
        if self.max_inflight_executions < 1:
            raise ValueError(
                f"max_inflight_executions must be >= 1, got {self.max_inflight_executions}"
            )
        if self.max_value_bytes < 1:
            raise ValueError(f"max_value_bytes must be >= 1, got {self.max_value_bytes}")
        if self.buffer_size_bytes < 1:
            raise ValueError(f"buffer_size_bytes must be >= 1, got {self.buffer_size_bytes}")
