"""Every front-end error: its type, the node it names, and the fix it suggests.

The nccl-without-GPUs and deadlock errors come from the scheduler; they are
checked through ``cgraph.compile`` in ``test_compile_plan.py``.
"""

from __future__ import annotations

import ast
import re

import pytest
import ray
from ray.dag.class_node import _UnboundClassMethodNode

from cgraph import (
    CGraphError,
    DAGValidationError,
    EmptyDAGError,
    FunctionNodeError,
    InputNode,
    MultiOutputNode,
    MultipleInputsError,
    NestedNodeError,
    TransportError,
    UnknownMethodError,
    UnusedInputError,
)
from cgraph.dag import read_dag


@ray.remote
class Worker:
    device = "cpu"  # a class attribute: Ray's bind accepts it, it is no method

    def forward(self, x):
        return x

    def backward(self, x):
        return x

    def h(self, *xs, **kw):
        return xs


@ray.remote
def free_function(x):
    return x


@pytest.fixture(autouse=True)
def _no_cluster():
    yield
    assert not ray.is_initialized(), "a unit test started Ray"


def error_of(dag, kind: type[Exception]) -> str:
    """Read ``dag``, expect ``kind``; return the message after checking its layout."""
    with pytest.raises(kind) as err:
        read_dag(dag)
    assert isinstance(err.value, CGraphError) and isinstance(err.value, ValueError)
    message = str(err.value)
    for part in ("\n  at:  ", "\n  why: ", "\n  fix: "):
        assert part in message, message
    return message


# --------------------------------------------------------------------------- nested nodes
def test_node_nested_in_a_list_argument():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.forward.bind(inp)
        dag = b.h.bind(1, [x, 2])
    message = error_of(dag, NestedNodeError)
    assert "DAG node Worker.forward(inp) is nested inside argument 1 of Worker.h(1, list(...nodes...))" in message
    assert "at:  Worker.h(1, list(...nodes...))" in message
    assert "pass it as a direct argument" in message and "MultiOutputNode([x, y])" in message


def test_node_nested_in_a_dict_keyword():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = b.h.bind(inp, table={"k": a.forward.bind(inp)})
    message = error_of(dag, NestedNodeError)
    assert "nested inside keyword argument 'table'" in message
    assert "at:  Worker.h(inp, table=dict(...nodes...))" in message


RAY_NESTED = (r"Found (\d+) DAGNodes from the arg .*? in .*?\.\s*Please ensure that the argument is a "
              r"single DAGNode and that a DAGNode is not allowed to be placed inside any type of "
              r"container\.")
"""Ray's sentence for a node inside a container argument (users' tests match it)."""


class Holder:
    def __init__(self, value):
        self.value = value


@pytest.mark.parametrize("wrap, count", [
    (lambda x, y: [x], 1), (lambda x, y: (x,), 1), (lambda x, y: {"k": x}, 1),
    (lambda x, y: Holder(x), 1), (lambda x, y: [x, {"deep": (y, 3)}], 2),
])
def test_a_node_inside_any_container_or_object_gives_rays_sentence(wrap, count):
    a = Worker.bind()
    with InputNode() as inp:
        dag = a.h.bind(wrap(a.forward.bind(inp), a.backward.bind(inp)))
    message = error_of(dag, NestedNodeError)
    found = re.search(RAY_NESTED, message, re.DOTALL)
    assert found is not None, message
    assert int(found.group(1)) == count
    assert "is nested inside argument 0 of Worker.h(" in message


def test_multi_output_node_with_a_nested_list_or_a_constant():
    a = Worker.bind()
    with InputNode() as inp:
        x = a.forward.bind(inp)
        nested = MultiOutputNode([[x, x]])
        constant = MultiOutputNode([x, 3])
    message = error_of(nested, NestedNodeError)
    assert "MultiOutputNode holds a container of nodes at position 0" in message
    assert "MultiOutputNode([x, y]), not [[x, y]]" in message
    assert "holds the constant 3 at position 1" in error_of(constant, NestedNodeError)


# --------------------------------------------------------------------------- unsupported nodes
def test_free_function_node():
    a = Worker.bind()
    with InputNode() as inp:
        dag = a.forward.bind(free_function.bind(inp))
    message = error_of(dag, FunctionNodeError)
    assert "cannot compile free_function(inp)" in message
    assert "move the function into an actor class" in message


def test_free_function_as_the_root():
    with InputNode() as inp:
        dag = free_function.bind(inp)
    assert "free_function(inp)" in error_of(dag, FunctionNodeError)


def test_actor_passed_as_a_value():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = a.h.bind(inp, b)
    message = error_of(dag, DAGValidationError)
    assert "cannot compile Worker.bind()" in message
    assert "bind a method of the actor instead" in message


def test_multi_output_node_used_as_an_argument():
    a = Worker.bind()
    with InputNode() as inp:
        inner = MultiOutputNode([a.forward.bind(inp)])
        dag = a.h.bind(inner)
    message = error_of(dag, DAGValidationError)
    assert "MultiOutputNode can only be the root you compile" in message


def test_not_a_dag_at_all():
    message = error_of(42, DAGValidationError)
    assert "cannot compile 42: it is not a Ray DAG node" in message


# --------------------------------------------------------------------------- unknown method
def test_unknown_method_lists_close_matches():
    # Ray checks method names when binding on a ClassNode or a handle (a typo
    # raises AttributeError there); a node made past that check reaches cgraph.
    a = Worker.bind()
    with InputNode() as inp:
        dag = _UnboundClassMethodNode(a, "fowrard", {}).bind(inp)
    message = error_of(dag, UnknownMethodError)
    assert "actor a (Worker) has no method 'fowrard'" in message
    assert "at:  n1 = a.fowrard(n0)" in message
    assert "Worker defines: backward, forward, h" in message
    assert "did you mean 'forward'?" in message


def test_class_attribute_is_not_a_method():
    a = Worker.bind()
    with InputNode() as inp:
        dag = a.device.bind(inp)  # Ray's bind-time check only asks getattr(cls, name)
    message = error_of(dag, UnknownMethodError)
    assert "has no method 'device'" in message and "n1 = a.device(n0)" in message
    assert "a plain attribute or property cannot be called" in message


# --------------------------------------------------------------------------- inputs and emptiness
def test_empty_dag_only_returns_its_input():
    with InputNode() as inp:
        dag = inp[0]
    message = error_of(dag, EmptyDAGError)
    assert "at:  n1 = n0[0]" in message
    assert "bind at least one actor method" in message


def test_empty_multi_output_node():
    assert "MultiOutputNode([])" in error_of(MultiOutputNode([]), EmptyDAGError)


def test_input_never_read():
    a = Worker.bind()
    with InputNode():
        dag = a.forward.bind(1)
    message = error_of(dag, UnusedInputError)
    assert "no node of the DAG reads its InputNode" in message
    assert "at:  n0 = a.forward($0)" in message
    assert "pass `inp`" in message


def test_input_attribute_created_but_never_read():
    a = Worker.bind()
    with InputNode() as inp:
        _unused = inp.mask
        dag = a.forward.bind(inp[0])
    message = error_of(dag, UnusedInputError)
    assert "input attribute(s) inp.mask created but never read" in message
    assert "at:  n0 = input" in message


def test_nodes_from_two_input_nodes():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as first:
        x = a.forward.bind(first)
    with InputNode() as second:
        y = b.forward.bind(second[0])
    message = error_of(MultiOutputNode([x, y]), MultipleInputsError)
    assert "the DAG reads 2 different InputNodes (n0, n1)" in message
    assert "at:  n2 = a.forward(n0)\n       n4 = b.forward(n3)" in message
    assert "one `with InputNode() as inp:` block" in message


RAY_LEAVES = ("Compiled DAG doesn't support leaf nodes, i.e., nodes that don't have downstream "
              "nodes and are not output nodes. There are {n} leaf nodes in the DAG. Please add "
              "the outputs of {names} to the MultiOutputNode.")


def test_call_that_reaches_no_output():
    a, b, c = Worker.bind(), Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = a.forward.bind(inp)
        b.backward.bind(x)  # bound, then forgotten
        dag = c.forward.bind(x)
    message = error_of(dag, DAGValidationError)
    assert message.startswith(RAY_LEAVES.format(n=1, names="['backward']"))
    assert "Worker.backward(Worker.forward(...)) reads from the DAG but its result reaches no output" in message
    assert "add it to the MultiOutputNode" in message


def test_every_leaf_is_counted_and_named_as_ray_counts_them():
    a = Worker.bind()
    with InputNode() as inp:
        x = a.forward.bind(inp)
        a.backward.bind(x)  # a leaf
        a.h.bind(inp)  # another
        y = a.forward.bind(x)
        a.backward.bind(y)  # a third, reading a node that is read elsewhere too
        dag = MultiOutputNode([a.forward.bind(y)])
    message = error_of(dag, DAGValidationError)
    prefix, _, suffix = RAY_LEAVES.format(n=3, names="\0").partition("\0")
    assert message.startswith(prefix), message
    names = message[len(prefix):message.index(suffix)]
    assert sorted(ast.literal_eval(names)) == ["backward", "backward", "h"]
    assert "(and 2 more)" in message


def test_a_leaf_downstream_of_another_counts_once():
    a = Worker.bind()
    with InputNode() as inp:
        x = a.forward.bind(inp)
        a.backward.bind(a.h.bind(x))  # h is read by backward: only backward is a leaf
        dag = a.forward.bind(x)
    assert error_of(dag, DAGValidationError).startswith(RAY_LEAVES.format(n=1, names="['backward']"))


def test_the_whole_input_and_its_items_are_not_read_together():
    a, b = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        dag = MultiOutputNode([a.forward.bind(inp[0]), b.h.bind(inp)])
    message = error_of(dag, DAGValidationError)
    assert message.startswith("All tasks must either use InputNode() directly, or they must index to "
                              "specific args or kwargs.")
    assert "at:  n2 = a.h(n0)\n       n3 = b.forward(n1)" in message
    assert "pass inp[0] where you passed inp" in message


def test_nccl_on_the_input_edge():
    a = Worker.bind()
    with InputNode() as inp:
        dag = a.forward.bind(inp[0].with_tensor_transport("nccl"))
    message = error_of(dag, TransportError)
    assert "n1 = n0[0] :nccl" in message
    assert 'use transport="shm"' in message
