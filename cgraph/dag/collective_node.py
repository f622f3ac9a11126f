"""DAG nodes of a cgraph collective: one node for the operation, one per member result.

    with InputNode() as inp:
        x, y = a.grad.bind(inp), b.grad.bind(inp)            CollectiveNode allreduce(x, y)
        rx, ry = allreduce.bind([x, y])              ──►       ├── CollectiveOutput [0]  (on a)
        dag = MultiOutputNode([a.step.bind(rx),                └── CollectiveOutput [1]  (on b)
                               b.step.bind(ry)])

Both are Ray ``DAGNode`` subclasses, so Ray's ``bind`` takes a
``CollectiveOutput`` as an argument like any other node. The collective's
arguments are its member inputs; its options (reduce op, algorithm), each
member's actor and bind index sit in ``other_args_to_resolve``. A member
that is a ``ClassNode`` (``Worker.bind()``) is therefore upstream of the
collective, which puts the collective in that actor's creation-ordered list of
calls, as Ray's own calls are. ``cgraph.dag.adapter_collective`` builds and
reads them; only cgraph compiles a DAG that holds them (``_cgraph_input``).
"""

from __future__ import annotations

from typing import NoReturn

from ray.dag import DAGNode

from cgraph._boundary import ActorHandle, RayObject

METHOD_KEY = "cgraph_collective"  # the collective's name: allreduce | allgather | reducescatter
OPTIONS_KEY = "cgraph_options"  # {"op": "sum", "algorithm": "auto"}, as applicable
PARENTS_KEY = "cgraph_members"  # each member's ActorHandle or ClassNode, in rank order
BIND_INDEX_KEY = "cgraph_bind_indices"  # each member's bind index on its handle (None: ClassNode)
INDEX_KEY = "cgraph_member"  # a CollectiveOutput's member index


class _CompiledOnly(DAGNode):
    _cgraph_input = True  # read by adapter.uses_cgraph_input: experimental_compile goes to cgraph

    def _execute_impl(self, *args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"{self}: cgraph collective nodes run only in a compiled graph; "
            "use cgraph.compile(dag) (or dag.experimental_compile()), not dag.execute()"
        )


class CollectiveNode(_CompiledOnly):
    """A collective over one input node per member actor (its arguments, in rank order)."""

    def __init__(self, inputs: tuple[RayObject, ...], other_args_to_resolve: dict[str, object]) -> None:
        super().__init__(tuple(inputs), {}, {}, other_args_to_resolve)

    @property
    def method(self) -> str:
        return str(self.get_other_args_to_resolve()[METHOD_KEY])

    @property
    def options(self) -> dict[str, object]:
        return dict(self.get_other_args_to_resolve()[OPTIONS_KEY])

    @property
    def parents(self) -> tuple[ActorHandle, ...]:
        return tuple(self.get_other_args_to_resolve()[PARENTS_KEY])

    @property
    def bind_indices(self) -> tuple[int | None, ...]:
        return tuple(self.get_other_args_to_resolve()[BIND_INDEX_KEY])

    def _copy_impl(self, new_args: list[DAGNode], new_kwargs: dict[str, object], new_options: dict[str, object],
                   new_other: dict[str, object]) -> CollectiveNode:
        return CollectiveNode(tuple(new_args), new_other)

    def __str__(self) -> str:
        return f"CollectiveNode({self.method}, {len(self._bound_args)} members)"


class CollectiveOutput(_CompiledOnly):
    """Member ``index``'s result of a ``CollectiveNode``; the value lives on that member's actor."""

    def __init__(self, collective: CollectiveNode, other_args_to_resolve: dict[str, object]) -> None:
        super().__init__((collective,), {}, {}, other_args_to_resolve)

    @property
    def collective(self) -> CollectiveNode:
        return self._bound_args[0]  # type: ignore[no-any-return]

    @property
    def index(self) -> int:
        return int(self.get_other_args_to_resolve()[INDEX_KEY])

    def _copy_impl(self, new_args: list[CollectiveNode], new_kwargs: dict[str, object],
                   new_options: dict[str, object], new_other: dict[str, object]) -> CollectiveOutput:
        return CollectiveOutput(new_args[0], new_other)

    def __str__(self) -> str:
        return f"{self.collective}[{self.index}]"
