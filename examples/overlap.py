"""Ray's overlap example (seed 002) on cgraph: three senders, one receiver, tensor edges.

    driver ─i─► sender k: send(shape, dtype, i) = ones(shape) * i ──tensor──► receiver:
                                                                   recv_and_matmul(t) (x3)

Compiled three times, without and with ``overlap_gpu_communication`` and with
``"auto"``: with overlap, the receiver posts its three receives first, on its
communication stream/thread, so the second and third tensors arrive while it
multiplies the first; "auto" measures its first executions and runs the schedule
predicted faster on them (timed after it chose). The script prints the three
durations, the speed-up, what "auto" chose and why, then one recorded pass of each
mode: per actor its busy, compute and comm time and how much comm overlapped
compute, an execution's critical path, and what the schedule simulator predicts
for the same op durations without and with overlap, with comm on its own engine
(a GPU's copy engines) and sharing the actor's cores (this CPU machine). It
writes each pass's timeline (Chrome trace JSON and a Gantt PNG) next to the
schedule pictures, which ``CGRAPH_VISUALIZE_SCHEDULE=1`` writes (ops moved by
the overlap pass in red).

- Several GPUs: one actor per GPU, NCCL between them (as in Ray's example).
- One GPU: the four actors share it (num_gpus=0.25), so the edges use CUDA
  IPC (NCCL cannot join two ranks on one GPU); the hint is "auto".
- No GPU: CPU tensors, "nccl" hints served by the CPU communicator
  (``default_communicator="cpu"``), shapes scaled down to run in seconds.

Run: ``python examples/overlap.py [--iters N] [--size N]`` (``make run``).
It starts its own local Ray instance and shuts it down.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import ray  # noqa: E402
import torch  # noqa: E402

from cgraph import InputNode, MultiOutputNode, TorchTensorType  # noqa: E402

NUM_SENDERS = 3


class TorchTensorWorker:
    def __init__(self) -> None:
        on_gpu = torch.cuda.is_available() and bool(ray.get_gpu_ids())
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    def send(self, shape: tuple[int, ...], dtype: torch.dtype, value: int) -> torch.Tensor:
        return torch.ones(shape, dtype=dtype, device=self.device) * value

    def recv_and_matmul(
        self, two_d_tensor: torch.Tensor, side: int | None = None
    ) -> tuple[float, tuple[int, ...], torch.dtype]:
        """Receive the tensor and do some expensive computation (matmul).

        ``side`` limits the matmul to the leading ``side`` x ``side`` block: on a
        CPU a full matmul (n^3) dwarfs the transfer (n^2), leaving nothing to overlap.
        """
        assert two_d_tensor.dim() == 2
        assert two_d_tensor.size(0) == two_d_tensor.size(1)
        assert two_d_tensor.device == self.device
        block = two_d_tensor if side is None else two_d_tensor[:side, :side]
        torch.matmul(block, block)
        return (two_d_tensor[0][0].item(), tuple(two_d_tensor.shape), two_d_tensor.dtype)


def setup(gpus: int) -> tuple[dict, str, dict]:
    """Actor options, the edges' transport, and compile options for this machine."""
    if gpus >= NUM_SENDERS + 1:
        return {"num_cpus": 0, "num_gpus": 1}, "nccl", {}
    if gpus >= 1:
        return {"num_cpus": 0, "num_gpus": 1 / (NUM_SENDERS + 1)}, "auto", {}
    return {"num_cpus": 0}, "nccl", {"_default_communicator": "cpu"}


def make_actors(gpus: int) -> tuple[list, object, str, dict]:
    actor_options, transport, compile_options = setup(gpus)
    worker = ray.remote(**actor_options)(TorchTensorWorker)
    senders = [worker.remote() for _ in range(NUM_SENDERS)]
    return senders, worker.remote(), transport, compile_options


MODES: tuple[bool | str, ...] = (False, True, "auto")


def run(overlap: bool | str, actors: tuple, shape: tuple[int, int], dtype: torch.dtype, iters: int,
        side: int | None = None) -> tuple[float, object]:
    """Compile the DAG over ``actors``, run ``iters`` timed executions, tear down; returns
    seconds, and with ``overlap="auto"`` what it chose (timed after it chose)."""
    senders, receiver, transport, compile_options = actors
    with InputNode() as inp:
        branches = [sender.send.bind(shape, dtype, inp) for sender in senders]
        branches = [
            branch.with_type_hint(TorchTensorType(transport=transport, _static_shape=True, _direct_return=True))
            for branch in branches
        ]
        dag = MultiOutputNode([receiver.recv_and_matmul.bind(branch, side) for branch in branches])
    compiled = dag.experimental_compile(_overlap_gpu_communication=overlap, **compile_options)
    try:
        # warm up: communicators connect, buffers grow; "auto" records and decides
        warm = compiled.options.auto_executions + 1 if overlap == "auto" else 2
        for i in range(warm):
            ray.get(compiled.execute(i))
        start = time.monotonic()
        for i in range(iters):
            result = ray.get(compiled.execute(i))
            assert result == [(i, shape, dtype)] * NUM_SENDERS, result
        return time.monotonic() - start, compiled.overlap_decision
    finally:
        compiled.teardown()


def explain(actors: tuple, shape: tuple[int, int], dtype: torch.dtype, side: int | None) -> None:
    """One recorded pass per mode (compiled with ``timeline=True``): where the time went,
    and what the schedule simulator predicts for the same schedule with and without overlap."""
    import cgraph

    senders, receiver, transport, compile_options = actors
    options = {name.lstrip("_"): value for name, value in compile_options.items()}
    folder = Path(os.environ.get("CGRAPH_VISUALIZE_DIR") or Path.cwd() / "cgraph-schedules")
    folder.mkdir(parents=True, exist_ok=True)
    for overlap in (False, True):
        with InputNode() as inp:
            branches = [sender.send.bind(shape, dtype, inp).with_type_hint(
                TorchTensorType(transport=transport, _static_shape=True, _direct_return=True)) for sender in senders]
            dag = MultiOutputNode([receiver.recv_and_matmul.bind(branch, side) for branch in branches])
        compiled = cgraph.compile(dag, overlap_gpu_communication=overlap, timeline=True, **options)
        try:
            for i in range(5):
                ray.get(compiled.execute(i))
            name = f"timeline-overlap-{str(overlap).lower()}"
            trace = compiled.timeline(folder / f"{name}.json")
            picture = compiled.timeline(folder / f"{name}.png", executions=2)
            summary = compiled.timeline_summary()
        finally:
            compiled.teardown()
        print(f"\nrecorded, overlap_gpu_communication={overlap} (trace: {trace}, picture: {picture})")
        print(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=None, help="timed executions per mode")
    parser.add_argument("--size", type=int, default=None, help="side of the square tensors")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both modes; the best counts")
    parser.add_argument("--matmul-side", type=int, default=None,
                        help="matmul only the leading block of this side (CPU default 768)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    if gpus:
        size, dtype, iters = args.size or 10_000, torch.float16, args.iters or 5
        side = args.matmul_side
        ray.init(address="local", num_cpus=NUM_SENDERS + 2, num_gpus=gpus if gpus > NUM_SENDERS else 1, include_dashboard=False)
    else:
        # balanced on 2 CPU cores: ~16 MiB per transfer against a 768^3 matmul
        # (benchmarks/bench_overlap.py measures both alone)
        size, dtype, iters = args.size or 2048, torch.float32, args.iters or 20
        side = args.matmul_side or 768
        ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    where = f"{gpus} GPU(s)" if gpus else "CPU (CPU communicator)"
    block = f", matmul of the leading {side}x{side} block" if side else ""
    print(f"{NUM_SENDERS} senders -> 1 receiver, {size}x{size} {str(dtype).replace('torch.', '')} on {where}{block}")
    best: dict[bool | str, float] = dict.fromkeys(MODES, float("inf"))
    chosen = []
    try:
        actors = make_actors(gpus)
        for _ in range(args.rounds):  # alternate the modes; keep each one's best round
            for overlap in MODES:
                seconds, decision = run(overlap, actors, (size, size), dtype, iters, side)
                best[overlap] = min(best[overlap], seconds)
                chosen += [decision] if decision is not None else []
            os.environ.pop("CGRAPH_VISUALIZE_SCHEDULE", None)  # one picture per mode is enough
        for overlap in MODES:
            print(f"overlap_gpu_communication={overlap!r}, duration={best[overlap]:.3f}s")
        print(f"speedup with overlap: {best[False] / best[True]:.2f}x")
        better = min(best[False], best[True])
        print(f"auto against the better of the two: {best['auto'] / better:.2f}x the time")
        for k, decision in enumerate(chosen, 1):
            print(f"auto, round {k}, ran {decision}")
        explain(actors, (size, size), dtype, side)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
