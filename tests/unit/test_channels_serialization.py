"""Serialization into a slot: every value type round-trips; arrays come back as views.

No processes here: values are packed into an anonymous mmap and loaded back.
"""

from __future__ import annotations

import mmap
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cgraph.channels.serialization import ALIGN, dumps, loads, pack_into
from cgraph.errors import RuntimeGraphError, TaskError

torch = pytest.importorskip("torch")


def roundtrip(value):
    payload = dumps(value)
    mm = mmap.mmap(-1, max(payload.nbytes, 1))
    view = memoryview(mm)
    pack_into(payload, view)
    return loads(view), mm, payload


def assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.requires_grad == b.requires_grad
        assert torch.equal(a.detach(), b.detach())
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, BaseException):
        assert a.args == b.args
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


PLAIN = [
    0, -(2**70), 3.5, float("nan"), 1j, True, None, "", "héllo", b"\x00" * 100,
    bytearray(b"abc"), (1, "a"), [1, [2, [3]]], {"k": {1: 2}}, {1, 2}, frozenset({3}),
]  # fmt: skip
DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16",
          "float32", "float64", "complex64", "complex128", "<U3", "S2", "datetime64[ms]"]  # fmt: skip
SHAPES = [(), (0,), (3, 0), (5,), (2, 3, 4)]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_values_round_trip(value):
    out, _, payload = roundtrip(value)
    assert_same(value, out)
    assert not payload.buffers or isinstance(value, bytearray)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_arrays_round_trip_as_readonly_views(dtype, shape):
    a = np.arange(int(np.prod(shape)) or 0).astype(dtype).reshape(shape)
    out, mm, payload = roundtrip(a)
    assert_same(a, out)
    if payload.buffers:  # numpy ships datetimes in band (copied, writable)
        assert not out.flags.writeable  # shared by every reader of the slot
    if a.nbytes and not dtype.startswith("datetime"):
        assert len(payload.buffers) == 1
        base = np.frombuffer(mm, np.uint8).ctypes.data
        offset = out.ctypes.data - base
        assert 0 <= offset < len(mm) and offset % ALIGN == 0  # a view, aligned


@pytest.mark.parametrize(
    "make",
    [lambda: np.arange(24.0).reshape(4, 6)[:, ::2], lambda: np.arange(24.0).reshape(4, 6).T,
     lambda: np.asfortranarray(np.ones((3, 5))), lambda: np.array([{"a": 1}, None], dtype=object),
     lambda: np.zeros(3, dtype=[("x", "<i4"), ("y", "<f8")]), lambda: np.float32(2.5)],
    ids=["strided", "transposed", "fortran", "object", "structured", "scalar"],
)  # fmt: skip
def test_unusual_numpy_layouts_round_trip(make):
    a = make()
    out, _, _ = roundtrip(a)
    assert type(out) is type(a)
    if isinstance(a, np.ndarray) and a.dtype != object:
        assert out.dtype == a.dtype and out.shape == a.shape
        np.testing.assert_array_equal(out, a)
    else:
        assert out.tolist() == a.tolist()


TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                torch.complex64]  # fmt: skip
if hasattr(torch, "float8_e4m3fn"):
    TORCH_DTYPES.append(torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_torch_tensors_round_trip_as_views(dtype, shape):
    t = torch.arange(int(np.prod(shape)) or 0).reshape(shape).to(dtype)
    out, mm, payload = roundtrip(t)
    assert_same(t, out)
    if t.numel():
        base = np.frombuffer(mm, np.uint8).ctypes.data
        assert base <= out.data_ptr() < base + len(mm)  # zero-copy view into the slot
        assert payload.flags == [1]  # torch views are writable (torch has no read-only)


def test_torch_special_tensors():
    x = torch.randn(4, 5)
    values = {
        "transposed": x.T,
        "sliced": x[:, 1::2],
        "grad": torch.ones(3, requires_grad=True),
        "conj": torch.randn(3, dtype=torch.complex64).conj(),
        "parameter": torch.nn.Parameter(torch.ones(2)),
    }
    out, _, _ = roundtrip(values)
    for key in ("transposed", "sliced", "grad"):
        assert_same(values[key], out[key])
    assert torch.equal(out["conj"], values["conj"].resolve_conj())
    assert isinstance(out["parameter"], torch.nn.Parameter)


def test_nested_containers_with_arrays_and_tensors():
    value = {"a": [np.arange(5), (torch.ones(2, 2), "x")], "b": np.zeros((2, 2), "f4")}
    out, _, payload = roundtrip(value)
    assert_same(value, out)
    assert len(payload.buffers) == 3


def test_exceptions_round_trip():
    out, _, _ = roundtrip(ValueError("boom", 3))
    assert isinstance(out, ValueError) and out.args == ("boom", 3)
    err = TaskError.wrap(KeyError("k"), actor="a", method="f", execution_index=2,
                         traceback_str="Traceback ...")  # fmt: skip
    out, _, _ = roundtrip(err)
    assert isinstance(out, TaskError) and isinstance(out, KeyError)
    assert (out.actor, out.method, out.execution_index) == ("a", "f", 2)


class _Unpicklable(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


def test_unpicklable_exception_is_replaced_not_lost():
    out, _, _ = roundtrip(_Unpicklable("bad state"))
    assert isinstance(out, RuntimeGraphError)
    assert "_Unpicklable" in str(out) and "bad state" in str(out)
    wrapped = TaskError.wrap(_Unpicklable("x"), actor="a", method="m", execution_index=0,
                             traceback_str="tb")  # fmt: skip
    out, _, _ = roundtrip(wrapped)
    assert isinstance(out, TaskError) and out.actor == "a" and out.traceback_str == "tb"


def test_unpicklable_plain_value_raises_on_the_writer():
    with pytest.raises((TypeError, pickle.PicklingError)):
        dumps(threading.Lock())


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.int32, np.float64, np.uint8, np.complex64, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
    )
)
def test_property_any_array_round_trips(a):
    out, _, _ = roundtrip([a, {"again": a}])
    np.testing.assert_array_equal(out[0], a)
    np.testing.assert_array_equal(out[1]["again"], a)


def test_serializer_keeps_no_reference_to_the_last_value():
    import gc
    import weakref

    a, t = np.ones(10), torch.ones(10)
    refs = [weakref.ref(a), weakref.ref(t)]
    payload = dumps([a, t])
    del payload, a, t
    gc.collect()
    assert [r() for r in refs] == [None, None]


class WrittenFromGpu:
    """What the writer's pickler emits for a CUDA tensor (its host copy, tagged), made
    here without a GPU: the reader's side of the policy runs for real."""

    def __init__(self, host):
        self.host = host

    def __reduce__(self):
        from cgraph.channels import serialization

        flat = bytearray(self.host.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        args = (pickle.PickleBuffer(flat), self.host.dtype, tuple(self.host.shape), self.host.requires_grad)
        return serialization._rebuild_cuda_tensor, args


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reader without CUDA")
def test_a_tensor_written_from_a_gpu_reaches_a_reader_without_cuda_on_the_cpu():
    host = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).requires_grad_()
    got, _mm, _payload = roundtrip({"t": WrittenFromGpu(host), "k": 1})
    assert got["k"] == 1 and got["t"].device.type == "cpu"
    assert_same(got["t"], host)
    assert not torch.cuda.is_initialized()
