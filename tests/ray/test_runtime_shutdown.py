"""``ray.shutdown()`` tears down the compiled graphs still live, as it does Ray's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("shutdown_script.py")
ROOT = Path(__file__).resolve().parents[2]


def test_ray_shutdown_tears_down_a_live_graph_and_ray_stays_down() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONBREAKPOINT"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["got"] == [i + 2 for i in range(5)]
    assert out["during"], "the graph made no segments of the driver's: nothing was tested"
    assert out["torn_down"] is True, "ray.shutdown() tore the graph down"
    assert out["after"] == [], "its segments are gone once Ray is down"
    assert out["ray_again"] is False, "nothing started Ray again after the shutdown"
