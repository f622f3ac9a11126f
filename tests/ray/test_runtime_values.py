"""Values that cross actors as they cross through Ray: classes and functions of the
driver's script by value, and a value that cannot be sent or rebuilt is that
execution's error, never the end of the graph or a shift of later results."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import ray
from ray.dag import InputNode, MultiOutputNode

import cgraph


def _refuse() -> None:
    raise ValueError("refusing to be rebuilt")


class Unrestorable:
    """Pickles fine; unpickling it raises (a module missing there, a failing __setstate__)."""

    def __reduce__(self):
        return (_refuse, ())


@ray.remote(num_cpus=0)
class Maker:
    def make(self, kind):
        if kind == "lock":
            return threading.Lock()
        if kind == "unrestorable":
            return Unrestorable()
        return kind

    def echo(self, x):
        return x


@pytest.fixture
def makers(actors):
    return actors(Maker, 2)


def test_local_classes_and_functions_travel_by_value(makers, no_leaks):
    """What a driver script defines (here: local to the test, which plain pickle refuses
    too) reaches the actors and comes back, as Ray's cloudpickle sends it."""

    @dataclasses.dataclass
    class Box:
        label: str
        scale: object

    a, b = makers
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    compiled = cgraph.compile(dag)
    try:
        got = compiled.execute(Box("m", lambda x: 3 * x)).get(timeout=60)
        again = compiled.execute(7).get(timeout=60)
    finally:
        compiled.teardown()
    assert type(got).__name__ == "Box" and got.label == "m" and got.scale(2) == 6
    assert again == 7


def test_a_value_that_cannot_be_sent_is_that_executions_error(makers, no_leaks):
    a, b = makers
    with InputNode() as inp:
        dag = b.echo.bind(a.make.bind(inp))
    compiled = cgraph.compile(dag)
    try:
        with pytest.raises(cgraph.TaskError) as info:
            compiled.execute("lock").get(timeout=60)
        after = compiled.execute("fine").get(timeout=60)
    finally:
        compiled.teardown()
    assert isinstance(info.value, TypeError) and "lock" in str(info.value)
    assert info.value.method == "make" and "could not be sent" in info.value.traceback_str
    assert after == "fine"


def test_a_value_that_cannot_be_rebuilt_is_that_executions_error(makers, no_leaks):
    """On an actor (b reads it) and on the driver (an output): the error, then the next
    execution's own result, not a result shifted by one."""
    a, b = makers
    with InputNode() as inp:
        made = a.make.bind(inp)
        dag = MultiOutputNode([b.echo.bind(made), made])
    compiled = cgraph.compile(dag)
    try:
        refs = compiled.execute("unrestorable")
        errors = []
        for ref in refs:
            with pytest.raises(cgraph.TaskError) as info:
                ref.get(timeout=60)
            errors.append(info.value)
        after = compiled.execute("fine").get(timeout=60)
    finally:
        compiled.teardown()
    assert all(isinstance(e, ValueError) and "refusing to be rebuilt" in str(e) for e in errors)
    assert after == ["fine", "fine"]


def test_driver_side_rebuild_failure_does_not_shift_results(makers, no_leaks):
    a, _ = makers
    with InputNode() as inp:
        dag = a.make.bind(inp)
    compiled = cgraph.compile(dag)
    try:
        first = compiled.execute("unrestorable")
        second = compiled.execute("second")
        with pytest.raises(cgraph.TaskError, match="refusing to be rebuilt") as info:
            first.get(timeout=60)
        value = second.get(timeout=60)
    finally:
        compiled.teardown()
    assert isinstance(info.value, ValueError) and info.value.execution_index == 0
    assert value == "second"
