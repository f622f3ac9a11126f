"""Random DAGs for the fault soak (``fault_soak.py``): a spec, its Ray DAG, its values.

    spec (plain data)          build(spec, actors)            expected(spec, inputs)
    n0 = w1.mix(inp)           InputNode / MultiOutputNode    the same ``mix`` run here,
    n1 = w0.mix(n0)            over SoakWorker.mix binds      one list of outputs per
    n2 = w2.mix(n0, n1, 7)     ──► cgraph.compile            execution (or FAILED)
    outputs: [n1, n2]

Every node calls ``SoakWorker.mix(gid, node, kind, salt, size, *sources)``: it folds
its sources into one integer (``digest``) and returns a value of its ``kind`` (an
int, a dict, a tuple, a small or a large numpy array), so the driver recomputes
every output exactly; ``pass`` and ``wrap`` nodes return their first source as it came
(alone or in a tuple): pass-through stages, which cgraph forwards without a copy where
it can. Nodes draw chains, fan-out and fan-in over 2-5 actors, several
nodes per actor now and then (in-process edges), the input whole or as ``inp[0]`` /
``inp[1]``, constants. A worker can be *armed* (``arm``) to raise or sleep in one
node's k-th call: the user-exception and slow-consumer faults.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

KINDS = ("int", "dict", "tuple", "array", "array", "pass", "wrap", "big")
TENSOR = "tensor"  # a torch tensor on a communicator edge (``with_tensor_transport("nccl")``)
PASS_KINDS = ("pass", "wrap")  # return their first source as is (wrap: inside a tuple)
MOD = 1_000_003
FAILED = "FAILED"  # an execution whose outputs all raise the armed ValueError


class SoakFault(ValueError):
    """What an armed node raises (a user exception)."""


def digest(value: Any) -> int:
    """One integer for any value ``mix`` makes or the driver passes in."""
    if type(value).__module__ == "torch":
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return int(value.astype(np.int64).sum()) % MOD
    if isinstance(value, dict):
        return int(value["v"])
    if isinstance(value, (tuple, list)):
        return digest(value[0])
    return int(value) % MOD


def mix(kind: str, salt: int, size: int, *sources: Any) -> Any:
    """The value of a node: ``kind`` made from the sources' digests (deterministic)."""
    s = (3 * sum(digest(x) for x in sources) + salt) % MOD
    if kind == "pass":  # a pass-through stage: cgraph may forward what it read (zero-copy)
        return sources[0]
    if kind == "wrap":
        return (sources[0], s)
    if kind == "int":
        return s
    if kind == "dict":
        return {"v": s, "name": f"n{salt}", "tags": [s % 7, "x" * (s % 5)]}
    if kind == "tuple":
        return (s, float(s) / 4, "t" * (s % 9))
    dtype = np.float64 if s % 2 else np.int64  # float64 of small integers: exact
    array = (np.arange(size, dtype=np.int64) % 97 + s).astype(dtype)
    if kind == TENSOR:
        import torch

        return torch.from_numpy(array)
    return array


@ray.remote(num_cpus=0)
class SoakWorker:
    """An actor of the soak's DAGs: ``mix`` nodes, armed faults, its pid."""

    def __init__(self) -> None:
        self.calls: dict[tuple[int, int], int] = {}
        self.armed: dict[tuple[int, int], tuple[str, int, float]] = {}

    def getpid(self) -> int:
        return os.getpid()

    def arm(self, gid: int, node: int, what: str, at_call: int, seconds: float = 0.0) -> None:
        """Make node ``node`` of graph ``gid`` raise (``what="raise"``) or sleep
        ``seconds`` (``"sleep"``) in its ``at_call``-th call (from 0)."""
        self.armed[(gid, node)] = (what, at_call, seconds)

    def mix(self, gid: int, node: int, kind: str, salt: int, size: int, *sources: Any) -> Any:
        key = (gid, node)
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        armed = self.armed.get(key)
        if armed is not None and armed[1] == call:
            if armed[0] == "raise":
                raise SoakFault(f"soak: node n{node} raises in call {call}")
            time.sleep(armed[2])
        return mix(kind, salt, size, *sources)


# ------------------------------------------------------------------ the spec
@dataclass(frozen=True)
class NodeSpec:
    index: int
    actor: int
    kind: str
    salt: int
    size: int  # elements of an array value
    sources: tuple[tuple[str, Any], ...]  # ("inp", None|0|1), ("node", j), ("const", c)


@dataclass(frozen=True)
class DagSpec:
    gid: int
    n_actors: int
    nodes: tuple[NodeSpec, ...]
    outputs: tuple[tuple[str, Any], ...]  # ("node", j) or ("inp", None|0|1)
    multi: bool  # a MultiOutputNode (else the one output is the root)
    arity: int  # execute(x) (1) or execute(x, arr) (2)

    def text(self) -> str:
        """``n2=w1.big(n0,n1,c5) ... -> [n2, inp]``: one line, for logs and results."""
        def src(s: tuple[str, Any]) -> str:
            return {"inp": lambda k: "inp" if k is None else f"inp[{k}]",
                    "node": lambda j: f"n{j}", "const": lambda c: f"c{c}"}[s[0]](s[1])
        body = " ".join(f"n{n.index}=w{n.actor}.{n.kind}({','.join(map(src, n.sources))})"
                        for n in self.nodes)
        outs = ", ".join(map(src, self.outputs))
        return f"{body} -> {'[' + outs + ']' if self.multi else outs}"


def random_dag(rng: random.Random, gid: int, n_actors: int, big: bool = True,
               tensors: bool = False) -> DagSpec:
    """A random DAG over ``n_actors`` actors, each used by at least one node; with
    ``tensors``, some nodes make torch tensors that move over the graph's communicator."""
    arity = rng.choice((1, 1, 2))
    inputs = [("inp", None)] if arity == 1 else [("inp", 0), ("inp", 1)]
    count = rng.randint(n_actors, min(2 * n_actors + 1, 9))
    owners = list(range(n_actors)) + [rng.randrange(n_actors) for _ in range(count - n_actors)]
    rng.shuffle(owners)
    nodes: list[NodeSpec] = []
    for i, actor in enumerate(owners):
        shape = rng.choice(("chain", "chain", "fan-in", "fan-out", "input"))
        if i == 0 or shape == "input":
            sources = [rng.choice(inputs)]
        elif shape == "chain":
            sources = [("node", i - 1)]
        elif shape == "fan-out":  # several nodes read one early node
            sources = [("node", rng.randrange(max(1, i // 2)))]
        else:
            picks = rng.sample(range(i), min(i, rng.randint(2, 3)))
            sources = [("node", j) for j in picks]
        if rng.random() < 0.3:
            sources.append(("const", rng.randint(-5, 5)))
        if rng.random() < 0.15:
            sources.append(rng.choice(inputs))
        kind = rng.choice(KINDS if big else KINDS[:-1])
        if tensors and rng.random() < 0.3:
            kind = TENSOR
        if kind in PASS_KINDS and i and rng.random() < 0.7:  # mostly what an earlier node made
            sources[0] = ("node", rng.randrange(i))
        size = rng.randint(100_000, 400_000) if kind == "big" else rng.randint(1, 64)
        nodes.append(NodeSpec(i, actor, kind, rng.randint(0, 999), size, tuple(sources)))
    used = {k for n in nodes for kind, k in n.sources if kind == "inp"}
    arity = 1 if None in used else max(used) + 1  # execute() takes exactly what the DAG reads
    read = {j for n in nodes for kind, j in n.sources if kind == "node"}
    sinks = [("node", n.index) for n in nodes if n.index not in read]
    extra = [("node", rng.randrange(count)) for _ in range(rng.randint(0, 1))]
    outputs = sinks + [e for e in extra if e not in sinks]
    if rng.random() < 0.1:
        outputs.append(rng.choice([("inp", k) for k in sorted(used, key=str)]))
    multi = len(outputs) > 1 or rng.random() < 0.3
    return DagSpec(gid, n_actors, tuple(nodes), tuple(outputs), multi, arity)


def crossing_tensors(spec: DagSpec) -> list[int]:
    """The tensor nodes that another actor reads: their values go through the communicator."""
    return [n.index for n in spec.nodes if n.kind == TENSOR
            and any(("node", n.index) in m.sources and m.actor != n.actor for m in spec.nodes)]


def actors_used(spec: DagSpec) -> set[int]:
    """The actors that run a node the outputs depend on (all of them, by construction)."""
    return {n.actor for n in spec.nodes}


def build(spec: DagSpec, actors: list[Any]) -> Any:
    """The Ray DAG of ``spec`` over ``actors`` (Ray's InputNode and MultiOutputNode)."""
    from ray.dag import InputNode, MultiOutputNode

    with InputNode() as inp:
        made: list[Any] = []

        def source(s: tuple[str, Any]) -> Any:
            kind, what = s
            if kind == "inp":
                return inp if what is None else inp[what]
            return made[what] if kind == "node" else what

        for n in spec.nodes:
            method = actors[n.actor].mix
            node = method.bind(spec.gid, n.index, n.kind, n.salt, n.size, *(source(s) for s in n.sources))
            made.append(node.with_tensor_transport("nccl") if n.kind == TENSOR else node)
        outs = [source(s) for s in spec.outputs]
        return MultiOutputNode(outs) if spec.multi else outs[0]


def make_input(spec: DagSpec, execution: int, trial: int) -> tuple[Any, ...]:
    """The arguments of one execution (distinct per execution)."""
    x = 1000 * trial + 17 * execution + 1
    if spec.arity == 1:
        return (x,)
    return (x, np.arange(execution % 5 + 3, dtype=np.int64) * x)


def expected(spec: DagSpec, args: tuple[Any, ...], fails: set[int] = frozenset()) -> Any:
    """The outputs of one execution; ``FAILED`` when a node in ``fails`` raises in it."""
    values, bad, source = node_values(spec, args, fails)
    if any(bad[j] for kind, j in spec.outputs if kind == "node"):
        return FAILED
    outs = [source(s) for s in spec.outputs]
    return outs if spec.multi else outs[0]


def node_values(spec: DagSpec, args: tuple[Any, ...], fails: set[int] = frozenset()) -> tuple[Any, ...]:
    """Every node's value in one execution (None where it or an upstream node raises),
    which nodes raise, and how a source reads."""
    values: list[Any] = []
    bad: list[bool] = []

    def source(s: tuple[str, Any]) -> Any:
        kind, what = s
        if kind == "inp":
            return args[0] if what is None else args[what]
        return values[what] if kind == "node" else what

    for n in spec.nodes:
        upstream = any(bad[j] for kind, j in n.sources if kind == "node")
        bad.append(upstream or n.index in fails)
        values.append(None if bad[-1] else mix(n.kind, n.salt, n.size, *map(source, n.sources)))
    return values, bad, source


def same(got: Any, want: Any) -> bool:
    """Equal values, arrays and tensors compared by dtype, shape and content."""
    if type(want).__module__ == "torch":
        return type(got) is type(want) and same(got.numpy(), want.numpy())
    if isinstance(want, np.ndarray):
        return (isinstance(got, np.ndarray) and got.dtype == want.dtype
                and got.shape == want.shape and bool(np.array_equal(got, want)))
    if isinstance(want, (list, tuple)):
        return (type(got) is type(want) and len(got) == len(want)
                and all(same(g, w) for g, w in zip(got, want, strict=True)))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(
            same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want
