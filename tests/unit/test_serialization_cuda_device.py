"""Where a tensor written from a GPU lands (``serialization.has_cuda``), as in Ray Compiled
Graphs: an actor gets it on a GPU only if Ray gave it GPUs; the driver wherever torch sees
CUDA. Ray and CUDA are stand-ins here (unit tests start no Ray and may have no GPU)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from cgraph.channels import serialization


def fake_ray(actor: str | None, gpus: list[str]) -> SimpleNamespace:
    context = SimpleNamespace(get_actor_id=lambda: actor)
    return SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context,
                           get_gpu_ids=lambda: gpus)


@pytest.fixture
def cuda_here(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    serialization.has_cuda.cache_clear()
    yield
    serialization.has_cuda.cache_clear()


@pytest.mark.parametrize(("actor", "gpus", "want"), [
    ("a1", [], False),  # an actor without num_gpus: the CPU, though the node has GPUs
    ("a1", ["0"], True),  # an actor Ray gave a GPU
    (None, [], True),  # the driver: its own choice
])
def test_a_gpu_tensor_lands_on_a_gpu_only_where_ray_gave_one(
        monkeypatch: pytest.MonkeyPatch, cuda_here: None, actor: str | None, gpus: list[str],
        want: bool) -> None:
    monkeypatch.setitem(sys.modules, "ray", fake_ray(actor, gpus))
    assert serialization.has_cuda() is want


def test_without_cuda_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "ray", fake_ray("a1", ["0"]))
    serialization.has_cuda.cache_clear()
    try:
        assert serialization.has_cuda() is False
    finally:
        serialization.has_cuda.cache_clear()
