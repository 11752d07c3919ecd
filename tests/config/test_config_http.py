"""The `http:` section: off by default, its documented defaults, and every mistake by its key path."""

from __future__ import annotations

from pathlib import Path


from daemon.config.loader import load_config
from tests.config.example import config_errors, example_config

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "a-token-long-enough-0123"


def _config(tmp_path: Path, http: object, **more) -> Path:
    return example_config(tmp_path, http=http, **more)


def test_the_listener_is_off_by_default_and_documented_defaults_hold():
    http = load_config(ROOT / "config.yaml", check_models=False).http
    assert not http.enabled and http.port is None and http.address == "127.0.0.1"
    assert http.max_connections == 64 and http.request_timeout_ms == 5000 and http.max_body_bytes == 4 << 20
    assert http.token is None and http.tls is None


def test_a_token_file_is_read_relative_to_the_config_and_never_shown(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    http = load_config(_config(tmp_path, {"port": 8000, "token_file": "token"}), check_models=False).http
    assert http.enabled and http.token == TOKEN and http.token_file == tmp_path / "token"
    assert TOKEN not in repr(http)


def test_every_mistake_is_named_by_its_key_path(tmp_path):
    (tmp_path / "short").write_text("abc\n")
    errors = config_errors(_config(tmp_path, {"port": 70000, "max_connections": 0, "request_timeout_ms": 1,
                                        "max_body_bytes": "big", "token_file": "short", "tls": {"cert_file": "nope"},
                                        "adress": "x"}))
    for expected in ("http.port: must be a port in 1..65535, got 70000", "http.max_connections: must be >= 1",
                     "http.request_timeout_ms: must be >= 10", "http.max_body_bytes: must be an integer",
                     "http.token_file: the token in", "http.tls.cert_file:", "file not found",
                     "http.tls.key_file: is required", "http.adress: unknown key"):
        assert expected in errors, errors
    assert "http.token_file: cannot read" in config_errors(_config(tmp_path, {"port": 8000, "token_file": "missing"}))


def test_the_listener_needs_one_process_and_its_own_port(tmp_path):
    errors = config_errors(_config(tmp_path, {"port": 9100}, workers={"processes": 2}, metrics={"port": 9100}))
    assert "http.port: needs workers.processes 1 (got 2)" in errors
    assert "http.port: 9100 is metrics.port too" in errors
