"""node_loss: a dead actor's node counts as lost when Ray says so, or its raylet's port
refuses or does not accept; alive when the port accepts (no Ray: ``ray.nodes`` faked)."""

from __future__ import annotations

import socket

import pytest

from cgraph.runtime import node_loss


def entry(node_id: str, port: int, alive: bool = True, host: str = "127.0.0.1") -> dict[str, object]:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": host, "NodeManagerPort": port,
            "DeathReasonMessage": "health check failed" if not alive else ""}


@pytest.fixture
def listening():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def closed_port():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return port  # nobody listens there now: a connection is refused


def fake_nodes(monkeypatch, *entries):
    monkeypatch.setattr(node_loss.ray, "nodes", lambda: list(entries))


def test_a_node_whose_raylet_accepts_is_alive(monkeypatch, listening):
    fake_nodes(monkeypatch, entry("n1", listening))
    assert node_loss.node_lost("n1") is None


def test_a_node_whose_raylet_refuses_is_lost(monkeypatch, closed_port):
    fake_nodes(monkeypatch, entry("n0", 1), entry("n1", closed_port))
    assert node_loss.node_lost("n1") == f"its raylet at 127.0.0.1:{closed_port} refuses connections"


def test_a_node_ray_reports_dead_is_lost_without_a_probe(monkeypatch, listening):
    fake_nodes(monkeypatch, entry("n1", listening, alive=False))
    assert node_loss.node_lost("n1") == "Ray reports it dead (health check failed)"


def test_a_node_ray_no_longer_lists_is_lost(monkeypatch):
    fake_nodes(monkeypatch, entry("n0", 1))
    assert node_loss.node_lost("n1") == "Ray no longer lists it"


def test_a_raylet_that_does_not_accept_in_time_is_lost(monkeypatch):
    def never(address, timeout):
        raise TimeoutError("timed out")

    fake_nodes(monkeypatch, entry("n1", 6380, host="10.0.0.2"))
    monkeypatch.setattr(node_loss.socket, "create_connection", never)
    assert node_loss.node_lost("n1") == ("its raylet at 10.0.0.2:6380 did not accept a connection within "
                                         "1 s (TimeoutError)")


def test_when_ray_cannot_be_asked_or_names_no_port_nothing_is_claimed(monkeypatch):
    def shut_down():
        raise RuntimeError("Ray is not initialized")

    monkeypatch.setattr(node_loss.ray, "nodes", shut_down)
    assert node_loss.node_lost("n1") is None
    fake_nodes(monkeypatch, {"NodeID": "n1", "Alive": True})
    assert node_loss.node_lost("n1") is None
