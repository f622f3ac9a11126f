"""The imperative collective API, in the shape of ``ray.util.collective``.

    import cgraph.collective as col

    @ray.remote(num_cpus=0)
    class Worker:
        def setup(self, world_size, rank):
            col.init_collective_group(world_size, rank, backend="cpu", group_name="g")
        def step(self, grad):                     # numpy array, torch or cupy tensor
            col.allreduce(grad, group_name="g")   # in place, blocking, every rank calls
            return grad

    # or, from the driver, no setup call in the actors:
    col.declare_collective_group(workers, world_size=4, ranks=[0, 1, 2, 3], backend="cpu",
                                 group_name="g")

Every call blocks until this rank's part is done and must be made by every
member of the group, in the same order, with tensors of the same dtype and
shape (``send`` / ``recv`` by the pair). Backends: "cpu" (shared memory between
the actors of one node, cgraph's algorithms, ``algorithm="auto"`` fitted per
group), "gloo" (torch.distributed over TCP, any nodes), "nccl" (CUDA tensors).
Teams: ``split_strided`` / ``split_2d`` make sub-groups without a new
rendezvous, and every group has the teams ``"<group>:world"`` and
``"<group>:node"`` (the ranks on this rank's Ray node). The end of this module
shows the cost model behind ``algorithm="auto"``: ``tune``, ``choose_algorithm``,
``explain``, ``get_cost_params`` and ``set_cost_params``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from cgraph import _spans
from cgraph.collective import groups
from cgraph.collective.arguments import all_working, check_parts, check_peer, reduce_op, tuned_comm
from cgraph.collective.groups import DEFAULT_TIMEOUT_S
from cgraph.comm import kinds, teams
from cgraph.comm.tensor_views import working
from cgraph.comm.tuning import autotune, cost_model
from cgraph.comm.tuning.cost_model import CostParams
from cgraph.comm.types import ReduceOp

if TYPE_CHECKING:
    from cgraph._boundary import ActorHandle
    from cgraph.collective.arguments import Tensor


# --------------------------------------------------------------------------- groups
def init_collective_group(world_size: int, rank: int, backend: str = "cpu",
                          group_name: str = "default", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join group ``group_name`` as ``rank`` of ``world_size`` (call inside each member actor).

    Args:
        world_size: the number of ranks.
        rank: this actor's rank, ``0 .. world_size-1``.
        backend: "cpu" (shared memory, every rank on one node), "gloo" (any
            nodes) or "nccl" (CUDA tensors).
        group_name: the group's name, unique among this process's groups.
        timeout_s: how long a call waits for a peer before ``CollectiveTimeoutError``.

    Raises:
        CollectiveGroupError: a bad rank, the group already initialized here, the rank
            taken, or values that differ from the other members'.
        ValueError: an unknown backend.
    """
    groups.init(world_size, rank, backend, group_name, timeout_s)


def declare_collective_group(actors: Sequence[ActorHandle], world_size: int, ranks: Sequence[int],
                             backend: str = "cpu", group_name: str = "default",
                             timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Declare a group from the driver: actor ``actors[i]`` gets rank ``ranks[i]``.

    The actors need no set-up call: the first collective call in each finds its
    membership. The "cpu" backend needs the actors on the driver's node.

    Args:
        actors: the member actors' handles.
        world_size: the number of ranks.
        ranks: the rank of each actor, in the order of ``actors``.
        backend: "cpu", "gloo" or "nccl", as for ``init_collective_group``.
        group_name: the group's name.
        timeout_s: how long a call waits for a peer before ``CollectiveTimeoutError``.

    Raises:
        CollectiveGroupError: the group exists, or actors and ranks do not match.
        ValueError: an unknown backend.
    """
    groups.declare(actors, world_size, ranks, backend, group_name, timeout_s)


create_collective_group = declare_collective_group
"""Ray's name (``ray.util.collective.create_collective_group``) for ``declare_collective_group``."""


def is_group_initialized(group_name: str = "default") -> bool:
    """True if this process is a member of ``group_name`` (declared membership counts).

    Args:
        group_name: the group's name.

    Returns:
        Whether this process is a member; never waits for the other ranks.
    """
    return groups.peek(group_name, fresh=True) is not None


def get_rank(group_name: str = "default") -> int:
    """This process's rank in ``group_name``.

    Args:
        group_name: the group's name.

    Returns:
        The rank, or -1 if this process is not a member.
    """
    found = groups.peek(group_name)
    return -1 if found is None else found[0]


def get_collective_group_size(group_name: str = "default") -> int:
    """The number of ranks of ``group_name``.

    Args:
        group_name: the group's name.

    Returns:
        The group's size, or -1 if this process is not a member.
    """
    found = groups.peek(group_name)
    return -1 if found is None else found[1]


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave ``group_name`` (and its teams); the last member out frees its links and store.

    Called on the driver (not a member), it tears the whole group down at once: its
    store and the links it made are freed, and each member drops the group at its next
    ``init_collective_group`` or ``is_group_initialized`` of that name (which then
    answer as for a stranger; each asks Ray once, so ``get_rank`` and the calls do not).
    A destroyed name can be used again for a new group.

    Args:
        group_name: the group's name.
    """
    groups.destroy(group_name)


def nccl_available() -> bool:
    """Whether the "nccl" backend can run in this process.

    Returns:
        True when torch.distributed has NCCL and a CUDA device is visible here.
    """
    return kinds.nccl_available()


def gloo_available() -> bool:
    """Whether the "gloo" backend can run in this process.

    Returns:
        True when torch.distributed has gloo.
    """
    return kinds.gloo_available()


# --------------------------------------------------------------------------- collectives
F = TypeVar("F", bound=Callable[..., object])


def _recorded(fn: F) -> F:
    """``fn`` as one event on the timeline of a recorded graph whose method calls it
    (track "collective": its group, algorithm and bytes); otherwise just ``fn``."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: object, **kwargs: object) -> object:
        add = _spans.sink()
        if add is None:
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        start = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        given = bound.arguments
        options = ", ".join(f"{name}={given[name]!r}" for name in ("group_name", "algorithm") if name in given)
        add(f"{fn.__name__}({options})", start, time.perf_counter_ns(), getattr(given.get("tensor"), "nbytes", None))
        return out

    return call  # type: ignore[return-value]


@_recorded
def allreduce(tensor: Tensor, group_name: str = "default", op: ReduceOp | str = ReduceOp.SUM,
              algorithm: str = "auto") -> None:
    """Reduce ``tensor`` over the group, in place on every rank.

    Args:
        tensor: a torch tensor, numpy or cupy array; same dtype and shape on every rank.
        group_name: the group's name.
        op: ReduceOp.SUM, PRODUCT, MIN or MAX (or its name).
        algorithm: "auto" (the cost model fitted to this group chooses; on "gloo"
            and "nccl" the backend's own allreduce, named "native", is a candidate), "native", or a name of
            ``cgraph.comm.algorithms.ALGORITHMS``: cgraph's algorithm, on every
            backend ("gloo"/"nccl": over the process group's send/recv).

    Raises:
        CollectiveGroupError: an unknown, destroyed or aborted group.
        CollectiveMismatchError: ranks called with different dtypes, shapes or ops.
        CollectiveTimeoutError: a peer did not arrive within the group's timeout.
        ValueError: a dtype or op that does not reduce (nothing was sent).
    """
    group = groups.lookup(group_name)
    op = reduce_op(group, tensor, op, "allreduce")
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.allreduce(work, op, algorithm)


@_recorded
def reduce(tensor: Tensor, dst_rank: int = 0, group_name: str = "default",
           op: ReduceOp | str = ReduceOp.SUM) -> None:
    """Reduce ``tensor`` over the group into ``dst_rank``'s tensor (others keep theirs).

    Args:
        tensor: this rank's input; on ``dst_rank`` also the output.
        dst_rank: the rank that receives the result.
        group_name: the group's name.
        op: ReduceOp.SUM, PRODUCT, MIN or MAX (or its name).

    Raises:
        CollectiveGroupError: an unknown group or a ``dst_rank`` outside it.
        CollectiveMismatchError, CollectiveTimeoutError: as for ``allreduce``.
        ValueError: a dtype or op that does not reduce.
    """
    group = groups.lookup(group_name)
    dst_rank = check_peer(group, dst_rank, "dst_rank")
    op = reduce_op(group, tensor, op, "reduce")
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.reduce(work, dst_rank, op)


@_recorded
def broadcast(tensor: Tensor, src_rank: int = 0, group_name: str = "default") -> None:
    """Copy ``src_rank``'s ``tensor`` into every rank's ``tensor``.

    Args:
        tensor: the data on ``src_rank``, the buffer to fill elsewhere.
        src_rank: the rank whose tensor is sent.
        group_name: the group's name.

    Raises:
        CollectiveGroupError: an unknown group or a ``src_rank`` outside it.
        CollectiveMismatchError, CollectiveTimeoutError: as for ``allreduce``.
    """
    group = groups.lookup(group_name)
    src_rank = check_peer(group, src_rank, "src_rank")
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.broadcast(work, src_rank)


@_recorded
def allgather(tensor_list: list[Tensor], tensor: Tensor, group_name: str = "default",
              algorithm: str = "auto") -> None:
    """Fill ``tensor_list[r]`` with rank r's ``tensor`` on every rank.

    Args:
        tensor_list: ``world_size`` tensors shaped and typed like ``tensor``.
        tensor: this rank's contribution.
        group_name: the group's name.
        algorithm: "auto" (on "cpu": "hierarchical" where the group spans nodes, else
            "ring"; on "gloo"/"nccl": the backend's own, also named "native"), "ring" or
            "hierarchical" (rings inside nodes, an exchange between them:
            ``cgraph.comm.algorithms.ALLGATHER_ALGORITHMS``), on every backend.

    Raises:
        CollectiveGroupError, CollectiveMismatchError, CollectiveTimeoutError: as
            for ``allreduce``.
        ValueError: ``tensor_list`` of the wrong length, shape or dtype, or an unknown
            algorithm.
    """
    group = groups.lookup(group_name)
    check_parts(group, tensor_list, tensor, "allgather", "tensor_list")
    row = group.backend
    with working(tensor, row.tensor, row.device, write=False) as work:
        with all_working(tensor_list, row) as outs:
            group.comm.allgather(outs, work, algorithm)


@_recorded
def reducescatter(tensor: Tensor, tensor_list: list[Tensor], group_name: str = "default",
                  op: ReduceOp | str = ReduceOp.SUM, algorithm: str = "auto") -> None:
    """``tensor`` = the reduction over ranks of their ``tensor_list[rank]``.

    Args:
        tensor: this rank's output.
        tensor_list: ``world_size`` tensors shaped and typed like ``tensor``.
        group_name: the group's name.
        op: ReduceOp.SUM, PRODUCT, MIN or MAX (or its name).
        algorithm: as for ``allgather`` ("auto", "ring", "hierarchical", and "native" on
            "gloo"/"nccl": ``cgraph.comm.algorithms.REDUCESCATTER_ALGORITHMS``).

    Raises:
        CollectiveGroupError, CollectiveMismatchError, CollectiveTimeoutError: as
            for ``allreduce``.
        ValueError: ``tensor_list`` of the wrong length, shape or dtype, a dtype or
            op that does not reduce, or an unknown algorithm.
    """
    group = groups.lookup(group_name)
    check_parts(group, tensor_list, tensor, "reducescatter", "tensor_list")
    op = reduce_op(group, tensor, op, "reducescatter")
    row = group.backend
    with working(tensor, row.tensor, row.device) as out:
        with all_working(tensor_list, row, write=False) as parts:
            group.comm.reducescatter(out, parts, op, algorithm)


@_recorded
def send(tensor: Tensor, dst_rank: int, group_name: str = "default") -> None:
    """Send ``tensor`` to ``dst_rank``, which must ``recv`` a tensor of the same dtype and shape.

    Args:
        tensor: the data.
        dst_rank: another rank of the group.
        group_name: the group's name.

    Raises:
        CollectiveGroupError: an unknown group, or ``dst_rank`` outside it or this rank.
        CollectiveMismatchError, CollectiveTimeoutError: as for ``allreduce``.
    """
    group = groups.lookup(group_name)
    dst_rank = check_peer(group, dst_rank, "dst_rank", other=True)
    with working(tensor, group.backend.tensor, group.backend.device, write=False) as work:
        group.comm.send(work, dst_rank)


@_recorded
def recv(tensor: Tensor, src_rank: int, group_name: str = "default") -> None:
    """Fill ``tensor`` with the next tensor ``src_rank`` sends to this rank.

    Args:
        tensor: the buffer, of the sent tensor's dtype and shape.
        src_rank: another rank of the group.
        group_name: the group's name.

    Raises:
        CollectiveGroupError: an unknown group, or ``src_rank`` outside it or this rank.
        CollectiveMismatchError, CollectiveTimeoutError: as for ``allreduce``.
    """
    group = groups.lookup(group_name)
    src_rank = check_peer(group, src_rank, "src_rank", other=True)
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.recv(work, src_rank)


@_recorded
def barrier(group_name: str = "default") -> None:
    """Return once every rank of the group has called ``barrier``.

    Args:
        group_name: the group's name.

    Raises:
        CollectiveGroupError, CollectiveTimeoutError: as for ``allreduce``.
    """
    groups.lookup(group_name).comm.barrier()


# --------------------------------------------------------------------------- teams
def split_strided(group_name: str, start: int, stride: int, size: int, new_group_name: str) -> int:
    """Make the team of ranks ``start, start+stride, ...`` (``size`` of them) group ``new_group_name``.

    No rendezvous through Ray: the team runs over the parent's links ("cpu") or
    store ("gloo"). Call it on the members (others get -1 and nothing).

    Args:
        group_name: the parent group.
        start: the first member's rank in the parent.
        stride: the distance between members' parent ranks.
        size: the number of members.
        new_group_name: the team's name, used like a group's.

    Returns:
        This process's rank in the team, or -1 if it is not a member.

    Raises:
        CollectiveGroupError: an unknown parent group.
        ValueError: a team that does not fit in the parent.
    """
    parent = groups.lookup(group_name)
    team = teams.split_strided(teams.world_team(parent.world_size), start, stride, size)
    return groups.add_team(parent, team, new_group_name)


def split_2d(group_name: str, xrange: int, x_group_name: str, y_group_name: str) -> tuple[int, int]:
    """Lay the group's ranks out ``xrange`` wide; join this rank's row and column teams.

    Args:
        group_name: the parent group.
        xrange: the row length (the last row may be shorter).
        x_group_name: the name of this rank's row team.
        y_group_name: the name of this rank's column team.

    Returns:
        This process's (row team rank, column team rank).

    Raises:
        CollectiveGroupError: an unknown parent group.
        ValueError: ``xrange`` out of range.
    """
    parent = groups.lookup(group_name)
    x_team, y_team = teams.split_2d(teams.world_team(parent.world_size), xrange, parent.rank)
    return (groups.add_team(parent, x_team, x_group_name),
            groups.add_team(parent, y_team, y_group_name))


def node_team(group_name: str = "default") -> str:
    """The name of the predefined team of ``group_name``'s ranks on this rank's Ray node.

    Args:
        group_name: the group's name.

    Returns:
        ``"<group_name>:node"``, usable wherever a group name is.
    """
    return f"{group_name}:node"


def world_team(group_name: str = "default") -> str:
    """The name of the predefined team of all of ``group_name``'s ranks.

    Args:
        group_name: the group's name.

    Returns:
        ``"<group_name>:world"``, usable wherever a group name is.
    """
    return f"{group_name}:world"


# --------------------------------------------------------------------------- the cost model behind "auto"
# ``tune`` measures a group's transport (any backend) and calibrates the model;
# ``choose_algorithm`` says what "auto" runs for a size; ``explain`` prints every
# algorithm's predicted cost (docs/collective.md); ``get_cost_params`` and
# ``set_cost_params`` read and set the fitted parameters.
DEFAULT_PARAMS = autotune.DEFAULT_PARAMS
"""What ``explain`` assumes without a fitted group or given params."""


def explain(world_size: int, nbytes: int, group_name: str | None = None,
            params: CostParams | None = None, ranks_per_node: int | None = None) -> str:
    """Every allreduce algorithm's predicted cost, as a table to print.

    With ``group_name`` (a calibrated group of this process, after its first
    ``algorithm="auto"`` call or ``tune``) and no ``params``: the group's fitted
    parameters, each algorithm's measured/model ratio and the calibrated time
    "auto" compares, plus what the size class's trial and probes measured (the
    algorithm that runs, its challenger, the switches so far). Otherwise the
    plain cost model with ``params`` (or ``DEFAULT_PARAMS``); ``ranks_per_node``
    (a layout of several nodes) adds the hierarchical reduction server, which
    needs one (a group's own layout is used when ``group_name`` is given).

    Args:
        world_size: the number of ranks.
        nbytes: the message size.
        group_name: a calibrated group of this process, or None.
        params: cost-model parameters to use instead of a group's.
        ranks_per_node: ranks per node, for a layout of several nodes.

    Returns:
        The table, one row per algorithm, the one ``auto`` picks marked.

    Raises:
        CollectiveGroupError: ``group_name`` names no group of this process.
    """
    calibration, measured = None, None
    if params is None and group_name is not None:
        comm = groups.lookup(group_name).comm
        calibration = getattr(comm, "calibration", None)
        measured = getattr(comm, "measured", None)  # the trial's and probes' findings
    if calibration is not None and calibration.world_size == world_size:
        line = measured(nbytes) if measured is not None else None
        return str(calibration.explain(nbytes)) + (f"\n{line}" if line else "")
    if calibration is not None:
        params = calibration.params
    if ranks_per_node is None and group_name is not None:
        ranks_per_node = world_size
    return cost_model.explain(world_size, nbytes, params or DEFAULT_PARAMS, ranks_per_node)


def choose_algorithm(nbytes: int, group_name: str = "default") -> str:
    """The algorithm ``allreduce(..., algorithm="auto")`` runs for ``nbytes`` in this group.

    The first call (or first "auto" allreduce) measures and fits, so every rank
    must make it; later calls are local.

    Args:
        nbytes: the message size.
        group_name: a group ("cpu", "gloo" or "nccl").

    Returns:
        The algorithm's name.

    Raises:
        CollectiveGroupError: an unknown group.
        ValueError: the group has no cost model (a team of a user communicator).
    """
    return tuned_comm(group_name, "choose_algorithm").choose(int(nbytes))


def get_cost_params(group_name: str = "default") -> CostParams | None:
    """The cost-model parameters fitted for ``group_name``.

    Args:
        group_name: the group's name.

    Returns:
        The fitted ``CostParams``, or None before the first "auto" call (or on
        a backend without the cost model).

    Raises:
        CollectiveGroupError: an unknown group.
    """
    return getattr(groups.lookup(group_name).comm, "params", None)


def set_cost_params(params: CostParams | None, group_name: str = "default") -> None:
    """Use ``params`` for ``algorithm="auto"`` instead of measuring; pass the same on every rank.

    Args:
        params: the parameters, or None to measure again on the next "auto" call.
        group_name: a group ("cpu", "gloo" or "nccl").

    Raises:
        CollectiveGroupError: an unknown group.
        ValueError: the group has no cost model (a team of a user communicator).
    """
    tuned_comm(group_name, "set_cost_params").set_params(params)


def tune(group_name: str = "default", sizes: Sequence[int] | None = None,
         repeats: int = autotune.REPEATS) -> autotune.Calibration | None:
    """Measure the group's transport and calibrate the cost model now (every rank must call).

    Args:
        group_name: a group ("cpu", "gloo" or "nccl").
        sizes: message sizes in bytes to measure (default 256 KiB, 4 MiB, 32 MiB).
        repeats: timed calls per algorithm and size.

    Raises:
        CollectiveGroupError: an unknown group.
        ValueError: the group has no cost model (a team of a user communicator).

    Returns:
        The group's ``Calibration`` (shared ``params`` plus per-algorithm ratios;
        ``predict(algorithm, nbytes)``, ``choose(nbytes)``, ``explain(nbytes)``),
        or None for a one-rank group.
    """
    comm = tuned_comm(group_name, "tune")
    comm.tune(**({"sizes": tuple(sizes)} if sizes else {}), repeats=repeats)
    return comm.calibration
