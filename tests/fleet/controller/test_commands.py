"""`edge-inferd fleet keygen` and `fleet sign` (daemon/fleet/controller/commands.py), through cli.main as a user runs them."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from daemon import cli, cli_parser
from daemon.fleet.release import minisign, release
from daemon.fleet.release.release import MANIFEST_NAME, SIGNATURE_NAME, verify_manifest
from daemon.model.runtime import file_sha256

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "models" / "activity" / "model.tflite"
LABELS = ROOT / "models" / "activity" / "labels.txt"
TEST_DATA = ROOT / "models" / "activity" / "test.npz"
MINISIGN = shutil.which("minisign")


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["fleet", *argv])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def _keygen(capsys, prefix: Path, *extra: str) -> minisign.PublicKey:
    code, out, err = _main(capsys, "keygen", "--out", str(prefix), *extra)
    assert code == cli.EXIT_OK, err
    return minisign.PublicKey.from_text(out)


def _sign_args(key: Path, out: Path) -> list[str]:
    return ["sign", "--key", str(key), "--model-file", str(MODEL), "--labels", str(LABELS), "--name", "activity",
            "--version", "1.3.0", "--serial", "4", "--out", str(out)]


def test_the_claim_metrics_are_the_ones_a_node_accepts():
    assert cli_parser.CLAIM_METRICS == release.METRICS


def test_keygen_writes_a_key_pair_once(tmp_path, capsys):
    pk = _keygen(capsys, tmp_path / "ops", "--comment", "ops team")
    key, pub = tmp_path / "ops.key", tmp_path / "ops.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert minisign.read_secret_key(key).public_key == pk
    assert pub.read_text() == pk.to_text("ops team")
    code, out, err = _main(capsys, "keygen", "--out", str(tmp_path / "ops"))
    assert code == cli.EXIT_FAIL and out == "" and "already exist" in err and len(err.splitlines()) == 1
    assert minisign.read_secret_key(key).public_key == pk


def test_keygen_refuses_a_comment_minisign_could_not_read_and_writes_nothing(tmp_path, capsys):
    code, out, err = _main(capsys, "keygen", "--out", str(tmp_path / "k"), "--comment", "c" * 2000)
    assert code == cli.EXIT_FAIL and "untrusted comment" in err and list(tmp_path.iterdir()) == []


def test_sign_then_add_a_second_signature(tmp_path, capsys):
    first, second = _keygen(capsys, tmp_path / "a"), _keygen(capsys, tmp_path / "b")
    out = tmp_path / "rel"
    args = _sign_args(tmp_path / "a.key", out) + ["--claim-data", str(TEST_DATA), "--claim-metric", "accuracy",
                                                  "--claim-value", "0.975", "--summary", "retrained"]
    code, stdout, err = _main(capsys, *args)
    assert code == cli.EXIT_OK, err
    assert f"signed by {first.key_id_hex}" in stdout
    data, sigs = (out / MANIFEST_NAME).read_bytes(), (out / SIGNATURE_NAME).read_text()
    manifest = verify_manifest(data, sigs, [first], 1)
    assert manifest.claims[0].validate_sha256 == file_sha256(TEST_DATA) and manifest.summary == "retrained"
    code, stdout, err = _main(capsys, "sign", "--key", str(tmp_path / "b.key"), "--out", str(out), "--add-signature")
    assert code == cli.EXIT_OK, err
    assert verify_manifest(data, (out / SIGNATURE_NAME).read_text(), [first, second], 2) == manifest
    trusted = [minisign.load_public_key(name, tmp_path) for name in ("a.pub", "b.pub")]
    assert verify_manifest(data, (out / SIGNATURE_NAME).read_text(), trusted, 2) == manifest


@pytest.mark.parametrize("drop, extra, expected", [
    ("--name", [], "--name needed"),
    ("--serial", [], "--serial needed"),
    (None, ["--claim-metric", "accuracy"], "go together"),
    (None, ["--version", "1 3"], "bad_manifest: version:"),
    (None, ["--name", "../up"], "unsafe_name: model:"),
    (None, ["--labels", "/nonexistent/labels.txt"], "/nonexistent/labels.txt"),
])
def test_sign_refusals_are_one_line_and_exit_1(tmp_path, capsys, drop, extra, expected):
    _keygen(capsys, tmp_path / "a")
    args = _sign_args(tmp_path / "a.key", tmp_path / "rel")
    if drop:
        del args[args.index(drop):args.index(drop) + 2]
    code, out, err = _main(capsys, *args, *extra)
    assert code == cli.EXIT_FAIL and expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "rel" / MANIFEST_NAME).exists()


def test_sign_a_model_the_daemon_cannot_serve_exits_78(tmp_path, capsys):
    _keygen(capsys, tmp_path / "a")
    args = _sign_args(tmp_path / "a.key", tmp_path / "rel")
    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes(MODEL.read_bytes()[:2000])
    args[args.index("--model-file") + 1] = str(truncated)
    code, out, err = _main(capsys, *args)
    assert code == cli.EXIT_CONFIG and "rejected the model" in err


def test_a_bad_key_file_exits_1(tmp_path, capsys):
    (tmp_path / "bad.key").write_text("untrusted comment: x\nnot a key\n")
    code, out, err = _main(capsys, *_sign_args(tmp_path / "bad.key", tmp_path / "rel"))
    assert code == cli.EXIT_FAIL and "bad.key" in err and len(err.splitlines()) == 1


def test_keygen_encrypts_with_minisigns_own_scrypt_limits(tmp_path, capsys):
    """Writing costs one scrypt at 1 GiB (seconds); reading it back is test_minisign's business."""
    (tmp_path / "pw").write_text("correct horse\n")
    _keygen(capsys, tmp_path / "enc", "--password-file", str(tmp_path / "pw"))
    raw = minisign._b64decode((tmp_path / "enc.key").read_text().splitlines()[1], "key")
    assert raw[2:4] == minisign.KDF_SCRYPT
    assert int.from_bytes(raw[38:46], "little") == minisign.OPSLIMIT_SENSITIVE
    assert int.from_bytes(raw[46:54], "little") == minisign.MEMLIMIT_SENSITIVE


def test_sign_with_an_encrypted_key_and_its_password_file(tmp_path, capsys):
    sk = minisign.generate()
    minisign.write_secret_key(tmp_path / "enc.key", sk, b"correct horse", 1 << 20, 1 << 24)  # small scrypt: fast
    (tmp_path / "pw").write_text("correct horse\n")
    code, out, err = _main(capsys, *_sign_args(tmp_path / "enc.key", tmp_path / "rel"))
    assert code == cli.EXIT_FAIL and "encrypted" in err
    (tmp_path / "wrong").write_text("wrong horse\n")
    code, out, err = _main(capsys, *_sign_args(tmp_path / "enc.key", tmp_path / "rel"), "--password-file",
                           str(tmp_path / "wrong"))
    assert code == cli.EXIT_FAIL and "wrong password" in err
    code, out, err = _main(capsys, *_sign_args(tmp_path / "enc.key", tmp_path / "rel"),
                           "--password-file", str(tmp_path / "pw"))
    assert code == cli.EXIT_OK, err
    rel = tmp_path / "rel"
    assert verify_manifest((rel / MANIFEST_NAME).read_bytes(), (rel / SIGNATURE_NAME).read_text(),
                           [sk.public_key], 1)


@pytest.mark.skipif(MINISIGN is None, reason="minisign is not installed (apt-get install minisign)")
def test_a_keygen_key_signs_with_minisign_and_its_release_verifies_there(tmp_path, capsys):
    _keygen(capsys, tmp_path / "k")
    code, out, err = _main(capsys, *_sign_args(tmp_path / "k.key", tmp_path / "rel"))
    assert code == cli.EXIT_OK, err
    manifest = tmp_path / "rel" / MANIFEST_NAME
    subprocess.run([MINISIGN, "-V", "-m", str(manifest), "-p", str(tmp_path / "k.pub")], check=True,
                   capture_output=True, timeout=60)
    other = tmp_path / "other.txt"
    other.write_text("x")
    subprocess.run([MINISIGN, "-S", "-s", str(tmp_path / "k.key"), "-m", str(other)], check=True,
                   capture_output=True, timeout=60)
    subprocess.run([MINISIGN, "-V", "-m", str(other), "-p", str(tmp_path / "k.pub")], check=True,
                   capture_output=True, timeout=60)
