"""Free ports are drawn where nothing but listeners takes them."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from pipelines.services import free_port, probe
from pipelines.services.probe import listen_port_range


def test_free_ports_avoid_ray_worker_ports_and_the_ephemeral_range() -> None:
    low, high = listen_port_range()
    assert low >= 20000, "Ray's workers listen on 10002-19999"
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if ephemeral.is_file():
        assert high < int(ephemeral.read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert all(low <= port <= high for port in ports)
    assert len(set(ports)) > 1


def test_free_ports_do_not_follow_the_global_seed() -> None:
    random.seed(0)
    first = [free_port() for _ in range(5)]
    random.seed(0)
    assert [free_port() for _ in range(5)] != first, "two seeded processes would pick the same ports"


def test_a_listening_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(probe, "listen_port_range", lambda: (taken, taken))
        with pytest.raises(probe.ServiceError, match=f"No free TCP port on 127.0.0.1 in {taken}-{taken}"):
            free_port(attempts=3)
