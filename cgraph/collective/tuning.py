"""The cost model behind ``allreduce(..., algorithm="auto")``, as the user sees it.

``tune`` measures a group's transport (any backend) and calibrates the model;
``choose_algorithm`` says what ``auto`` runs for a size; ``explain`` prints every
algorithm's predicted cost (docs/collective.md); ``get_cost_params`` and
``set_cost_params`` read and set the fitted parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from cgraph.collective import groups
from cgraph.collective.arguments import tuned_comm
from cgraph.comm.tuning import autotune, cost_model
from cgraph.comm.tuning.cost_model import CostParams

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
