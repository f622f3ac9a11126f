"""The runtime: the only layer that talks to Ray at execution time.

``CompiledGraph`` (driver side) and ``run_actor_loop`` (actor side); see
``launch.py`` for how a planned schedule becomes running loops.
"""

from __future__ import annotations

from cgraph.runtime.compiled_graph import CompiledGraph
from cgraph.runtime.options import CompileOptions
from cgraph.runtime.results import CompiledFuture, CompiledRef
from cgraph.runtime.waiting import wait

__all__ = ["CompileOptions", "CompiledFuture", "CompiledGraph", "CompiledRef", "wait"]
