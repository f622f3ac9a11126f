"""GPU placement: the transport of a "nccl" group from where Ray put its members, and the
CUDA device a communicator opens on, from Ray's assignment (no CUDA, no Ray needed)."""

from __future__ import annotations

import pytest

from cgraph.comm.gpu_placement import device_index
from cgraph.errors import CompileError
from cgraph.scheduler.groups import gpu_kind


def test_members_on_one_gpu_use_cuda_ipc() -> None:
    assert gpu_kind(["a", "b", "c"], [("n1", ("0",)), ("n1", ("0",)), ("n1", ("0",))]) == "cuda_ipc"


def test_members_on_distinct_gpus_use_nccl() -> None:
    assert gpu_kind(["a", "b"], [("n1", ("0",)), ("n1", ("1",))]) == "nccl"
    assert gpu_kind(["a", "b"], [("n1", ("0",)), ("n2", ("0",))]) == "nccl"  # GPU 0 of two nodes
    assert gpu_kind(["a"], [("n1", ("3",))]) == "nccl"


def test_the_first_assigned_gpu_is_the_one_compared() -> None:
    """a holds GPUs 1 and 2, b holds 1 and 3: both would open on GPU 1."""
    assert gpu_kind(["a", "b"], [("n1", ("1", "2")), ("n1", ("1", "3"))]) == "cuda_ipc"
    assert gpu_kind(["a", "b"], [("n1", ("0", "1")), ("n1", ("1", "0"))]) == "nccl"


def test_a_mixture_is_refused_naming_who_shares() -> None:
    with pytest.raises(CompileError, match=r"share a GPU \(a, b on GPU 0\) and others do not"):
        gpu_kind(["a", "b", "c"], [("n1", ("0",)), ("n1", ("0",)), ("n1", ("1",))])


def test_a_member_without_a_gpu_is_refused_by_name() -> None:
    with pytest.raises(CompileError, match=r"actor b exchange tensors over NCCL but Ray assigned no GPU"):
        gpu_kind(["a", "b"], [("n1", ("0",)), ("n1", ())])


@pytest.mark.parametrize(
    ("ids", "visible", "index"),
    [
        (["0"], "0", 0),  # what Ray sets in an actor with one GPU
        ([3], "3", 0),
        (["2", "5"], "2,5", 0),
        (["5"], "2,5", 1),  # a process that sees more than Ray gave it
        (["1"], None, 1),  # nothing set: every GPU visible, in order
        (["GPU-9f1c"], "GPU-77aa,GPU-9f1c", 1),  # UUIDs
    ],
)
def test_the_device_index_is_rays_first_gpu_among_the_visible(ids, visible, index) -> None:
    assert device_index(ids, visible) == index


def test_a_hidden_or_missing_gpu_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="Ray assigned it no GPU"):
        device_index([], "0")
    with pytest.raises(RuntimeError, match=r"CUDA_VISIBLE_DEVICES='1' hides it"):
        device_index(["0"], "1")
