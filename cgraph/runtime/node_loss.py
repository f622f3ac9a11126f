"""Whether a dead actor's node died with it, said within a second.

Ray's GCS marks a node dead only after its health checks fail in a row: 15.5 s on
this machine after ``cluster.remove_node`` killed a raylet, while the graph heard
of its actor's death in under 4 s. So when an actor of the graph dies on another
node, the driver asks the node's raylet itself: a TCP connection to the port it
serves Ray on (``NodeManagerPort``, from ``ray.nodes()``), opened and closed at
once, nothing sent. A refused connection (the raylet process is gone) or none
within ``PROBE_S`` (the host or the network is gone) means the node is lost; an
accepted one means only the actor died. The GCS's own verdict, where it has one,
comes first.
"""

from __future__ import annotations

import socket

import ray

PROBE_S = 1.0
"""How long the raylet's port may take to accept before the node counts as lost."""


def node_lost(node_id: str) -> str | None:
    """Why node ``node_id`` counts as lost ("its raylet at 10.0.0.2:6380 refuses
    connections"), or None: it is alive as far as anyone can tell here (or Ray cannot
    be asked)."""
    try:
        nodes = ray.nodes()  # type: ignore[no-untyped-call]  # unannotated in Ray
    except Exception:  # noqa: BLE001 - Ray is shutting down: say nothing rather than guess
        return None
    entry = next((n for n in nodes if n.get("NodeID") == node_id), None)
    if entry is None:
        return "Ray no longer lists it"
    if not entry.get("Alive", True):
        return f"Ray reports it dead ({entry.get('DeathReasonMessage') or 'no reason given'})"
    try:
        host, port = str(entry["NodeManagerAddress"]), int(entry["NodeManagerPort"])
    except (KeyError, TypeError, ValueError):
        return None  # a Ray whose node table says no port: nothing to ask
    try:
        socket.create_connection((host, port), timeout=PROBE_S).close()
    except ConnectionRefusedError:
        return f"its raylet at {host}:{port} refuses connections"
    except OSError as exc:
        return f"its raylet at {host}:{port} did not accept a connection within {PROBE_S:g} s ({type(exc).__name__})"
    return None
