"""minisign's formats (daemon/fleet/release/minisign.py), against Debian's minisign 0.11 both ways: its keys and
signatures read and verify here, ours read and verify there."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.fleet.release import minisign
from daemon.fleet.release.minisign import MinisignError, PublicKey

MINISIGN = shutil.which("minisign")
needs_minisign = pytest.mark.skipif(MINISIGN is None, reason="minisign is not installed (apt-get install minisign)")
COMMENT = "model=activity version=1.3.0 serial=4"
DATA = b'{"schema": "edge-inferd.release/1"}\n'
# Small scrypt limits (N = 2^14) for our own encrypted keys: minisign reads the limits from the file.
FAST_OPS, FAST_MEM = 1 << 20, 1 << 24


def _minisign(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([MINISIGN, *args], input=stdin, capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture()
def signed(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.json"
    path.write_bytes(DATA)
    return path


def test_public_key_from_its_file_text_or_its_bare_line():
    pk = minisign.generate().public_key
    assert PublicKey.from_text(pk.to_text()) == pk
    assert PublicKey.from_text(pk.line) == pk
    assert PublicKey.from_text(pk.to_text("my comment")) == pk
    assert pk.to_text().splitlines()[0] == f"untrusted comment: minisign public key {pk.key_id_hex}"


@needs_minisign
def test_the_longest_public_key_comment_we_write_is_one_minisign_reads(tmp_path, signed):
    sk = minisign.generate()
    pub, sig = tmp_path / "k.pub", tmp_path / "k.minisig"
    pub.write_text(sk.public_key.to_text("c" * minisign.UNTRUSTED_COMMENT_MAX_BYTES))
    sig.write_text(minisign.sign(DATA, sk, COMMENT, "u" * minisign.UNTRUSTED_COMMENT_MAX_BYTES))
    _minisign("-V", "-q", "-m", str(signed), "-x", str(sig), "-p", str(pub))
    with pytest.raises(MinisignError, match="untrusted comment"):
        sk.public_key.to_text("c" * (minisign.UNTRUSTED_COMMENT_MAX_BYTES + 1))
    with pytest.raises(MinisignError, match="one line"):
        sk.public_key.to_text("a\nb")


@pytest.mark.parametrize("text", ["", "not base64!", "untrusted comment: x\n", "RWQ=", "a\nb\nc"])
def test_a_bad_public_key_is_refused(text):
    with pytest.raises(MinisignError):
        PublicKey.from_text(text)


def test_secret_key_round_trip_unencrypted_and_owner_only(tmp_path):
    sk = minisign.generate()
    path = tmp_path / "k.key"
    minisign.write_secret_key(path, sk)
    assert stat.S_IMODE(path.stat().st_mode) == minisign.SECRET_FILE_MODE
    assert minisign.read_secret_key(path) == sk
    with pytest.raises(MinisignError, match="already exists"):
        minisign.write_secret_key(path, minisign.generate())
    assert minisign.read_secret_key(path) == sk


def test_secret_key_round_trip_encrypted(tmp_path):
    sk = minisign.generate()
    path = tmp_path / "k.key"
    minisign.write_secret_key(path, sk, b"secret", FAST_OPS, FAST_MEM)
    assert minisign.read_secret_key(path, b"secret") == sk
    with pytest.raises(MinisignError, match="wrong password"):
        minisign.read_secret_key(path, b"wrong")
    with pytest.raises(MinisignError, match="encrypted"):
        minisign.read_secret_key(path)


def test_a_damaged_secret_key_is_refused(tmp_path):
    text = minisign.secret_key_text(minisign.generate())
    raw = bytearray(minisign._b64decode(text.splitlines()[1], "key"))
    raw[60] ^= 1
    with pytest.raises(MinisignError, match="checksum"):
        minisign.parse_secret_key(f"untrusted comment: x\n{minisign._b64(bytes(raw))}\n")


def test_scrypt_parameters_are_libsodiums_for_what_minisign_writes():
    assert minisign.scrypt_params(minisign.OPSLIMIT_SENSITIVE, minisign.MEMLIMIT_SENSITIVE) == (20, 8, 1)
    assert minisign.scrypt_params(FAST_OPS, FAST_MEM) == (14, 8, 2)
    assert minisign.scrypt_params(0, 1 << 30) == (10, 8, 1)  # opslimit below libsodium's floor is raised to it


@pytest.mark.parametrize("prehashed", [True, False])
def test_sign_and_verify(prehashed):
    sk, other = minisign.generate(), minisign.generate()
    (sig,) = minisign.parse_signatures(minisign.sign(DATA, sk, COMMENT, prehashed=prehashed))
    assert sig.alg == (minisign.PREHASHED_ALG if prehashed else minisign.LEGACY_ALG)
    assert sig.trusted_comment == COMMENT and sig.key_id == sk.key_id
    assert sig.verify(DATA, sk.public_key)
    assert not sig.verify(DATA + b" ", sk.public_key)
    assert not sig.verify(DATA, other.public_key)
    assert not sig.verify(DATA, PublicKey(sk.key_id, other.public_key.key))  # same id, another key


def test_a_tampered_trusted_comment_fails_the_global_signature():
    sk = minisign.generate()
    text = minisign.sign(DATA, sk, COMMENT).replace("serial=4", "serial=5")
    (sig,) = minisign.parse_signatures(text)
    assert not sig.verify(DATA, sk.public_key)


def test_several_signatures_concatenated():
    keys = [minisign.generate() for _ in range(3)]
    text = "".join(minisign.sign(DATA, sk, COMMENT) for sk in keys)
    sigs = minisign.parse_signatures(text)
    assert [s.key_id for s in sigs] == [sk.key_id for sk in keys]
    assert all(s.verify(DATA, sk.public_key) for s, sk in zip(sigs, keys))
    assert len(minisign.parse_signatures(text.replace("\n", "\r\n") + "\n\n")) == 3


@pytest.mark.parametrize("mangle", [
    lambda t: "",
    lambda t: "\n".join(t.splitlines()[:3]),
    lambda t: t.replace("untrusted comment: ", "comment: "),
    lambda t: t.replace("trusted comment: model", "model"),
    lambda t: "\n".join(line if i != 1 else line[:-8] for i, line in enumerate(t.splitlines())),
    lambda t: "\n".join(line if i != 3 else "!!" + line for i, line in enumerate(t.splitlines())),
])
def test_a_malformed_signature_file_is_refused(mangle):
    with pytest.raises(MinisignError):
        minisign.parse_signatures(mangle(minisign.sign(DATA, minisign.generate(), COMMENT)))


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_signatures_raises_only_minisign_errors(text):
    try:
        minisign.parse_signatures(text)
    except MinisignError:
        pass


def test_load_public_key_bare_or_a_pub_file(tmp_path):
    pk = minisign.generate().public_key
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ops.pub").write_text(pk.to_text("clé de l'équipe"), encoding="utf-8")
    assert minisign.load_public_key(pk.line, tmp_path) == pk
    assert minisign.load_public_key("keys/ops.pub", tmp_path) == pk
    assert minisign.load_public_key(str(tmp_path / "keys" / "ops.pub"), Path("/nonexistent")) == pk
    with pytest.raises(MinisignError, match="missing.pub"):
        minisign.load_public_key("missing.pub", tmp_path)


# --- against minisign itself ---


@needs_minisign
@pytest.mark.parametrize("legacy", [False, True])
def test_minisigns_unencrypted_key_and_signature_verify_here(tmp_path, signed, legacy):
    pub, key = tmp_path / "m.pub", tmp_path / "m.key"
    _minisign("-G", "-W", "-p", str(pub), "-s", str(key))
    _minisign("-S", *(["-l"] if legacy else []), "-s", str(key), "-m", str(signed), "-t", COMMENT)
    pk = PublicKey.from_text(pub.read_text())
    (sig,) = minisign.parse_signatures(Path(f"{signed}.minisig").read_text())
    assert sig.alg == (minisign.LEGACY_ALG if legacy else minisign.PREHASHED_ALG)
    assert sig.trusted_comment == COMMENT
    assert sig.verify(DATA, pk)
    assert not sig.verify(DATA + b"x", pk)
    assert minisign.read_secret_key(key).public_key == pk


@needs_minisign
def test_minisigns_encrypted_key_decrypts_here(tmp_path):
    """minisign -G's scrypt at its own (sensitive) limits: 1 GiB and a few seconds."""
    pub, key = tmp_path / "m.pub", tmp_path / "m.key"
    _minisign("-G", "-p", str(pub), "-s", str(key), stdin="pass word\npass word\n")
    assert minisign.read_secret_key(key, b"pass word").public_key == PublicKey.from_text(pub.read_text())


@needs_minisign
def test_our_signature_verifies_with_minisign(tmp_path, signed):
    sk = minisign.generate()
    pub = tmp_path / "ours.pub"
    pub.write_text(sk.public_key.to_text())
    sig = tmp_path / "manifest.json.minisig"
    sig.write_text(minisign.sign(DATA, sk, COMMENT))
    out = _minisign("-V", "-H", "-m", str(signed), "-x", str(sig), "-p", str(pub))
    assert f"Trusted comment: {COMMENT}" in out.stdout
    _minisign("-V", "-m", str(signed), "-x", str(sig), "-P", sk.public_key.line)
    signed.write_bytes(DATA + b" ")
    with pytest.raises(subprocess.CalledProcessError):
        _minisign("-V", "-m", str(signed), "-x", str(sig), "-p", str(pub))


@needs_minisign
def test_minisign_checks_the_first_of_concatenated_signatures(tmp_path, signed):
    first, second = minisign.generate(), minisign.generate()
    sig = tmp_path / "manifest.json.minisig"
    sig.write_text(minisign.sign(DATA, first, COMMENT) + minisign.sign(DATA, second, COMMENT))
    _minisign("-V", "-m", str(signed), "-x", str(sig), "-P", first.public_key.line)


@needs_minisign
@pytest.mark.parametrize("password", [None, "secret"])
def test_our_key_signs_with_minisign(tmp_path, signed, password):
    sk = minisign.generate()
    key = tmp_path / "ours.key"
    minisign.write_secret_key(key, sk, password and password.encode(), FAST_OPS, FAST_MEM)
    args = ["-S", "-s", str(key), "-m", str(signed), "-t", COMMENT]
    _minisign(*args, stdin=f"{password}\n" if password else "")  # minisign sees the key is not encrypted
    (sig,) = minisign.parse_signatures(Path(f"{signed}.minisig").read_text())
    assert sig.verify(DATA, sk.public_key)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_key_readers_raise_only_minisign_errors(text):
    for read in (PublicKey.from_text, minisign.parse_secret_key):
        try:
            read(text)
        except MinisignError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=minisign.PUBLIC_KEY_BYTES - 2, max_size=minisign.PUBLIC_KEY_BYTES - 2))
def test_any_public_key_bytes_verify_false_never_raise(raw):
    pk = PublicKey.from_text(minisign._b64(minisign.KEY_ALG + raw))
    sig = minisign.parse_signatures(minisign.sign(DATA, minisign.generate(), COMMENT))[0]
    assert not minisign.Signature(sig.alg, pk.key_id, sig.signature, COMMENT, sig.global_signature).verify(DATA, pk)


@needs_minisign
def test_the_longest_trusted_comment_we_sign_is_one_minisign_reads(tmp_path, signed):
    sk = minisign.generate()
    sig = tmp_path / "long.minisig"
    sig.write_text(minisign.sign(DATA, sk, "v" * minisign.TRUSTED_COMMENT_MAX_BYTES))
    _minisign("-V", "-q", "-m", str(signed), "-x", str(sig), "-P", sk.public_key.line)
    with pytest.raises(MinisignError, match="trusted comment"):
        minisign.sign(DATA, sk, "v" * (minisign.TRUSTED_COMMENT_MAX_BYTES + 1))
    with pytest.raises(MinisignError, match="one line"):
        minisign.sign(DATA, sk, "a\nb")
