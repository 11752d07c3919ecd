"""Twenty broken configs, one mistake each, made from config.yaml by a small text edit.

For each, `check-config` exits 78 and its stderr names the key path and the line, with no
traceback and no follow-on error. Most run `daemon.cli.main` in-process (a subprocess per
case would take about 1.5 s each to import numpy and TFLite); two run the real command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

from daemon import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "config.yaml").read_text().replace(" models/", f" {ROOT}/models/")
BAD_BYTE = "\udce9"  # written as the lone byte 0xe9 (surrogateescape): not UTF-8


def _line_of(text: str) -> int:
    """The 1-based line of config.yaml where `text` first appears."""
    return EXAMPLE[: EXAMPLE.index(text)].count("\n") + 1


class Case(NamedTuple):
    old: str  # text of config.yaml to replace (its first occurrence)
    new: str
    key: str  # the key path stderr must name ("FILE" for the file itself)
    message: str
    marker: Optional[str] = None  # the text on the reported line (default: `new`'s last line)
    absent: tuple[str, ...] = ()  # follow-on errors that must not appear


CASES = {
    "wrong-type": Case("  max: 2 ", "  max: two ", "workers.max", "must be an integer, got 'two'"),
    "unknown-key": Case("  qos: 1 ", "  qos: 1\n  colour: blue\n", "mqtt.colour",
                        "unknown key (known: broker, client_id, ",
                        marker="  colour: blue"),
    "bad-broker": Case("broker: localhost:1883", "broker: http://localhost:1883", "mqtt.broker",
                       "unknown scheme 'http://'"),
    "bad-topic-filter": Case("subscribe: sensors/+/imu ", "subscribe: sensors/#/imu ", "routes[0].subscribe",
                             "'#' must be a whole level and the last one", absent=("routes[0].publish",)),
    "placeholder-out-of-range": Case("publish: results/{1}/activity ", "publish: results/{2}/activity ",
                                     "routes[0].publish", "placeholder {2} but the subscribe filter has only 1"),
    "unknown-model": Case("model: activity  ", "model: activty   ", "routes[0].model",
                          "unknown model 'activty' (known: activity, appliance, gunpoint, load_anomaly)"),
    "missing-model-file": Case("models/activity/model.tflite", "models/activity/nope.tflite", "models.activity.path",
                               "nope.tflite: model file not found"),
    "missing-labels-file": Case("models/activity/labels.txt", "models/activity/nope.txt", "models.activity.labels",
                                "nope.txt: labels file not found"),
    "label-count-mismatch": Case("models/activity/labels.txt", "models/appliance/labels.txt", "models.activity.labels",
                                 "appliance/labels.txt has 10 labels but the model has 4 outputs"),
    "shape-mismatch": Case("shape: [100, 6] ", "shape: [98, 6]  ", "routes[0].input",
                           "shape [98, 6] becomes [49, 6] after preprocessing, but model 'activity' takes [50, 6]",
                           marker="    input:\n      format: json"),
    "duplicate-key": Case("  qos: 1 ", "  qos: 1\n  qos: 2 ", "mqtt.qos",
                          f"duplicate key, first set on line {_line_of('  qos: 1 ')}"),
    "not-utf8": Case("- name: activity-raw", f"- name: activit{BAD_BYTE}-raw", "routes[1].name",
                     "is not UTF-8 text: byte 0xe9 at offset"),
    "tab-indented": Case("  qos: 1 ", "\tqos: 1 ", "FILE", "invalid YAML: found character '\\t' that cannot start"),
    "negative-number": Case("ttl_s: 3600", "ttl_s: -5  ", "cache.ttl_s", "must be >= 0, got -5"),
    "bad-qos": Case("  qos: 1 ", "  qos: 3 ", "mqtt.qos", "must be one of 0, 1, 2, got 3"),
    "bad-dtype": Case("dtype: float32  ", "dtype: float16  ", "routes[0].input.dtype",
                      "must be one of float32, float64, int8, uint8, int16, uint16, int32, got 'float16'"),
    "bad-step-name": Case("- downsample: {axis: 0, factor: 2}  ", "- downsampel: {axis: 0, factor: 2}  ",
                          "routes[0].preprocess[0]", "unknown step 'downsampel'; known: downsample,",
                          absent=("routes[0].input",)),
    "top-level-list": Case("mqtt:\n", "- mqtt:\n", "config", "must be a mapping, got a list", marker="#"),
    "empty-file": Case(EXAMPLE, "", "config", "the file is empty", marker=""),
    "bad-sha256": Case("sha256: null  ", "sha256: abc123", "models.activity.sha256", "must be 64 hex digits"),
}


def _write(tmp_path: Path, case: Case) -> tuple[Path, int]:
    assert case.old in EXAMPLE, case.old
    text = EXAMPLE.replace(case.old, case.new, 1)
    marker = case.new.splitlines()[-1] if case.marker is None else case.marker
    line = text.count("\n", 0, text.index(marker)) + 1 if marker else 1
    if case.key == "config" and case.new == "- mqtt:\n":  # a list: every line moves under the item
        text = "\n".join("  " + t if t and not t.startswith(("#", "- mqtt:")) else t for t in text.splitlines())
    path = tmp_path / "broken.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    return path, line


def _check(case: Case, path: Path, line: int, code: int, stderr: str) -> None:
    assert code == cli.EXIT_CONFIG, stderr
    assert "Traceback" not in stderr
    errors = [e for e in stderr.splitlines() if not e.startswith("INFO") and not e.endswith("config error(s)")]
    key = str(path) if case.key == "FILE" else case.key
    assert len(errors) == 1, f"one mistake, one message; got:\n{stderr}"
    assert errors[0].startswith(f"{key}: ") and case.message in errors[0], errors[0]
    assert errors[0].endswith(f"(line {line})"), errors[0]
    assert not any(a in stderr for a in case.absent), stderr


@pytest.mark.parametrize("name", CASES)
def test_a_broken_config_names_its_one_mistake(name, tmp_path, capsys):
    case = CASES[name]
    path, line = _write(tmp_path, case)
    with pytest.raises(SystemExit) as exited:
        cli.main(["check-config", "--config", str(path)])
    _check(case, path, line, exited.value.code, capsys.readouterr().err)


@pytest.mark.parametrize("name", ["not-utf8", "missing-model-file"])
def test_the_real_command_says_the_same(name, tmp_path):
    case = CASES[name]
    path, line = _write(tmp_path, case)
    proc = subprocess.run([sys.executable, "-m", "daemon", "check-config", "--config", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    _check(case, path, line, proc.returncode, proc.stderr)
    assert proc.stdout == ""
