"""cgraph's error types: dual types with the user's exception and with registered bases."""

from __future__ import annotations

import builtins
import pickle

import pytest

from cgraph import errors
from cgraph.errors import TaskError, register_compat, with_compat


class CodedError(Exception):
    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


def wrap(cause: BaseException) -> TaskError:
    return TaskError.wrap(cause, actor="a (W)", method="m", execution_index=4, traceback_str="tb")


@pytest.mark.parametrize(
    "cause",
    [
        ValueError("v"),
        KeyError("k"),
        FileNotFoundError(2, "No such file", "/x"),
        builtins.TimeoutError("slow"),
        ConnectionResetError("reset"),
    ],
    ids=lambda c: type(c).__name__,
)
def test_task_error_is_also_the_cause_type(cause):
    err = wrap(cause)
    assert isinstance(err, TaskError) and isinstance(err, type(cause))
    assert err.cause is cause and err.execution_index == 4
    assert f"{type(cause).__name__} in a (W).m (execution 4)" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, type(cause)) and again.method == "m"
    with pytest.raises(type(cause)):
        raise err


class _ConfigError(RuntimeError):
    pass


@pytest.mark.parametrize(
    "cause",
    [RuntimeError("r"), NotImplementedError("n"), RecursionError("deep"), _ConfigError("c")],
    ids=lambda c: type(c).__name__,
)
def test_runtime_error_causes_with_ray_compat_registered(cause):
    # With Ray's classes registered (as the runtime does), TaskError(RuntimeError)'s
    # MRO puts RayTaskError (an __init__ with required arguments) before RuntimeError.
    import ray.exceptions

    import cgraph.runtime.compiled_graph  # noqa: F401 - registers the Ray compat bases

    err = wrap(cause)
    assert isinstance(err, type(cause)) and isinstance(err, ray.exceptions.RayTaskError)
    assert err.cause is cause and "execution 4" in str(err)
    assert isinstance(pickle.loads(pickle.dumps(err)), type(cause))


def test_os_error_fields_survive():
    err = wrap(FileNotFoundError(2, "No such file", "/x"))
    assert (err.errno, err.strerror, err.filename) == (2, "No such file", "/x")
    again = pickle.loads(pickle.dumps(err))
    assert (again.errno, again.filename) == (2, "/x")


def test_attributes_of_the_cause_read_through():
    err = wrap(CodedError("bad", code=42))
    assert isinstance(err, CodedError) and err.code == 42
    with pytest.raises(AttributeError):
        err.no_such_attribute  # noqa: B018


class _Timeout(errors.TimeoutError):
    pass


class _ForeignTimeout(builtins.TimeoutError):
    """Stands in for ray.exceptions.RayChannelTimeoutError: another OSError subclass."""


class _ForeignBase(Exception):
    pass


def test_with_compat_combines_os_error_layouts():
    register_compat(_Timeout, _ForeignTimeout, _ForeignBase)
    err = with_compat(_Timeout("too slow"))
    assert isinstance(err, _Timeout) and isinstance(err, _ForeignTimeout)
    assert isinstance(err, _ForeignBase) and isinstance(err, builtins.TimeoutError)
    assert str(err) == "too slow" and type(err).__name__ == "_Timeout"


def test_with_compat_without_registration_returns_the_error():
    err = errors.RefConsumedError("once")
    assert with_compat(err) is err
