"""A tensor sent on the comm thread is never written before its send completed.

    inp ─► p.make ══ communicator edge ══► q.spread ─► driver     (min, max of what arrived)
              │
              └─► p.bump_arg (in place, on p, after the SEND)  ─► driver
                  p.bump_self (in place on the tensor p kept)   ─► driver

With ``overlap_gpu_communication`` the SEND runs on p's comm thread while p's
loop goes on to the next method, which updates the very tensor being sent: through
its argument, or through ``self``. Each execution must deliver the tensor as it
was returned (every element equal), with overlap on exactly as with it off.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray
import torch
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.scheduler import format_schedule

pytestmark = pytest.mark.usefixtures("no_leaks")

N = 4 << 20  # 16 MiB of float32: the send's copy takes long enough to be overtaken
EXECUTIONS = 16


@ray.remote(num_cpus=0)
class Mutator:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.kept: torch.Tensor | None = None

    def make(self, v: int) -> torch.Tensor:
        self.kept = torch.full((N,), float(v))
        return self.kept

    def bump_arg(self, t: torch.Tensor) -> int:
        t.add_(1000.0)
        return 0

    def bump_self(self, _: int) -> int:
        assert self.kept is not None
        self.kept.add_(1000.0)
        return 0

    def spread(self, t: torch.Tensor) -> tuple[float, float]:
        return float(t.min()), float(t.max())


@pytest.fixture(scope="module")
def pair(ray_session: Any) -> Any:
    actors = [Mutator.remote(), Mutator.remote()]
    ray.get([a.__ray_ready__.remote() for a in actors])
    yield actors
    for a in actors:
        ray.kill(a)


def build(p: Any, q: Any, through: str) -> Any:
    with InputNode() as inp:
        x = p.make.bind(inp).with_tensor_transport(
            transport="nccl", _static_shape=True, _direct_return=True
        )
        bump = p.bump_arg.bind(x) if through == "arg" else p.bump_self.bind(inp)
        return MultiOutputNode([q.spread.bind(x), bump])


@pytest.mark.parametrize("communicator", ["cpu", "gloo"])
@pytest.mark.parametrize("through", ["arg", "self"])
@pytest.mark.parametrize("overlap", [False, True])
def test_a_sent_tensor_is_not_written_before_the_send_completed(
    pair: Any, through: str, overlap: bool, communicator: str
) -> None:
    p, q = pair
    compiled = cgraph.compile(
        build(p, q, through), default_communicator=communicator, overlap_gpu_communication=overlap
    )
    try:
        if overlap:
            sends = [op for op in format_schedule(compiled.schedule).split() if ".SEND" in op]
            assert sends and all(op.endswith("@comm") for op in sends), format_schedule(
                compiled.schedule
            )
        got = [compiled.execute(v).get(timeout=60) for v in range(EXECUTIONS)]
    finally:
        compiled.teardown()
    torn = [(v, spread) for v, (spread, _) in enumerate(got) if spread != (float(v), float(v))]
    assert torn == [], (
        f"{len(torn)} of {EXECUTIONS} executions delivered a tensor written mid-send: {torn[:4]}"
    )
