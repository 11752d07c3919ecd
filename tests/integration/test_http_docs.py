"""docs/http.md's client examples run as written: the tritonclient and KServe snippets are taken
from the page itself (so this fails when the page drifts), pointed at a real daemon (a process,
with a bearer token) beside a real mosquitto, and run in their own interpreters. The tritonclient
one makes two calls on one `auth` dict, binary then JSON: reusing the dict it was given broke
the second ("[400] the body is not JSON"), since tritonclient adds its binary header to it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from daemon.tools.broker import free_port
from tests.integration import v2_servers
from tests.integration.conftest import ROOT, WAIT_S, write_config
from tests.integration.test_http import _call, _wait_http

DOC = ROOT / "docs" / "http.md"
DOC_URL = "localhost:8000"
TOKEN = "docs-example-token-0123456789"
AUTH_LINE = 'auth = {"Authorization": "Bearer " + token}'
ROWS = 2  # the examples send two windows of zeros


def _snippet(marker: str) -> str:
    """The page's one python block containing `marker`, its URL pointed at `port` later."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if marker in b]
    assert len(blocks) == 1, f"docs/http.md: expected one python example with {marker!r}, found {len(blocks)}"
    assert DOC_URL in blocks[0], f"the {marker!r} example no longer talks to {DOC_URL}"
    return blocks[0]


def _run(python: str, code: str, port: int) -> str:
    prelude = f"token = {TOKEN!r}\n"
    program = prelude + code.replace(DOC_URL, f"127.0.0.1:{port}")
    run = subprocess.run([python, "-c", program], capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.fixture
def served_with_token(tmp_path, client, start_daemon):
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    config = write_config(tmp_path, http={"port": port, "token_file": str(tmp_path / "token")}, workers={"max": 1})
    daemon = start_daemon(config, wait_online=client)
    _wait_http(port, daemon)
    zeros = json.dumps({"data": [0.0] * 600}).encode()
    status, _, body = _call(port, "POST", "/routes/activity", zeros, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body
    return port, json.loads(body)["label"]


def test_the_tritonclient_example_runs_twice_on_one_auth_dict(served_with_token):
    pytest.importorskip("tritonclient.http")
    port, label = served_with_token
    code = _snippet("import tritonclient.http")
    assert code.count("client.infer(") == 1 and "for binary in (True, False)" in code, "two calls: binary, JSON"
    lines = _run(sys.executable, code, port).splitlines()
    labels = [line for line in lines if line.startswith("[")]
    assert len(labels) == 2 and all(line.count(repr(label)) == ROWS for line in labels), lines


def test_the_kserve_example_runs(served_with_token):
    reason = v2_servers.available(v2_servers.KSERVE)
    if reason is not None:
        pytest.skip(reason)
    port, label = served_with_token
    code = _snippet("from kserve import")
    out = _run(str(v2_servers.python_of(v2_servers.KSERVE)), AUTH_LINE + "\n" + code, port)
    assert "'label'" in out and out.count(label) >= ROWS, out
