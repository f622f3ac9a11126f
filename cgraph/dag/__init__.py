"""The front end: Ray's DAG API in, the Graph IR out.

``adapter`` is the only module that reads Ray's node objects; ``nodes`` holds
the type hints (``TorchTensorType``, ``with_type_hint``); ``validate`` checks
the IR and words the errors. cgraph's ``InputNode`` and ``MultiOutputNode``
(whose ``experimental_compile`` calls the compiler) are in ``cgraph.compat``.
"""

from __future__ import annotations

from cgraph.dag.adapter import FrontEnd, read_dag
from cgraph.dag.describe import describe
from cgraph.dag.nodes import CommunicatorTable, TorchTensorType, with_type_hint

__all__ = [
    "CommunicatorTable",
    "FrontEnd",
    "TorchTensorType",
    "describe",
    "read_dag",
    "with_type_hint",
]
