"""The executor's steps (``HANDLERS``: closures built once per loop), no Ray."""

from __future__ import annotations

from typing import Any

import pytest

from cgraph.runtime import comm_ops, executor
from cgraph.runtime.error_value import ErrorValue
from cgraph.runtime.program import ARG_CONST, ARG_INPUT, ARG_VALUE, ActorProgram, ComputeSpec
from cgraph.scheduler.ops import Op, OpKind


class _Reader:
    def __init__(self, values: list[Any]) -> None:
        self.values, self.released = list(values), 0

    def read(self) -> Any:
        return self.values.pop(0)

    def release(self) -> None:
        self.released += 1

    def detach(self) -> None:
        pass


class _Writer:
    def __init__(self) -> None:
        self.written: list[Any] = []

    def write(self, value: Any) -> None:
        self.written.append(value)

    def detach(self) -> None:
        pass


class _Actor:
    def __init__(self) -> None:
        self.calls = 0

    def add(self, a: Any, b: Any) -> Any:
        self.calls += 1
        if a == "boom":
            raise KeyError("boom")
        return a + b

    def pair(self, a: Any, b: Any = 0) -> tuple[Any, Any]:
        return a, a + b

    async def later(self, a: Any, b: Any) -> Any:
        return a * b


def _run(method: str, inputs: list[tuple[Any, Any]], spec_args: Any = None,
         monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[list[Any], _Actor, list[Any]]:
    """Run an actor program ``x, y -> method -> z`` over ``inputs``; what it wrote, and its steps."""
    readers = {"x": _Reader([a for a, _ in inputs]), "y": _Reader([b for _, b in inputs])}
    writer = _Writer()
    assert monkeypatch is not None
    monkeypatch.setattr(executor, "open_reader", lambda h: readers[h])
    monkeypatch.setattr(executor, "open_writer", lambda h: writer)
    ops = (Op("a", OpKind.READ, "x"), Op("a", OpKind.READ, "y"),
           Op("a", OpKind.COMPUTE, "z"), Op("a", OpKind.WRITE, "z"))
    args = spec_args or ((ARG_VALUE, "x"), (ARG_VALUE, "y"))
    program = ActorProgram("a", "a (Actor)", "t", ops, {"z": ComputeSpec("z", method, args, ())},
                           {"x": "x", "y": "y"}, {"z": ("z",)})
    actor = _Actor()
    ctx = executor.Context(actor, program)
    steps = [executor.HANDLERS[op.kind](op, ctx) for op in ops]
    for _ in inputs:
        for step in steps:
            step()
        ctx.end_execution()
    assert readers["x"].released == readers["y"].released == len(inputs)
    return writer.written, actor, steps


def test_reads_runs_and_writes_through_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    written, actor, _ = _run("add", [(1, 2), (10, 20)], monkeypatch=monkeypatch)
    assert written == [3, 30] and actor.calls == 2


def test_a_method_error_and_an_upstream_error_travel_as_error_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = ErrorValue.capture(ValueError("up"), actor="b", method="m", execution_index=0)
    written, actor, _ = _run("add", [("boom", 1), (upstream, 1), (2, 3)], monkeypatch=monkeypatch)
    assert isinstance(written[0], ErrorValue) and "KeyError: 'boom'" in written[0].message
    assert written[0].execution_index == 0 and written[0].method == "add"
    assert written[1] is upstream, "an upstream error is forwarded as is"
    assert actor.calls == 2, "the method is skipped when an argument is an upstream error"
    assert written[2] == 5, "the loop goes on after errors"


def test_an_async_method_is_awaited(monkeypatch: pytest.MonkeyPatch) -> None:
    written, _, _ = _run("later", [(3, 4)], monkeypatch=monkeypatch)
    assert written == [12]


def test_a_pending_argument_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = comm_ops.Pending(lambda: 40)
    written, _, _ = _run("add", [(pending, 2)], monkeypatch=monkeypatch)
    assert written == [42]


def test_constants_reach_the_method(monkeypatch: pytest.MonkeyPatch) -> None:
    written, _, _ = _run("add", [(1, None)], spec_args=((ARG_VALUE, "x"), (ARG_CONST, 5)),
                         monkeypatch=monkeypatch)
    assert written == [6]


@pytest.mark.parametrize(("args", "expected"), [
    (((ARG_INPUT, None), (ARG_CONST, 1)), 6),  # the whole input: execute's only argument
    (((ARG_INPUT, 1), (ARG_INPUT, "k")), 9),  # inp[1] and inp.k
])
def test_execute_arguments_reach_the_method(args: Any, expected: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    readers = {"n0": _Reader([((5, 7), {"k": 2})])}
    writer = _Writer()
    monkeypatch.setattr(executor, "open_reader", lambda h: readers[h])
    monkeypatch.setattr(executor, "open_writer", lambda h: writer)
    ops = (Op("a", OpKind.READ, "n0"), Op("a", OpKind.COMPUTE, "z"), Op("a", OpKind.WRITE, "z"))
    program = ActorProgram("a", "a (Actor)", "t", ops, {"z": ComputeSpec("z", "add", args, ())},
                           {"n0": "n0"}, {"z": ("z",)}, input_node="n0")
    ctx = executor.Context(_Actor(), program)
    for op in ops:
        executor.HANDLERS[op.kind](op, ctx)()
    assert writer.written == [expected]


def test_keyword_arguments_and_several_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    readers = {"x": _Reader([1])}
    writer = _Writer()
    monkeypatch.setattr(executor, "open_reader", lambda h: readers[h])
    monkeypatch.setattr(executor, "open_writer", lambda h: writer)
    ops = (Op("a", OpKind.READ, "x"), Op("a", OpKind.COMPUTE, "z"), Op("a", OpKind.WRITE, "z1"))
    spec = ComputeSpec("z", "pair", ((ARG_VALUE, "x"),), (("b", (ARG_CONST, 2)),),
                       num_returns=2, items=("z0", "z1"))
    program = ActorProgram("a", "a (Actor)", "t", ops, {"z": spec}, {"x": "x"}, {"z1": ("z1",)})
    ctx = executor.Context(_Actor(), program)
    for op in ops:
        executor.HANDLERS[op.kind](op, ctx)()
    assert ctx.values["z0"] == 1 and writer.written == [3], "b=2 reached the method; item 1 written"
