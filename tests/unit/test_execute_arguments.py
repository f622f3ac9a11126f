"""execute()'s arguments checked against how the DAG reads its InputNode, as Ray checks them.

Ray Compiled Graphs counts the positional arguments exactly (the whole input: one; inp[i]:
the highest index plus one; only keywords: none) and needs every inp.key; its sentence
("dag.execute() or dag.execute_async() must be called with ...") leads cgraph's message.
"""

from __future__ import annotations

import pytest

from cgraph.errors import ExecuteArgumentError
from cgraph.runtime.compiled_graph import InputUsage

RAY = "dag.execute() or dag.execute_async() must be called with"


def usage(whole: bool = False, positions: tuple[int, ...] = (), keys: tuple[str, ...] = ()) -> InputUsage:
    return InputUsage(whole, frozenset(positions), frozenset(keys))


def message(use: InputUsage, *args: object, **kwargs: object) -> str:
    with pytest.raises(ExecuteArgumentError) as info:
        use.check(args, kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    return str(info.value)


def test_items_need_exactly_the_positional_arguments_read():
    use = usage(positions=(0, 2))
    use.check((1, 2, 3), {})
    assert message(use, 1, 2).startswith(f"{RAY} 3 positional args, got 2: this graph reads inp[2]")
    assert message(use, 1, 2, 3, 4).startswith(f"{RAY} 3 positional args, got 4")
    assert message(use, args=(1, 2, 3)).startswith(f"{RAY} 3 positional args, got 0")


def test_the_whole_input_is_one_positional_argument():
    use = usage(whole=True)
    use.check(((2, 3),), {})
    assert message(use).startswith(f"{RAY} 1 positional args, got 0: this graph passes the InputNode itself")
    assert message(use, 2, 3).startswith(f"{RAY} 1 positional args, got 2")
    assert message(use, 2, x=1).startswith(f"{RAY} 1 positional args and no keyword arguments, got x")


def test_keywords_only_take_no_positional_argument_and_every_key():
    use = usage(keys=("x", "y"))
    use.check((), {"x": 1, "y": 2, "unused": 3})  # as in Ray, a keyword nothing reads is ignored
    assert message(use, 1, x=1, y=2).startswith(f"{RAY} 0 positional args, got 1: this graph reads "
                                                "no positional argument (only inp.x")
    assert message(use, y=3).startswith(f"{RAY} kwarg `x`: this graph reads inp.x; got keyword arguments ['y']")
    assert message(use, x=3) == f"{RAY} kwarg `y`: this graph reads inp.y; got keyword arguments ['x']"
    assert message(use).startswith(f"{RAY} kwarg `x`")
