"""Random DAGs over shared ``Calc`` actors, and the same DAG run by plain Ray calls."""

from __future__ import annotations

import ray
from hypothesis import strategies as st
from ray.dag import InputNode, MultiOutputNode


@ray.remote(num_cpus=0)
class Calc:
    def __init__(self, k: int) -> None:
        self.k = k

    def lin(self, *xs: int, c: int = 0) -> int:
        return sum(xs) * self.k + c

    def pair(self, x: int) -> tuple[int, int]:
        return x + self.k, x - self.k


@st.composite
def dag_specs(draw):
    """A list of steps (actor, kind, arg sources) and the chosen outputs."""
    n_actors = draw(st.integers(2, 4))
    n_nodes = draw(st.integers(1, 7))
    steps = []
    for i in range(n_nodes):
        actor = draw(st.integers(0, n_actors - 1))
        kind = draw(st.sampled_from(["lin", "lin", "pair"]))
        sources = st.one_of(
            st.just(("inp", 0)),
            st.just(("inp", 1)),
            st.just(("inp", "k")),
            st.integers(-3, 3).map(lambda c: ("const", c)),
            *([st.integers(0, i - 1).map(lambda j: ("node", j))] if i else []),
        )
        n_args = 1 if kind == "pair" else draw(st.integers(1, 3))
        args = [("inp", 0)] if i == 0 else draw(st.lists(sources, min_size=n_args, max_size=n_args))
        steps.append((actor, kind, args, draw(st.integers(-2, 2))))
    extra = draw(st.lists(st.integers(0, n_nodes - 1), max_size=2))
    return steps, extra


def interpret(spec, calcs, input_value, call):
    """Walk ``spec`` once: ``input_value(key)`` gives ``inp[key]``/``inp.key``,
    ``call(method, *args, **kwargs)`` makes one node (bind) or ref (remote).
    Returns the outputs, in order."""
    steps, extra = spec
    made, used, second = [], set(), []
    for actor, kind, sources, c in steps:
        values = []
        for src, what in sources:
            if src == "inp":
                values.append(input_value(what))
            elif src == "const":
                values.append(what)
            else:
                values.append(made[what])
                used.add(what)
        if kind == "pair":
            lo, hi = call(calcs[actor].pair.options(num_returns=2), values[0])
            made.append(lo)
            second.append(hi)  # an output: as in Ray, every return value is read or an output
        else:
            made.append(call(calcs[actor].lin, *values, c=c))
    outs = [i for i in range(len(made)) if i not in used] + extra
    return [made[i] for i in dict.fromkeys(outs)] + second


def build(spec, calcs):
    with InputNode() as inp:
        outputs = interpret(
            spec,
            calcs,
            lambda key: inp[key] if isinstance(key, int) else getattr(inp, key),
            lambda method, *a, **k: method.bind(*a, **k),
        )
        return MultiOutputNode(outputs)


def plain_ray(spec, calcs, args, kwargs):
    """The same DAG as ordinary actor calls, refs passed between them."""
    refs = interpret(
        spec,
        calcs,
        lambda key: args[key] if isinstance(key, int) else kwargs[key],
        lambda method, *a, **k: method.remote(*a, **k),
    )
    return ray.get(refs)


def positional_count(spec) -> int:
    """How many positional arguments ``execute()`` takes for ``spec`` (as in Ray: exactly
    the ones the DAG reads)."""
    used = [key for _, _, args, _ in spec[0] for src, key in args if src == "inp"]
    return max((k for k in used if isinstance(k, int)), default=1) + 1
