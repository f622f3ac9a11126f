"""``ray.shutdown()`` with a compiled graph never torn down (run by test_runtime_shutdown.py
in a fresh process, so the test session's shared Ray instance stays as it is)."""

from __future__ import annotations

import json
import os
import time

import ray

import cgraph
from cgraph import InputNode


@ray.remote(num_cpus=0)
class Adder:
    def add(self, x):
        return x + 1


def main() -> None:
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # never another script's cluster
    a, b = Adder.remote(), Adder.remote()
    with InputNode() as inp:
        dag = b.add.bind(a.add.bind(inp))
    compiled = cgraph.compile(dag)
    got = [compiled.execute(i).get(timeout=60) for i in range(5)]
    mine = f"cgraph_{os.getpid()}_"
    during = sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine))
    ray.shutdown()  # no teardown first
    torn = compiled.is_teardown
    time.sleep(2.0)  # the graph's monitor polls every 0.5 s: it must not start Ray again
    after = sorted(n for n in os.listdir("/dev/shm") if n.startswith(mine))
    print(json.dumps({"got": got, "during": during, "torn_down": torn, "after": after,
                      "ray_again": ray.is_initialized()}))


if __name__ == "__main__":
    main()
