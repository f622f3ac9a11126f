"""The communicator-channel protocol, one edge, two threads, no Ray.

    writer thread: EdgeWriter(comm 0, side writer)  ── side channel (shm) ──►  EdgeReader(comm 1, side reader)
                                                    ── CPU communicator ───►

Each case sends a list of values and checks what the reader gets: values,
nested tensors, static shapes sent once, direct return, errors (user errors,
protocol errors), a writer that runs ahead of its reader, and device moves.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import threading
import uuid
from typing import Any

import pytest
import torch

from cgraph.channels.opener import open_endpoint
from cgraph.channels.shm_channel import ShmChannel
from cgraph.comm.cpu.mesh import CpuCommunicator, create_links
from cgraph.ir import TensorHint
from cgraph.runtime.comm_channel import EdgeReader, EdgeWriter, Encoded, decode, encode
from cgraph.runtime.error_value import ErrorValue


@dataclasses.dataclass
class Pair:
    left: Any
    right: Any


def origin(exc: Exception) -> ErrorValue:
    return ErrorValue.capture(exc, actor="a (W)", method="f", execution_index=0)


def transfer(values: list[Any], hint: TensorHint | None, *, ahead: bool = False) -> tuple[list[Any], list[int]]:
    """Send ``values`` over one edge; returns what the reader got and its side items read."""
    tag = uuid.uuid4().hex[:8]
    links, ends = create_links(tag, "g", 2)
    side = ShmChannel.create(tag, "side", num_readers=1, max_inflight=len(values) + 1, buffer_size=256)
    comms = [CpuCommunicator(e) for e in ends]
    writer = EdgeWriter(comms[0], 1, open_endpoint(side.writer_handle()), hint, "n1")
    reader = EdgeReader(comms[1], 0, open_endpoint(side.reader_handle(0)), hint, "n1")
    got: list[Any] = []
    reads = SpyReads(reader)
    done = threading.Event()

    def write_all() -> None:
        for value in values:
            writer.send(encode(value, node="n1", direct_return=bool(hint and hint.direct_return), origin=origin),
                        origin)
        done.set()

    thread = threading.Thread(target=write_all, daemon=True)
    thread.start()
    if ahead:
        done.wait(0.5)  # the writer runs ahead as far as the link slots let it
    try:
        for _ in values:
            got.append(reader.recv()[0])
    finally:
        thread.join(10)
        for ch in (*links, side):
            ch.close()
            ch.unlink()
    return got, reads.counts


class SpyReads:
    """Counts side-channel reads per value (blocking reads and polls)."""

    def __init__(self, reader: EdgeReader) -> None:
        self.counts: list[int] = []
        inner = reader.side
        spy = self

        class Side:
            def read(self, timeout: float | None = None) -> Any:
                spy.counts.append(timeout is None)
                return inner.read(timeout)

            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

        reader.side = Side()


@pytest.fixture(autouse=True)
def no_segments_left():  # type: ignore[no-untyped-def]
    """Every test here removes the shared-memory segments it made."""
    before = set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*"))
    yield
    assert set(glob.glob(f"/dev/shm/cgraph_{os.getpid()}_*")) - before == set()


def test_tensors_nested_anywhere_come_back_in_place() -> None:
    value = {
        "w": torch.arange(6.0).reshape(2, 3),
        "rest": [torch.tensor([1, 2], dtype=torch.int32), "text", (torch.ones(1, dtype=torch.bfloat16),)],
        "pair": Pair(torch.zeros(2, 2), 7),
        "n": 3,
    }
    (got,), reads = transfer([value], TensorHint("nccl"))
    assert got["n"] == 3 and got["rest"][1] == "text" and got["pair"].right == 7
    assert torch.equal(got["w"], value["w"])
    assert got["rest"][0].dtype == torch.int32 and got["rest"][0].tolist() == [1, 2]
    assert got["rest"][2][0].dtype == torch.bfloat16
    assert isinstance(got["pair"], Pair) and torch.equal(got["pair"].left, torch.zeros(2, 2))
    assert reads == [True]


def test_static_shape_sends_specs_once_and_names_a_change() -> None:
    values = [{"t": torch.full((2,), float(i))} for i in range(3)] + [{"t": torch.zeros(3)}, {"t": torch.ones(2)}]
    got, reads = transfer(values, TensorHint("nccl", static_shape=True))
    assert [g["t"].tolist() for g in got[:3]] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert isinstance(got[3], ErrorValue)
    assert "node n1 was declared _static_shape=True, but its tensors changed" in got[3].message
    assert "first execution sent [(2,) float32], execution 3 sent [(3,) float32]" in got[3].message
    assert got[4]["t"].tolist() == [1.0, 1.0]  # the edge keeps working
    assert reads == [True] * 5  # the structure still travels (not _direct_return)


def test_direct_return_checks_the_value_is_one_tensor() -> None:
    got, _ = transfer([torch.ones(2), [torch.ones(2)], torch.zeros(4)], TensorHint("nccl", direct_return=True))
    assert got[0].tolist() == [1.0, 1.0] and got[2].tolist() == [0.0] * 4
    assert isinstance(got[1], ErrorValue)
    assert "must return exactly one torch.Tensor, but it returned list" in got[1].message


@pytest.mark.parametrize("ahead", [False, True])
def test_static_direct_sends_nothing_but_the_tensor_and_still_carries_errors(ahead: bool) -> None:
    hint = TensorHint("nccl", static_shape=True, direct_return=True)
    err = origin(ValueError("boom"))
    values = [err, torch.ones(2), torch.full((2,), 2.0), err, torch.full((2,), 3.0), "oops", torch.zeros(5), err]
    got, reads = transfer(values, hint, ahead=ahead)
    assert isinstance(got[0], ErrorValue) and got[0].message == "ValueError: boom"
    assert got[1].tolist() == [1.0, 1.0] and got[2].tolist() == [2.0, 2.0]
    assert isinstance(got[3], ErrorValue) and got[3].message == "ValueError: boom"
    assert got[4].tolist() == [3.0, 3.0]
    assert "returned str" in got[5].message
    assert "but its tensors changed" in got[6].message and isinstance(got[7], ErrorValue)
    # blocking side reads until the shape is known (values 0 and 1), then only polls
    assert reads[:2] == [True, True] and not any(reads[2:])


def test_device_cpu_and_an_unavailable_gpu() -> None:
    got, _ = transfer([[torch.ones(2)]], TensorHint("nccl", device="cpu"))
    assert got[0][0].device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(Exception, match="asks for device='cuda', but this actor has no GPU"):
            transfer([torch.ones(2)], TensorHint("nccl", device="cuda"))


def test_encode_reports_values_that_cannot_be_sent() -> None:
    item = encode({"lock": threading.Lock()}, node="n4", direct_return=False, origin=origin)
    assert isinstance(item, ErrorValue) and "the value of node n4 cannot be sent" in item.message
    plain = encode(torch.ones(2), node="n4", direct_return=True, origin=origin)
    assert isinstance(plain, Encoded) and plain.structure is None and plain.specs == (((2,), torch.float32),)
    assert decode(None, ["t"]) == "t"


def test_views_send_their_values_and_layouts_without_bytes_are_refused() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j])
    (got,), _ = transfer([[z.conj(), torch.ones(2)._neg_view()]], TensorHint("nccl"))
    assert got[0].tolist() == [1 - 2j, 3 + 1j] and got[1].tolist() == [-1.0, -1.0]
    for bad, kind in [
        (torch.ones(2, 2).to_sparse(), "sparse_coo"),
        (torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8), "quantized"),
        (torch.empty(2, device="meta"), "meta"),
    ]:
        item = encode({"t": bad}, node="n2", direct_return=False, origin=origin)
        assert isinstance(item, ErrorValue) and f"holds a {kind} tensor" in item.message, item


def test_one_tensor_twice_arrives_once_and_stays_shared() -> None:
    t = torch.ones(3)
    item = encode([t, {"again": t}], node="n1", direct_return=False, origin=origin)
    assert isinstance(item, Encoded) and len(item.tensors) == 1
    (got,), _ = transfer([[t, {"again": t}]], TensorHint("nccl"))
    assert got[0] is got[1]["again"]
