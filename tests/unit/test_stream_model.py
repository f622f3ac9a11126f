"""The GPU path's logic on the CPU: ``comm_ops`` over a communicator whose stream is a
``stream_model.Stream`` (CUDA's stream semantics, modelled), in the thread harness.

``ModelCommunicator`` behaves as NCCL does where it matters here: ``send`` and
``recv`` queue their copies on the communicator's stream and return before the
data moves (each item is held back ``DELAY_S``); a receive buffer holds NaN until
its copy lands. So a consumer that does not wait for a receive's event reads NaN,
and a producer that updates a tensor before its send completed sends a torn one.
"""

from __future__ import annotations

import random
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgraph.comm import stream_model
from cgraph.comm.communicator import Communicator
from cgraph.comm.streams import InlineStreams, ModelStreams, streams_of
from cgraph.errors import ChannelClosedError
from cgraph.runtime.comm_ops import CommState
from tests.fabric import LocalTransport
from tests.unit.test_comm_ops import SEED, SEND_THEN_BUMP, Harness, normalise

DELAY_S = 0.002


class ModelCommunicator(Communicator):
    """A user communicator with a modelled stream; members meet on an in-memory board."""

    boards: dict[str, list[LocalTransport]] = {}
    lock = threading.Lock()

    def initialize(self, rank: int, world_size: int, group_name: str) -> None:
        with self.lock:
            board = self.boards.setdefault(group_name, LocalTransport.create(world_size))
        self.ep = board[rank]
        self._stream = stream_model.Stream(f"model-{group_name}-{rank}", delay_s=DELAY_S)

    rank = property(lambda self: self.ep.rank)  # type: ignore[assignment]
    world_size = property(lambda self: self.ep.world_size)  # type: ignore[assignment]
    stream = property(lambda self: self._stream)  # type: ignore[assignment]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._stream.enqueue(lambda: self.ep.send(np.ascontiguousarray(tensor.numpy()).copy(), dst))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        tensor.fill_(float("nan"))  # what the buffer holds until the copy lands
        self._stream.enqueue(lambda: self.ep.recv(tensor.numpy(), src))

    def synchronize(self) -> None:
        self._stream.synchronize()

    def abort(self) -> None:
        self.ep.abort("aborted by cgraph")

    def destroy(self) -> None:
        self._stream.close()


def model(text: str) -> str:
    return text.replace(":nccl", ":custom:Model")


def harness(text: str, overlap: bool) -> Harness:
    return Harness(model(text), overlap=overlap, communicators={"custom:Model": ModelCommunicator()}, default=None)


# --------------------------------------------------------------------------- the model itself
def test_a_stream_runs_later_and_in_order_and_events_mark_its_progress() -> None:
    stream, seen = stream_model.Stream(delay_s=0.01), []
    first, second = stream_model.Event(), stream_model.Event()
    assert first.query()  # never recorded: complete
    stream.enqueue(lambda: seen.append(1))
    first.record(stream)
    stream.enqueue(lambda: seen.append(2))
    second.record(stream)
    assert seen == [] and not first.query()  # queued, not run: the caller went on
    first.synchronize()
    assert seen[0] == 1
    second.synchronize()
    assert seen == [1, 2]
    stream.close()


def test_a_stream_waits_for_another_streams_event_and_errors_surface_at_sync() -> None:
    slow, fast, seen = stream_model.Stream(delay_s=0.05), stream_model.Stream(), []
    event = stream_model.Event()
    slow.enqueue(lambda: seen.append("slow"))
    event.record(slow)
    fast.wait_event(event)
    fast.enqueue(lambda: seen.append("fast"))
    fast.synchronize()
    assert seen == ["slow", "fast"]

    def fail() -> None:
        raise RuntimeError("an asynchronous failure")

    fast.enqueue(fail)
    with pytest.raises(RuntimeError, match="asynchronous failure"):
        fast.synchronize()
    for s in (slow, fast):
        s.close()


def test_the_engine_follows_the_communicators_stream() -> None:
    comm = ModelCommunicator()
    comm.initialize(0, 1, f"solo-{time.monotonic_ns()}")
    assert isinstance(streams_of(comm), ModelStreams)
    assert isinstance(streams_of(SimpleNamespace(stream=None)), InlineStreams)
    comm.destroy()


# --------------------------------------------------------------------------- comm_ops under the model
@pytest.mark.parametrize("overlap", [False, True])
def test_seed_under_the_model_same_results_with_and_without_overlap(overlap: bool) -> None:
    with Harness(SEED) as h:  # the CPU communicator, no stream: the reference
        want = [normalise(r) for r in h.run(1, 2, -3, 4)]
    with harness(SEED, overlap) as h:
        rows = [normalise(r) for r in h.run(1, 2, -3, 4)]
    assert rows == want
    assert rows[2][2] == "ValueError: negative -3"


def test_a_missing_wait_is_caught_the_results_are_poisoned(monkeypatch) -> None:
    """Drop the wait for a receive's event: the consumer reads the buffer before the copy."""
    monkeypatch.setattr(ModelStreams, "join", lambda self, value, tensors, done: value)
    with harness(SEED, True) as h:
        rows = [normalise(r) for r in h.run(1, 2, 3, 4)]
    assert any(isinstance(v, float) and v != v for row in rows for v in row[:2]), rows


def test_a_sent_tensor_is_not_written_before_its_send_completed() -> None:
    with harness(SEND_THEN_BUMP, True) as h:
        rows = [row for start in (0, 4) for row in h.run(*range(start, start + 4))]
    assert [row[0] for row in rows] == [[float(x), float(x)] for x in range(8)]


def test_without_the_fence_the_model_shows_the_race(monkeypatch) -> None:
    monkeypatch.setattr(CommState, "fence", lambda self: self.sends.clear())
    with harness(SEND_THEN_BUMP, True) as h:
        rows = h.run(0, 1, 2, 3)
    assert any(row[0] != [float(x), float(x)] for x, row in enumerate(rows)), rows


def random_graph(rng: random.Random) -> tuple[str, int]:
    """A random DAG over 2-4 actors: tensors made from the input, doubled along random
    actors over communicator edges (or shared memory), summed at the outputs."""
    actors = "abcd"[: rng.randint(2, 4)]
    lines = [f"actor {a} = W(gpus=0)" for a in actors] + ["n0 = input"]
    values, n = [], 0
    for _ in range(rng.randint(1, 3)):
        n += 1
        lines.append(f"n{n} = {rng.choice(actors)}.make(n0) :nccl")
        values.append(n)
    for _ in range(rng.randint(1, 5)):
        n += 1
        hint = " :nccl" if rng.random() < 0.8 else ""
        lines.append(f"n{n} = {rng.choice(actors)}.double(n{rng.choice(values)}){hint}")
        values.append(n)
    outputs = []
    for v in rng.sample(values, min(len(values), rng.randint(1, 3))):
        n += 1
        lines.append(f"n{n} = {rng.choice(actors)}.total(n{v})")
        outputs.append(f"n{n}")
    lines.append(f"return [{', '.join(outputs)}]")
    return "\n".join(lines), len(outputs)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_random_graphs_under_the_model_same_results_with_and_without_overlap(rng: random.Random) -> None:
    text, _ = random_graph(rng)
    runs = []
    for overlap in (False, True):
        with harness(text, overlap) as h:
            runs.append([normalise(r) for r in h.run(1, 2, 3)])
    assert runs[0] == runs[1], text
    assert all(v == v for row in runs[0] for v in row), text  # nothing poisoned


def test_waiting_on_a_closed_streams_event_raises_instead_of_hanging() -> None:
    stream, event = stream_model.Stream(delay_s=0.2), stream_model.Event()
    stream.enqueue(lambda: None)
    event.record(stream)
    stream.close()  # what destroying the communicator does, at teardown
    with pytest.raises(ChannelClosedError, match="closed before this event completed"):
        event.synchronize()
