"""The front end: Ray's DAG API in, the Graph IR out.

``adapter`` is the only module that reads Ray's node objects; ``nodes`` holds
cgraph's authoring names (``InputNode``, ``MultiOutputNode``,
``TorchTensorType``, ``with_type_hint``); ``validate`` checks the IR and words
the errors. Importing this package installs the two Ray hooks described in
``nodes.install_ray_hooks`` (a compile dispatch for DAGs built on cgraph's
``InputNode``, and ``with_type_hint`` on Ray's nodes).
"""

from cgraph.dag.adapter import FrontEnd, describe, read_dag
from cgraph.dag.nodes import (
    CommunicatorTable,
    InputNode,
    MultiOutputNode,
    TorchTensorType,
    compile_with_ray_options,
    install_ray_hooks,
    with_type_hint,
)

install_ray_hooks()

__all__ = [
    "CommunicatorTable",
    "FrontEnd",
    "InputNode",
    "MultiOutputNode",
    "TorchTensorType",
    "compile_with_ray_options",
    "describe",
    "read_dag",
    "with_type_hint",
]
