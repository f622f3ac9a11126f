"""``ray.shutdown()`` tears down the compiled graphs still live, as it does Ray's own."""

from __future__ import annotations

import json


def test_ray_shutdown_tears_down_a_live_graph_and_ray_stays_down(child_scripts) -> None:
    done = child_scripts.get("shutdown_script.py").result()
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["got"] == [i + 2 for i in range(5)]
    assert out["during"], "the graph made no segments of the driver's: nothing was tested"
    assert out["torn_down"] is True, "ray.shutdown() tore the graph down"
    assert out["after"] == [], "its segments are gone once Ray is down"
    assert out["ray_again"] is False, "nothing started Ray again after the shutdown"


def test_twenty_compile_shutdown_init_cycles_leave_no_thread_segment_or_socket(child_scripts) -> None:
    """A driver compiles, runs, tears some graphs down and leaves the rest to Ray's shutdown,
    starts Ray again and goes on (20 cycles on a running two-node cluster, one graph
    crossing nodes, then 2 with a local Ray of their own): after every shutdown no thread of
    cgraph's runs, no segment of the driver's is left, every socket cgraph's code opened is
    closed, and Ray stays down until the next init."""
    done = child_scripts.get("lifecycle_script.py").result()  # started with the session
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["results"] == [[i + 2, [i + 1, 15], i + 1] for i in range(22)]
    assert len(out["after"]) == 22
    for i, held in enumerate(out["after"]):
        assert held["threads"] == [], f"cycle {i}: cgraph threads still running"
        assert held["segments"] == [], f"cycle {i}: shared-memory segments left"
        assert held["cgraph_sockets_open"] == 0, f"cycle {i}: sockets cgraph opened are still open"
        assert held["ray"] is False, f"cycle {i}: Ray is up after ray.shutdown()"
    assert out["after"][0]["cgraph_sockets"] > 0, "no graph crossed nodes: the socket check saw nothing"
    assert out["ray_at_exit"] is False, "a thread of cgraph's started Ray again after the last shutdown"
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
