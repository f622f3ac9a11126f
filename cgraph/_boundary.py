"""The names of what cgraph cannot type: every ``Any`` in the package is one of these.

Each alias is ``Any`` on purpose and says which boundary it stands for, so that a
reader (and ``tests/unit/test_layers.py``) tells a boundary from a lazy annotation.
Anything of cgraph's own has its real type; torch tensors are ``torch.Tensor``
(imported under ``TYPE_CHECKING``).
"""

from __future__ import annotations

from typing import Any, TypeAlias

ActorHandle: TypeAlias = Any
"""A Ray actor handle: Ray makes its methods (``handle.method.remote``) at run time."""

RayObject: TypeAlias = Any
"""Another object of Ray's that its annotations do not type: an ``ObjectRef``, a DAG node
of ``ray.dag``, a placement group, a runtime context."""

TorchObject: TypeAlias = Any
"""A torch object its stubs do not type: a process group and its ``Work`` and options, a
``Store``, a CUDA stream or event."""

UserValue: TypeAlias = Any
"""A value of the user's program that cgraph carries without looking inside: an input of
``execute``, a method's argument or result, what a communicator object of the user's is."""
