"""Working views of the caller's tensors (``collective.tensor_views``), without Ray."""

from __future__ import annotations

import numpy as np
import torch

from cgraph.comm.cpu.backend import _desc
from cgraph.comm.tensor_views import dtype_name, working


def test_a_bfloat16_tensor_works_as_float32_but_is_named_as_itself() -> None:
    t = torch.tensor([1.5, 2.0, -3.0], dtype=torch.bfloat16)
    with working(t, "numpy") as view:
        assert view.dtype == np.float32 and dtype_name(view) == "torch.bfloat16"
        assert _desc(view) == "torch.bfloat16(3,)", "the call's tag: bfloat16 and float32 ranks differ"
        view *= 2
    assert t.dtype == torch.bfloat16 and t.tolist() == [3.0, 4.0, -6.0]


def test_numpy_dtypes_are_named_by_numpy() -> None:
    with working(torch.arange(4, dtype=torch.float32), "numpy") as view:
        assert _desc(view) == "float32(4,)"
    with working(np.zeros((2, 3), dtype=np.int64), "numpy") as view:
        assert _desc(view) == "int64(2, 3)"
