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
``"<group>:node"`` (the ranks on this rank's Ray node).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Sequence
from typing import Any

from cgraph.collective import autotune, backends, groups
from cgraph.collective.groups import DEFAULT_TIMEOUT_S
from cgraph.collective.tensor_views import working
from cgraph.comm import cost_model, teams
from cgraph.comm.cost_model import CostParams
from cgraph.comm.types import ReduceOp
from cgraph.errors import CollectiveGroupError

DEFAULT_PARAMS = autotune.DEFAULT_PARAMS
"""What ``explain`` assumes without a fitted group or given params."""


# --------------------------------------------------------------------------- groups
def init_collective_group(world_size: int, rank: int, backend: str = "cpu",
                          group_name: str = "default", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join group ``group_name`` as ``rank`` of ``world_size`` (call inside each member actor).

    Args:
        backend: "cpu", "gloo" or "nccl" (see the module docstring).
        timeout_s: how long a call waits for a peer before ``CollectiveTimeoutError``.

    Raises:
        CollectiveGroupError: a bad rank, the group already initialized here, the rank
            taken, or values that differ from the other members'.
        ValueError: an unknown backend.
    """
    groups.init(world_size, rank, backend, group_name, timeout_s)


def declare_collective_group(actors: Sequence[Any], world_size: int, ranks: Sequence[int],
                             backend: str = "cpu", group_name: str = "default",
                             timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Declare a group from the driver: actor ``actors[i]`` gets rank ``ranks[i]``.

    The actors need no set-up call: the first collective call in each finds its
    membership. The "cpu" backend needs the actors on the driver's node.

    Raises:
        CollectiveGroupError: the group exists, or actors and ranks do not match.
    """
    groups.declare(actors, world_size, ranks, backend, group_name, timeout_s)


create_collective_group = declare_collective_group
"""Ray's name (``ray.util.collective.create_collective_group``) for ``declare_collective_group``."""


def is_group_initialized(group_name: str = "default") -> bool:
    """True if this process is a member of ``group_name`` (declared membership counts)."""
    return groups.peek(group_name) is not None


def get_rank(group_name: str = "default") -> int:
    """This process's rank in ``group_name``, or -1 if it is not a member."""
    found = groups.peek(group_name)
    return -1 if found is None else found[0]


def get_collective_group_size(group_name: str = "default") -> int:
    """The number of ranks of ``group_name``, or -1 if this process is not a member."""
    found = groups.peek(group_name)
    return -1 if found is None else found[1]


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave ``group_name`` (and its teams); the last member out frees its links and store.

    Called on the driver (not a member), it tears the whole group down at once.
    """
    groups.destroy(group_name)


def nccl_available() -> bool:
    """True when torch.distributed has NCCL and a CUDA device is visible here."""
    return backends.nccl_available()


def gloo_available() -> bool:
    """True when torch.distributed has gloo."""
    return backends.gloo_available()


# --------------------------------------------------------------------------- collectives
def allreduce(tensor: Any, group_name: str = "default", op: Any = ReduceOp.SUM,
              algorithm: str = "auto") -> None:
    """Reduce ``tensor`` over the group, in place on every rank.

    Args:
        op: ReduceOp.SUM, PRODUCT, MIN or MAX (or its name).
        algorithm: "auto" (on "cpu": the fitted cost model's choice; on "gloo" and
            "nccl": the backend's own allreduce, also named "native"), or a name of
            ``cgraph.comm.algorithms.ALGORITHMS``: cgraph's algorithm, on every
            backend ("gloo"/"nccl": over the process group's send/recv).

    Raises:
        CollectiveGroupError, CollectiveMismatchError, CollectiveTimeoutError.
    """
    group = groups.lookup(group_name)
    op = _reduce_op(group, tensor, op, "allreduce")
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.allreduce(work, op, algorithm)


def reduce(tensor: Any, dst_rank: int = 0, group_name: str = "default",
           op: Any = ReduceOp.SUM) -> None:
    """Reduce ``tensor`` over the group into ``dst_rank``'s tensor (others keep theirs)."""
    group = groups.lookup(group_name)
    dst_rank = _check_peer(group, dst_rank, "dst_rank")
    op = _reduce_op(group, tensor, op, "reduce")
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.reduce(work, dst_rank, op)


def broadcast(tensor: Any, src_rank: int = 0, group_name: str = "default") -> None:
    """Copy ``src_rank``'s ``tensor`` into every rank's ``tensor``."""
    group = groups.lookup(group_name)
    src_rank = _check_peer(group, src_rank, "src_rank")
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.broadcast(work, src_rank)


def allgather(tensor_list: list[Any], tensor: Any, group_name: str = "default") -> None:
    """Fill ``tensor_list[r]`` with rank r's ``tensor`` on every rank."""
    group = groups.lookup(group_name)
    _check_parts(group, tensor_list, tensor, "allgather", "tensor_list")
    row = group.backend
    with working(tensor, row.tensor, row.device, write=False) as work:
        with _all_working(tensor_list, row) as outs:
            group.comm.allgather(outs, work)


def reducescatter(tensor: Any, tensor_list: list[Any], group_name: str = "default",
                  op: Any = ReduceOp.SUM) -> None:
    """``tensor`` = the reduction over ranks of their ``tensor_list[rank]``."""
    group = groups.lookup(group_name)
    _check_parts(group, tensor_list, tensor, "reducescatter", "tensor_list")
    op = _reduce_op(group, tensor, op, "reducescatter")
    row = group.backend
    with working(tensor, row.tensor, row.device) as out:
        with _all_working(tensor_list, row, write=False) as parts:
            group.comm.reducescatter(out, parts, op)


def send(tensor: Any, dst_rank: int, group_name: str = "default") -> None:
    """Send ``tensor`` to ``dst_rank``, which must ``recv`` a tensor of the same dtype and shape."""
    group = groups.lookup(group_name)
    dst_rank = _check_peer(group, dst_rank, "dst_rank", other=True)
    with working(tensor, group.backend.tensor, group.backend.device, write=False) as work:
        group.comm.send(work, dst_rank)


def recv(tensor: Any, src_rank: int, group_name: str = "default") -> None:
    """Fill ``tensor`` with the next tensor ``src_rank`` sends to this rank."""
    group = groups.lookup(group_name)
    src_rank = _check_peer(group, src_rank, "src_rank", other=True)
    with working(tensor, group.backend.tensor, group.backend.device) as work:
        group.comm.recv(work, src_rank)


def barrier(group_name: str = "default") -> None:
    """Return once every rank of the group has called ``barrier``."""
    groups.lookup(group_name).comm.barrier()


# --------------------------------------------------------------------------- teams
def split_strided(group_name: str, start: int, stride: int, size: int, new_group_name: str) -> int:
    """Make the team of ranks ``start, start+stride, ...`` (``size`` of them) group ``new_group_name``.

    No rendezvous through Ray: the team runs over the parent's links ("cpu") or
    store ("gloo"). Call it on the members (others get -1 and nothing).

    Returns:
        This process's rank in the team, or -1 if it is not a member.
    """
    parent = groups.lookup(group_name)
    team = teams.split_strided(teams.world_team(parent.world_size), start, stride, size)
    return groups.add_team(parent, team, new_group_name)


def split_2d(group_name: str, xrange: int, x_group_name: str, y_group_name: str) -> tuple[int, int]:
    """Lay the group's ranks out ``xrange`` wide; join this rank's row and column teams.

    Returns:
        This process's (row team rank, column team rank).
    """
    parent = groups.lookup(group_name)
    x_team, y_team = teams.split_2d(teams.world_team(parent.world_size), xrange, parent.rank)
    return (groups.add_team(parent, x_team, x_group_name),
            groups.add_team(parent, y_team, y_group_name))


def node_team(group_name: str = "default") -> str:
    """The name of the predefined team of ``group_name``'s ranks on this rank's Ray node."""
    return f"{group_name}:node"


def world_team(group_name: str = "default") -> str:
    """The name of the predefined team of all of ``group_name``'s ranks."""
    return f"{group_name}:world"


# --------------------------------------------------------------------------- auto
def explain(world_size: int, nbytes: int, group_name: str | None = None,
            params: CostParams | None = None, ranks_per_node: int | None = None) -> str:
    """Every allreduce algorithm's predicted cost, as a table to print.

    With ``group_name`` (a calibrated "cpu" group of this process, after its first
    ``algorithm="auto"`` call or ``tune``) and no ``params``: the group's fitted
    parameters, each algorithm's measured/model ratio and the calibrated time
    "auto" compares, plus what the size class's trial and probes measured (the
    algorithm that runs, its challenger, the switches so far). Otherwise the
    plain cost model with ``params`` (or ``DEFAULT_PARAMS``); ``ranks_per_node``
    (a layout of several nodes) adds the hierarchical reduction server, which
    needs one (a group's own layout is used when ``group_name`` is given).
    """
    calibration, measured = None, None
    if params is None and group_name is not None:
        comm = groups.lookup(group_name).comm
        calibration = getattr(comm, "calibration", None)
        measured = getattr(comm, "measured", None)  # the cpu backend's trial and probes
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
    """
    return _cpu_comm(group_name, "choose_algorithm").choose(int(nbytes))


def get_cost_params(group_name: str = "default") -> CostParams | None:
    """The cost-model parameters fitted for ``group_name`` (None before the first "auto")."""
    return getattr(groups.lookup(group_name).comm, "params", None)


def set_cost_params(params: CostParams | None, group_name: str = "default") -> None:
    """Use ``params`` for ``algorithm="auto"`` instead of measuring; pass the same on every rank."""
    _cpu_comm(group_name, "set_cost_params").set_params(params)


def tune(group_name: str = "default", sizes: Sequence[int] | None = None,
         repeats: int = autotune.REPEATS) -> autotune.Calibration | None:
    """Measure the group's transport and calibrate the cost model now (every rank must call).

    Returns:
        The group's ``Calibration`` (shared ``params`` plus per-algorithm ratios;
        ``predict(algorithm, nbytes)``, ``choose(nbytes)``, ``explain(nbytes)``),
        or None for a one-rank group.
    """
    comm = _cpu_comm(group_name, "tune")
    comm.tune(**({"sizes": tuple(sizes)} if sizes else {}), repeats=repeats)
    return comm.calibration


# --------------------------------------------------------------------------- checks
def _op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    try:
        return ReduceOp(str(getattr(op, "name", op)).lower())
    except ValueError:
        raise ValueError(f"unknown reduce op {op!r}; use one of {[o.name for o in ReduceOp]}") from None


_NUMERIC_KINDS = frozenset("biufc")
"""numpy dtype kinds a reduction takes: bool, signed and unsigned integers, floats, complex."""


def _reduce_op(group: groups.Group, tensor: Any, op: Any, call: str) -> ReduceOp:
    """``op`` as a ReduceOp, once ``tensor``'s dtype is known to reduce with it.

    Checked before anything is sent: ranks holding the same dtype all refuse
    alike, so nobody is left waiting and the group stays usable.
    """
    op = _op(op)
    dtype = tensor.dtype
    kind = getattr(dtype, "kind", None)  # numpy and cupy dtypes; torch's are all numeric
    if kind is not None and kind not in _NUMERIC_KINDS:
        raise ValueError(f"{call} on group {group.name!r}: cannot reduce dtype {dtype}; use a "
                         "bool, integer, floating or complex dtype")
    is_complex = kind == "c" or bool(getattr(dtype, "is_complex", False))
    if is_complex and (op in (ReduceOp.MIN, ReduceOp.MAX)
                       or (op is ReduceOp.PRODUCT and group.backend.name != "cpu")):
        raise ValueError(f"{call} on group {group.name!r}: {op.name} is not defined for complex "
                         f"dtype {dtype} on the {group.backend.name!r} backend; use SUM"
                         f"{' or PRODUCT' if op is not ReduceOp.PRODUCT else ''}, or reduce the "
                         "real and imaginary parts yourself")
    return op


def _check_peer(group: groups.Group, peer: Any, what: str, other: bool = False) -> int:
    """``peer`` as an int (numpy integers welcome) once it names another rank of ``group``."""
    try:
        rank = operator.index(peer)
    except TypeError:
        rank = -1
    if not 0 <= rank < group.world_size or (other and rank == group.rank):
        self_note = f", and not this rank ({group.rank})" if other else ""
        raise CollectiveGroupError(
            f"{what}={peer!r} is outside group {group.name!r}: use an integer rank in "
            f"0..{group.world_size - 1}{self_note}", group.name, group.rank)
    return rank


def _check_parts(group: groups.Group, parts: Sequence[Any], tensor: Any, call: str, what: str) -> None:
    shape, dtype = tuple(tensor.shape), _dtype_name(tensor)
    if len(parts) != group.world_size or any(tuple(t.shape) != shape for t in parts):
        raise ValueError(
            f"{call} on group {group.name!r}: {what} must hold world_size={group.world_size} "
            f"tensors shaped like the tensor {shape}, got "
            f"{[tuple(t.shape) for t in parts]}")
    if any(_dtype_name(t) != dtype for t in parts):
        raise ValueError(
            f"{call} on group {group.name!r}: {what} must hold tensors of the tensor's dtype "
            f"{dtype}, got {[_dtype_name(t) for t in parts]} (nothing is cast)")


def _dtype_name(tensor: Any) -> str:
    """``float32`` for numpy, cupy and torch alike."""
    return str(tensor.dtype).removeprefix("torch.")


def _cpu_comm(group_name: str, call: str) -> Any:
    group = groups.lookup(group_name)
    if group.backend.name != "cpu":
        raise ValueError(f"{call}: group {group_name!r} uses {group.backend.name!r}; cgraph's "
                         "cost model picks algorithms on the 'cpu' backend only")
    return group.comm


@contextlib.contextmanager
def _all_working(tensors: Sequence[Any], row: backends.Backend, write: bool = True) -> Iterator[list[Any]]:
    """``working`` for every tensor of a list at once."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(working(t, row.tensor, row.device, write)) for t in tensors]
