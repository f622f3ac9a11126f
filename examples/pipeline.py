"""A 3-stage actor pipeline, compiled with cgraph and run with plain Ray calls.

    driver ──x──► Preprocess.run ──► Model.run ──► Postprocess.run ──► driver
               (normalise)        (matmul)      (top-k summary)

Prints the per-execution latency of both (median and p99) and the speed-up.
Run: `python examples/pipeline.py [--iters N] [--size N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.dag import InputNode  # noqa: E402

import cgraph  # noqa: E402


@ray.remote(num_cpus=0)
class Preprocess:
    def run(self, x: np.ndarray) -> np.ndarray:
        return (x - x.mean()) / (x.std() + 1e-6)


@ray.remote(num_cpus=0)
class Model:
    def __init__(self, size: int) -> None:
        self.w = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)

    def run(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32) @ self.w


@ray.remote(num_cpus=0)
class Postprocess:
    def run(self, y: np.ndarray) -> tuple[float, int]:
        return float(y.max()), int(y.argmax())


def _stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def time_cgraph(stages, inputs) -> tuple[list[float], list]:
    pre, model, post = stages
    with InputNode() as inp:
        dag = post.run.bind(model.run.bind(pre.run.bind(inp)))
    compiled = cgraph.compile(dag)
    try:
        compiled.execute(inputs[0]).get()  # warm-up
        times, results = [], []
        for x in inputs:
            t0 = time.perf_counter()
            results.append(compiled.execute(x).get())
            times.append(time.perf_counter() - t0)
        return times, results
    finally:
        compiled.teardown()


def time_plain_ray(stages, inputs) -> tuple[list[float], list]:
    pre, model, post = stages
    ray.get(post.run.remote(model.run.remote(pre.run.remote(inputs[0]))))  # warm-up
    times, results = [], []
    for x in inputs:
        t0 = time.perf_counter()
        results.append(ray.get(post.run.remote(model.run.remote(pre.run.remote(x)))))
        times.append(time.perf_counter() - t0)
    return times, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--size", type=int, default=64, help="vector length / model width")
    args = parser.parse_args()

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        stages = (Preprocess.remote(), Model.remote(args.size), Postprocess.remote())
        rng = np.random.default_rng(1)
        inputs = [rng.standard_normal((4, args.size)) for _ in range(args.iters)]
        cg_times, cg_results = time_cgraph(stages, inputs)
        ray_times, ray_results = time_plain_ray(stages, inputs)
        assert cg_results == ray_results, "cgraph and plain Ray disagree"
        cg_med, cg_p99 = _stats(cg_times)
        ray_med, ray_p99 = _stats(ray_times)
        print(f"3-stage pipeline, {args.iters} executions, input {inputs[0].shape}")
        print(f"  cgraph          median {cg_med * 1e6:8.1f} us   p99 {cg_p99 * 1e6:8.1f} us")
        print(f"  plain Ray calls median {ray_med * 1e6:8.1f} us   p99 {ray_p99 * 1e6:8.1f} us")
        print(f"  speed-up (median): {ray_med / cg_med:.1f}x")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
