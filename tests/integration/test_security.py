"""TLS with hostname verification and a password from a file, against a real mosquitto."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from daemon.tools.broker import Broker
from tests.integration import brokers
from tests.integration.conftest import ROOT, Daemon, write_config

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")
SECRET = "s3cret-Passw0rd-never-logged"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a broker certificate for 127.0.0.1 signed by it, and an unrelated CA."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca}",
                 "-keyout", str(d / f"{ca}.key"), "-out", str(d / f"{ca}.crt"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(d / "server.key"),
             "-out", str(d / "server.csr"))
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "2", "-extfile", str(d / "san.ext"), "-out", str(d / "server.crt"))
    return d


def _tls_broker(tmp_path, pki, name: str):
    return brokers.KINDS[name].make_tls(tmp_path / "tls-broker", pki / "ca.crt", pki / "server.crt",
                                        pki / "server.key")


@pytest.mark.parametrize("name", brokers.params("tls"))
def test_tls_with_the_right_ca_serves_and_a_wrong_ca_is_named_and_never_online(tmp_path, pki, transport, name):
    if name != brokers.MOSQUITTO and transport == "paho":
        pytest.skip(brokers.PAHO_ON_MOSQUITTO)
    (tmp_path / "wrong").mkdir()
    (tmp_path / "right").mkdir()
    with _tls_broker(tmp_path, pki, name) as broker:
        wrong = write_config(tmp_path / "wrong", transport=transport,
                             mqtt={"tls": {"ca_file": str(pki / "other-ca.crt")}})
        right = write_config(tmp_path / "right", transport=transport, mqtt={"tls": {"ca_file": str(pki / "ca.crt")}})
        # Both at once (the wrong one never gets a connection, so the one client id does not clash).
        daemon = Daemon(wrong, broker.address, tmp_path / "wrong.log")
        good = Daemon(right, broker.address, tmp_path / "right.log")
        try:
            try:
                assert daemon.wait_for_log("cannot connect to"), daemon.log()
                assert "CERTIFICATE_VERIFY_FAILED" in daemon.log() and daemon.proc.poll() is None  # named, retrying
            finally:
                daemon.stop()
            assert "connected to" not in daemon.log()
            assert good.wait_for_log("connected to"), good.log()
            assert "mqtts://" in good.log()
        finally:
            assert good.stop() == 0, good.log()


def test_a_password_from_a_file_logs_in_and_is_never_logged(tmp_path, transport):
    passwords = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "gw", SECRET], check=True, capture_output=True)
    secret_file = tmp_path / "mqtt-password"
    secret_file.write_text(SECRET + "\n")
    settings = {"allow_anonymous": "false", "password_file": str(passwords)}
    with Broker(tmp_path / "auth-broker", settings=settings) as broker:
        config = write_config(tmp_path, transport=transport,
                              mqtt={"username": "gw", "password_file": str(secret_file)})
        daemon = Daemon(config, broker.address, tmp_path / "daemon.log")
        try:
            assert daemon.wait_for_log("connected to"), daemon.log()  # the broker refuses anonymous clients
        finally:
            assert daemon.stop() == 0, daemon.log()
    assert SECRET not in daemon.log()
    check = subprocess.run([sys.executable, "-m", "daemon", "-v", "check-config", "--config", str(config)],
                           capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0 and SECRET not in check.stdout + check.stderr
