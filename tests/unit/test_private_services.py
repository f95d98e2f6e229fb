"""Owner-only token files and folders, loopback listeners, and no credential among the variables that the
sweep hands to a Ray cluster's workers."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from pipelines.services.private import (
    is_loopback,
    listening_sockets,
    open_to_the_network,
    private_ray_token_file,
    private_temp_dir,
)
from pipelines.services.ray_connect import SETTINGS_FOR_WORKERS, worker_settings


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_missing_default_token_is_created_owner_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    path = private_ray_token_file()
    assert path == tmp_path / ".ray" / "auth_token"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700 and len(path.read_text()) == 64
    assert private_ray_token_file().read_text() == path.read_text(), "an existing token is kept"


def test_a_world_readable_token_is_made_private_and_kept(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("the-cluster-token")
    token.chmod(0o644)  # what Ray 2.60's own `ray.init()` leaves at ~/.ray/auth_token
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    assert private_ray_token_file() == token
    assert _mode(token) == 0o600 and token.read_text() == "the-cluster-token"
    token.write_text("")
    assert len(private_ray_token_file().read_text()) == 64, "an empty token file gets a token"


def test_a_token_in_the_environment_needs_no_file(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 32)
    assert private_ray_token_file() is None


def test_the_private_temp_dir_is_closed_to_other_users(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    path = private_temp_dir("capt-test")
    assert path == tmp_path / f"capt-test-{os.getuid()}" and _mode(path) == 0o700
    path.chmod(0o777)  # as Ray leaves its own temp dir
    assert _mode(private_temp_dir("capt-test")) == 0o700
    path.rmdir()
    (tmp_path / "elsewhere").mkdir()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RuntimeError, match="another user"):
        private_temp_dir("capt-test")


@pytest.mark.parametrize(("ip", "loopback"), [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True),
                                              ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False),
                                              ("10.0.0.5", False), ("::ffff:10.0.0.5", False)])
def test_loopback_addresses(ip, loopback):
    assert is_loopback(ip) is loopback


def test_listening_sockets_tell_loopback_from_every_interface():
    with socket.socket() as private, socket.socket() as public:
        private.bind(("127.0.0.1", 0))
        public.bind(("0.0.0.0", 0))
        private.listen()
        public.listen()
        ports = {port for _, port, _ in listening_sockets(os.getpid())}
        exposed = {port for _, port, _ in open_to_the_network(os.getpid())}
        assert private.getsockname()[1] in ports - exposed
        assert public.getsockname()[1] in exposed


def test_no_credential_travels_to_a_clusters_workers(monkeypatch):
    for name in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_TOKEN",
                 "AWS_SECRET_ACCESS_KEY", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "value")
    assert worker_settings() == {"HF_HUB_OFFLINE": "value"} | {
        name: os.environ[name] for name in SETTINGS_FOR_WORKERS if name in os.environ}
    secret_words = ("PASSWORD", "TOKEN", "SECRET", "KEY", "USERNAME", "CREDENTIAL")
    assert not [name for name in SETTINGS_FOR_WORKERS if any(word in name for word in secret_words)]
