"""A group's ``algorithm="auto"`` state: what each backend's communicator keeps for it.

``autotune`` has the pieces (measure and fit, a size class's trial, its
probes); a ``Tuner`` holds one group's results and applies them call by call,
so a communicator only says how to run its own allreduce and how to wrap
collective work in its error handling::

    TorchComm (gloo)    Tuner(ProcessGroupTransport, own={"native": pg allreduce}, guard)
    first auto call     tune: calibrate (every candidate, "native" too) -> Calibration
    each auto call      arm(n): the size class's Arm (its trial on first use)
                        arm.due() -> probe(arm, ...)   else run choose(n)

An ``auto`` call's measuring (calibration and trial together) stops once it has
taken ``AUTO_SHARE`` of the group's timeout: meanwhile this rank's peers on its
other teams wait for it under that timeout, and load stretches the measuring.
``tune``, asked for by name, measures in full.

The user's side of it (``tuning``: ``tune``, ``choose_algorithm``, ``explain``,
``get_cost_params``, ``set_cost_params``) calls the communicator, which answers
from its ``Tuner``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cgraph.comm.algorithms import runs_on
from cgraph.comm.algorithms.reduction_server import DEPTH
from cgraph.comm.transport import Transport
from cgraph.comm.tuning import cost_model
from cgraph.comm.tuning.autotune import (
    FALLBACK,
    TRIAL_MIN_BYTES,
    Arm,
    Calibration,
    calibrate,
    probe,
    size_class,
    trial_arm,
)
from cgraph.comm.tuning.cost_model import CostParams
from cgraph.comm.tuning.measurement import FIT_BYTES, REPEATS, Run, deadline, ranks_per_node
from cgraph.comm.types import ReduceOp

AUTO_SHARE = 0.25
"""The part of the group's ``timeout_s`` after which an ``auto`` call's first-use measuring
stops, at the end of the round under way (``measurement.out_of_time``); what it leaves
unmeasured, the model's pick decides and the probes check (``autotune.trial_arm``).

Rank 0 of ``split_2d(g, 2)`` allreduces over row (0 1), then column (0 2): it waits in the
column's signature check, under gloo's timeout, while rank 2 still measures on row (2 3).
A team's first calls measured for 0.5-2 s on 2 idle cores and 7-15 s beside two busy
loops: unbounded, a busier host took them past a 30 s timeout. A quarter leaves room for
the round under way and for waits that chain through a second team."""


class Tuner:
    """One group's ``auto``: its ``Calibration``, an ``Arm`` per size class, and the backend's
    own allreduces (``own``), which compete with cgraph's algorithms.

    Every rank holds the same state and changes it on the same call: the first
    ``arm``, ``choose`` or ``tune`` measures and fits (``calibrate``), and the
    first ``arm`` of a size class from ``TRIAL_MIN_BYTES`` runs its trial. Both
    are collective; they run inside ``guard(what, work)``, the backend's error
    handling, which returns ``work()``. The backend runs the pick itself (the
    backend's own allreduce on its own tensor, where it has one).
    """

    def __init__(self, transport: Transport, own: Mapping[str, Run] | None = None,
                 guard: Callable[[str, Callable[[], Any]], Any] | None = None,
                 sizes: Sequence[int] = FIT_BYTES, repeats: int = REPEATS,
                 timeout_s: float | None = None) -> None:
        self.transport, self.own = transport, dict(own or {})
        self.sizes, self.repeats = tuple(sizes), repeats  # what ``tune`` measures by default
        # an auto call's measuring stops after this (None: never; ``tune`` never does)
        self.budget_s = None if timeout_s is None else AUTO_SHARE * timeout_s
        self._guard = guard or (lambda what, work: work())
        self.calibration: Calibration | None = None
        self.tuned = False
        self.arms: dict[int, Arm] | None = {}  # size class -> its arm; None: the model alone

    @property
    def params(self) -> CostParams | None:
        return None if self.calibration is None else self.calibration.params

    def choose(self, nbytes: int) -> str:
        """The candidate ``auto`` runs for ``nbytes`` now."""
        arm = self.arm(nbytes)
        if arm is not None:
            return arm.incumbent
        return FALLBACK if self.calibration is None else self.calibration.choose(nbytes)

    def arm(self, nbytes: int) -> Arm | None:
        """The size class's trial-settled arm; None where the model alone decides."""
        until = None  # this call's measuring stops there (``AUTO_SHARE``)
        if not self.tuned and self.transport.world_size > 1:
            until = deadline(self.budget_s)
            self._calibrate(self.sizes, self.repeats, until)
        calibration = self.calibration
        if calibration is None or self.arms is None or nbytes < TRIAL_MIN_BYTES:
            return None
        key = size_class(nbytes)
        if key not in self.arms:
            until = deadline(self.budget_s) if until is None else until
            self.arms[key] = self._guard("autotune trial", lambda: trial_arm(
                self.transport, calibration, nbytes, own=self.own, deadline=until))
        return self.arms[key]

    def measured(self, nbytes: int) -> str | None:
        """What the trial and the probes of ``nbytes``'s size class found (None: no trial yet)."""
        arm = None if self.arms is None else self.arms.get(size_class(nbytes))
        return None if arm is None else arm.describe()

    def probe(self, arm: Arm, arr: np.ndarray, op: ReduceOp) -> None:
        """``probe`` on this group, ``arr`` getting the incumbent's result."""
        self._guard("allreduce auto probe", lambda: probe(self.transport, arm, arr, op, self.own))

    def tune(self, sizes: Sequence[int] | None = None, repeats: int | None = None) -> None:
        """Measure and fit now (every rank calls); the size classes' trials start over."""
        self._calibrate(sizes or self.sizes, repeats or self.repeats, None)

    def _calibrate(self, sizes: Sequence[int], repeats: int, until: float | None) -> None:
        self.calibration = self._guard("autotune", lambda: calibrate(
            self.transport, sizes, repeats, self.own, until))
        self.tuned, self.arms = True, {}

    def set_params(self, params: CostParams | None) -> None:
        """Use ``params`` (uncalibrated, every ratio 1) instead of measuring; the same on every
        rank! None: measure on the next ``auto`` call. The backend's own allreduces come
        first: each ties its ``STAND_IN``, whose work it does in native code, and wins it."""
        if params is None:
            self.calibration, self.tuned, self.arms = None, False, {}
            return
        self.arms = None  # the user's parameters decide: no measured trials
        rpn = ranks_per_node(self.transport)
        runs = runs_on(self.transport)
        names = (*self.own, *(a for a in cost_model.candidates(rpn) if a in runs))
        self.calibration = Calibration(self.transport.world_size, rpn, params, (1,),
                                       {a: (1.0,) for a in names})
        self.tuned = True

    def options(self, name: str, nbytes: int) -> dict[str, int]:
        """``name``'s options from the fitted model: the reduction server's slice size
        (``cost_model.slice_bytes``); none before a calibration (the algorithm's default).
        Every rank holds the same parameters, so every rank cuts the same slices."""
        calibration = self.calibration
        if name != "reduction_server" or calibration is None:
            return {}
        p, rpn = self.transport.world_size, ranks_per_node(self.transport)
        # Slices overlap only where a node has a core to spare for each stage in flight;
        # where its ranks take every core, each slice only adds its messages' latency.
        depth = 1 if 0 < calibration.cores <= rpn else DEPTH
        return {"slice_bytes": cost_model.slice_bytes(p, nbytes, calibration.params, rpn, depth=depth)}

    def inherit(self, parent: Tuner) -> None:
        """A team of the parent's very ranks keeps the parent's calibration."""
        if parent.transport.world_size == self.transport.world_size:
            self.calibration, self.tuned = parent.calibration, parent.tuned


class TunedComm:
    """What a backend's communicator answers for ``tuning`` (``tune``, ``choose_algorithm``,
    ``explain``, the cost parameters): its ``tuner``'s state. A subclass provides ``tuner``."""

    if TYPE_CHECKING:  # an attribute or a property
        @property
        def tuner(self) -> Tuner: ...

    @property
    def calibration(self) -> Calibration | None:
        """The group's fitted model (None before the first "auto" or ``tune``)."""
        return self.tuner.calibration

    @property
    def params(self) -> CostParams | None:
        """The fitted cost-model parameters (None before the first "auto" or ``tune``)."""
        return self.tuner.params

    def choose(self, nbytes: int) -> str:
        """What "auto" runs for ``nbytes`` now; measures (every rank calls) on first use."""
        return self.tuner.choose(nbytes)

    def measured(self, nbytes: int) -> str | None:
        """What the trial and the probes of ``nbytes``'s size class found (None: no trial yet)."""
        return self.tuner.measured(nbytes)

    def tune(self, sizes: Sequence[int] | None = None, repeats: int | None = None) -> None:
        """Measure this group (every rank calls) and calibrate the cost model."""
        self.tuner.tune(sizes, repeats)

    def set_params(self, params: CostParams | None) -> None:
        """Use ``params`` for "auto" instead of measuring (the same on every rank!)."""
        self.tuner.set_params(params)
