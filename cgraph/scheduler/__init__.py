"""The scheduler: pure passes from the Graph IR to per-actor schedules.

Imports neither ray nor torch; see ``pipeline.plan_schedule`` for the whole
pipeline and each module's docstring for its pass.
"""

from __future__ import annotations

from cgraph.scheduler.channels import (
    ChannelKind,
    ChannelPlan,
    ChannelSpec,
    ValueMap,
    format_channels,
    map_values,
    parse_channels,
    plan_channels,
)
from cgraph.scheduler.deadlock import Deadlock, find_deadlock, raise_on_deadlock
from cgraph.scheduler.lower import lower
from cgraph.scheduler.ops import (
    COMM_KINDS,
    Op,
    OpKind,
    Schedule,
    Stream,
    format_grid,
    format_schedule,
    parse_op,
    parse_schedule,
)
from cgraph.scheduler.overlap import overlap
from cgraph.scheduler.pipeline import PASSES, Planned, plan_schedule
from cgraph.scheduler.verify import RULES, check, verify

__all__ = [
    "COMM_KINDS",
    "PASSES",
    "RULES",
    "ChannelKind",
    "ChannelPlan",
    "ChannelSpec",
    "Deadlock",
    "Op",
    "OpKind",
    "Planned",
    "Schedule",
    "Stream",
    "ValueMap",
    "check",
    "find_deadlock",
    "format_channels",
    "format_grid",
    "format_schedule",
    "lower",
    "map_values",
    "overlap",
    "parse_channels",
    "parse_op",
    "parse_schedule",
    "plan_channels",
    "plan_schedule",
    "raise_on_deadlock",
    "verify",
]
