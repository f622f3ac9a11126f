"""GPU placement on Ray's logical GPUs (this session's Ray has some even without CUDA):
the transport chosen for a "nccl" group from where Ray put its members, asserted on the
compiled graph before any execution, so no CUDA call runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import ray
from ray.dag import InputNode, MultiOutputNode

import cgraph
from cgraph.comm.gpu_placement import device_index
from cgraph.runtime.communicators import CommResources

pytestmark = pytest.mark.usefixtures("no_leaks")


@ray.remote(num_cpus=0)
class Holder:
    def make(self, x: int) -> Any:
        import torch

        return torch.full((2,), float(x))

    def total(self, t: Any) -> float:
        return float(t.sum())

    def gpus(self) -> tuple[list[str], int]:
        ids = [str(g) for g in ray.get_gpu_ids()]
        return ids, device_index(ids, os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.fixture(scope="module")
def logical_gpus(ray_session: Any) -> int:
    count = int(ray.cluster_resources().get("GPU", 0))
    assert count >= 3, "the session's Ray has logical GPUs (tests/conftest.py)"
    return count


@contextmanager
def holders(*gpus: float) -> Iterator[list[Any]]:
    """Fresh actors with these (logical) GPU shares, killed afterwards."""
    actors = [Holder.options(num_gpus=g).remote() for g in gpus]
    try:
        yield actors
    finally:
        for actor in actors:
            ray.kill(actor)


def group_kinds(compiled: Any) -> set[str]:
    (comm,) = [r for r in compiled._ep.resources if isinstance(r, CommResources)]
    return {g.kind for program in comm.programs.values() for g in program.groups.values()}


def pipeline(senders: list[Any], receiver: Any) -> Any:
    with InputNode() as inp:
        return MultiOutputNode(
            [receiver.total.bind(s.make.bind(inp).with_tensor_transport(transport="nccl")) for s in senders]
        )


def compiled_kinds(dag: Any) -> set[str]:
    compiled = cgraph.compile(dag)
    try:
        return group_kinds(compiled)
    finally:
        compiled.teardown()


def test_actors_sharing_one_gpu_use_cuda_ipc(logical_gpus: int) -> None:
    with holders(0.5, 0.5) as (a, b):
        (ids_a, index_a), (ids_b, _) = ray.get([a.gpus.remote(), b.gpus.remote()])
        if ids_a != ids_b:
            pytest.fail(f"Ray put the two halves on GPUs {ids_a} and {ids_b}: this test needs them together")
        assert index_a == 0  # Ray shows an actor only its own GPU
        assert compiled_kinds(pipeline([a], b)) == {"cuda_ipc"}


def test_actors_on_distinct_gpus_use_nccl(logical_gpus: int) -> None:
    with holders(1, 1) as (a, b):
        ids = ray.get([a.gpus.remote(), b.gpus.remote()])
        assert ids[0][0] != ids[1][0] and [index for _, index in ids] == [0, 0]
        assert compiled_kinds(pipeline([a], b)) == {"nccl"}


def test_a_mixture_is_refused_and_the_actors_stay_usable(logical_gpus: int) -> None:
    with holders(0.5, 0.5, 1) as (a, b, c):
        with pytest.raises(cgraph.CompileError, match="share a GPU .* and others do not"):
            cgraph.compile(pipeline([a, c], b))
        assert ray.get([x.total.remote(ray.get(a.make.remote(1))) for x in (a, b, c)]) == [2.0] * 3


def test_gpus_of_an_actor_created_a_moment_ago_are_read_right(logical_gpus: int) -> None:
    """Ray registers a new actor asynchronously (about half of the tries here were not in
    the GCS right after ``.remote()``): the front end must not read its GPUs as none."""
    from cgraph.dag.adapter import _handle_gpus

    for _ in range(10):
        with holders(0.5) as (actor,):  # killed at once: 4 logical GPUs, room for the next
            assert _handle_gpus(actor, "Holder") == 0.5
    with holders(0.5, 0.5) as (a, b):
        assert compiled_kinds(pipeline([a], b)) in ({"cuda_ipc"}, {"nccl"})  # compiled at once
