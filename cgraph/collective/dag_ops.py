"""Collectives as DAG nodes: ``allreduce.bind([x, y, ...])`` and friends.

    from cgraph.collective import ReduceOp, allreduce

    with InputNode() as inp:
        grads = [w.backward.bind(inp) for w in workers]           # one tensor per actor
        summed = allreduce.bind(grads, op=ReduceOp.SUM)           # one result per actor
        dag = MultiOutputNode([w.step.bind(g) for w, g in zip(workers, summed)])

Each member's COLLECTIVE op joins that actor's schedule, in bind order, and
runs on a communicator of the members: NCCL when every member has a GPU,
else ``compile(..., default_communicator=...)`` if given, else the CPU
communicator (actors on one host). Results: ``allreduce`` the reduced tensor,
``allgather`` the members' tensors concatenated along dim 0 (stacked if
0-d), ``reducescatter`` member i's slice of dim 0 of the reduced tensor.

The objects are callable too: ``allreduce(tensor, group_name=...)`` is the
imperative call of ``cgraph.collective.api`` inside an actor.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cgraph.comm.algorithms import ALGORITHMS
from cgraph.comm.communicator import as_reduce_op
from cgraph.comm.types import ReduceOp
from cgraph.errors import DAGValidationError

if TYPE_CHECKING:
    from ray.dag import DAGNode
    from ray.experimental.channel.communicator import Communicator as RayCommunicator

    from cgraph.comm.communicator import Communicator
    from cgraph.dag.collective_node import CollectiveOutput

AVG = "avg"
"""Ray's ``ReduceOp.AVG`` as a collective node's op: the sum over the members, divided by their count."""
AUTO = "auto"
"""``algorithm="auto"``: the communicator's own choice (ring on the CPU communicator)."""


def _error(what: str, where: str, why: str, fix: str) -> DAGValidationError:
    from cgraph.dag.validate import error_message

    return DAGValidationError(error_message(what, where, why, fix))


class _Collective:
    """A collective usable in a DAG (``.bind``) and inside actors (called)."""

    name = ""

    def __call__(self, *args: object, **kwargs: object) -> object:
        """The imperative collective of ``cgraph.collective.api`` (inside an actor)."""
        return getattr(importlib.import_module("cgraph.collective.api"), self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"cgraph.collective.{self.name}"

    def _bind(self, nodes: Sequence[DAGNode], options: Mapping[str, object],
              transport: str | Communicator | RayCommunicator | None = None) -> list[CollectiveOutput]:
        from cgraph.dag import TorchTensorType, with_type_hint
        from cgraph.dag.adapter_collective import bind_collective

        comm = self._transport(transport)
        outputs = bind_collective(self.name, nodes, options)
        if comm is not None:  # this collective's own communicator (a group of its own)
            with_type_hint(outputs[0].collective, TorchTensorType(transport=comm))
        return outputs

    def _op(self, op: ReduceOp | str) -> str:
        if str(getattr(op, "name", op)).lower() == AVG:  # Ray's ReduceOp.AVG: a SUM, then / members
            return AVG
        try:
            return as_reduce_op(op).value
        except ValueError:
            raise _error(
                f"{self.name}.bind: unknown reduce op {op!r}", f"{self.name}.bind(..., op={op!r})",
                "a reduction combines the members' tensors element by element with one of "
                f"{', '.join(o.name for o in ReduceOp)}",
                f"pass op=cgraph.collective.ReduceOp.SUM (or one of {[o.value for o in ReduceOp]}, or \"avg\")",
            ) from None

    def _transport(self, transport: object) -> Communicator | RayCommunicator | None:
        """Ray's ``transport=``: None, "nccl" or "accelerator" (NCCL where every member has a
        GPU, as in Ray; on CPU actors the compile's communicator), or a communicator object
        (``cgraph.Communicator``, or a subclass of Ray's ``Communicator``), returned: this
        collective then runs on it. Another string is refused."""
        if transport is None or transport in ("nccl", "accelerator"):
            return None
        from ray.experimental.channel.communicator import Communicator as RayCommunicator

        from cgraph.comm.communicator import Communicator

        if isinstance(transport, (Communicator, RayCommunicator)):
            return transport
        raise _error(
            f"{self.name}.bind: transport={transport!r} is not taken per collective",
            f"{self.name}.bind(..., transport={transport!r})",
            "a collective runs on NCCL where every member has a GPU, else on the compile's "
            "default_communicator, or on a communicator object given here",
            f"drop transport= and compile with default_communicator={transport!r}, or pass a "
            "communicator object",
        )


class AllReduce(_Collective):
    """``allreduce(tensor, group_name, op, algorithm)`` inside an actor (``api.allreduce``);
    ``allreduce.bind(nodes, op=..., algorithm=...)`` in a DAG (``bind``)."""

    name = "allreduce"

    def bind(self, nodes: Sequence[DAGNode], *, op: ReduceOp | str = ReduceOp.SUM, algorithm: str = AUTO,
             transport: str | Communicator | RayCommunicator | None = None) -> list[CollectiveOutput]:
        """Every member gets ``op`` over all members' tensors (same shape and dtype on each).

        Args:
            nodes: one DAG node per member actor, each an actor method's result
                holding a torch tensor.
            op: a ``ReduceOp`` (or its name: "sum", "product", "min", "max"), or Ray's
                ``ReduceOp.AVG`` / "avg" (the sum divided by the member count; floating dtypes).
            algorithm: "auto" (the communicator's choice) or one of
                ``cgraph.comm.algorithms.ALGORITHMS`` ("ring", "tree", ...),
                which only the CPU communicator can run.
            transport: Ray's argument: None, "nccl" or a communicator object (``_transport``).

        Returns:
            One node per member, in the order of ``nodes``: that member's result,
            usable as an argument of later ``actor.method.bind(...)`` calls.

        Raises:
            DAGValidationError: an empty list, a member that is no actor method's
                result, two members on one actor, an unknown op or algorithm.
        """
        if algorithm != AUTO and algorithm not in ALGORITHMS:
            close = difflib.get_close_matches(str(algorithm), list(ALGORITHMS), n=2)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise _error(
                f"allreduce.bind: unknown algorithm {algorithm!r}", f"allreduce.bind(..., algorithm={algorithm!r})",
                f"the algorithms are {AUTO!r} and {', '.join(map(repr, ALGORITHMS))}",
                f"{hint}pass one of them (\"auto\" lets the communicator choose)",
            )
        return self._bind(nodes, {"op": self._op(op), "algorithm": algorithm}, transport)


class AllGather(_Collective):
    """``allgather(tensor_list, tensor, group_name)`` inside an actor (``api.allgather``);
    ``allgather.bind(nodes)`` in a DAG (``bind``)."""

    name = "allgather"

    def bind(self, nodes: Sequence[DAGNode], *,
             transport: str | Communicator | RayCommunicator | None = None) -> list[CollectiveOutput]:
        """Every member gets all members' tensors concatenated along dim 0, in member order.

        Args:
            nodes: one DAG node per member actor, each an actor method's result
                holding a torch tensor (same shape and dtype on each; 0-d are stacked).

        Returns:
            One node per member, in the order of ``nodes``.

        Raises:
            DAGValidationError: an empty list, a member that is no actor method's
                result, or two members on one actor.
        """
        return self._bind(nodes, {}, transport)


class ReduceScatter(_Collective):
    """``reducescatter(tensor, tensor_list, group_name, op)`` inside an actor
    (``api.reducescatter``); ``reducescatter.bind(nodes, op=...)`` in a DAG (``bind``)."""

    name = "reducescatter"

    def bind(self, nodes: Sequence[DAGNode], *, op: ReduceOp | str = ReduceOp.SUM,
             transport: str | Communicator | RayCommunicator | None = None) -> list[CollectiveOutput]:
        """Member i gets slice i (along dim 0, in equal parts) of ``op`` over all members' tensors.

        Args:
            nodes: one DAG node per member actor, each an actor method's result
                holding a torch tensor whose dim 0 is a multiple of the member count.
            op: a ``ReduceOp`` (or its name).

        Returns:
            One node per member, in the order of ``nodes``.

        Raises:
            DAGValidationError: an empty list, a member that is no actor method's
                result, two members on one actor, or an unknown op.
        """
        return self._bind(nodes, {"op": self._op(op)}, transport)


allreduce = AllReduce()
allgather = AllGather()
reducescatter = ReduceScatter()
