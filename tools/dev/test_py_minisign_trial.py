"""Trial (issue 38, item 4): could PyPI's py-minisign replace daemon/fleet/release/minisign.py?

Every check runs for both implementations side by side, most of them against Debian's minisign 0.11
itself. Each implementation is reached through a thin adapter (_Ours, _PyMinisign) that does only the
glue a caller would write anyway (str/bytes, files); where py-minisign cannot do what a check needs,
its case is a strict xfail naming why, so this file stays green while the differences stay visible.
`pytest --runxfail tools/dev/test_py_minisign_trial.py` shows each difference's own error.

py-minisign is not a dependency: install it outside the venv to run its half, e.g.
    pip install --no-deps --target /tmp/pyminisign py-minisign
    PYTHONPATH=/tmp/pyminisign:$PWD python -m pytest tools/dev/test_py_minisign_trial.py
Its cases skip when it is missing, the interop checks when the minisign binary is."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from daemon.fleet.release import minisign as ours

MINISIGN = shutil.which("minisign")
needs_minisign = pytest.mark.skipif(MINISIGN is None, reason="minisign is not installed (apt-get install minisign)")
COMMENT = "model=activity version=1.3.0 serial=4"
DATA = b'{"schema": "edge-inferd.release/1"}\n'
FAST_OPS, FAST_MEM = 1 << 20, 1 << 24  # N = 2^14: quick, and minisign reads the limits from the file
PASSWORD = b"pass word"


def _minisign(*args: str, stdin: bytes = b"", check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([MINISIGN, *args], input=stdin, capture_output=True, timeout=120, check=check)


# --- the two adapters: one interface, each implementation's own behaviour and errors ---


class _Ours:
    name = "ours"
    Error = ours.MinisignError

    generate = staticmethod(ours.generate)

    def public(self, sk):
        return sk.public_key

    def public_text(self, pk, comment: Optional[str] = None) -> str:
        return pk.to_text(comment)

    def public_line(self, pk) -> str:
        return pk.line

    def key_id_hex(self, pk) -> str:
        return pk.key_id_hex

    def load_public(self, text: str):
        return ours.PublicKey.from_text(text)

    def sign(self, data: bytes, sk, trusted: str, untrusted: Optional[str] = None, prehashed: bool = True) -> str:
        return ours.sign(data, sk, trusted, untrusted or ours.DEFAULT_UNTRUSTED, prehashed=prehashed)

    def signatures(self, text: str) -> list:
        return ours.parse_signatures(text)

    def sig_facts(self, sig) -> tuple[bytes, str, str]:
        return sig.alg, sig.trusted_comment, sig.untrusted_comment

    def verify(self, sig, data: bytes, pk) -> bool:
        return sig.verify(data, pk)

    def secret_text(self, sk, password: Optional[bytes] = None, ops: int = FAST_OPS, mem: int = FAST_MEM) -> str:
        return ours.secret_key_text(sk, password, ops, mem)

    def read_secret(self, text: str, password: Optional[bytes] = None):
        return ours.parse_secret_key(text, password)


class _PyMinisign:
    name = "py-minisign"

    def __init__(self, pm):
        self.pm = pm
        self.Error = pm.Error

    def generate(self):
        return self.pm.KeyPair.generate().secret_key

    def public(self, sk):
        return sk.get_public_key()

    def public_text(self, pk, comment: Optional[str] = None) -> str:
        pk = self.pm.PublicKey.from_base64(pk.to_base64())  # a copy: the comment is a mutable field
        pk.untrusted_comment = comment
        return bytes(pk).decode() + "\n"

    def public_line(self, pk) -> str:
        return pk.to_base64().decode()

    def key_id_hex(self, pk) -> str:
        """py-minisign has no key-id accessor: the id it prints is in its default .pub comment."""
        fresh = self.pm.PublicKey.from_base64(pk.to_base64())
        return bytes(fresh).decode().splitlines()[0].rsplit(" ", 1)[1]

    def load_public(self, text: str):
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) == 1:
            return self.pm.PublicKey.from_base64(lines[0].strip())
        return self.pm.PublicKey.from_bytes(text.encode())

    def sign(self, data: bytes, sk, trusted: str, untrusted: Optional[str] = None, prehashed: bool = True) -> str:
        return bytes(sk.sign(data, prehash=prehashed, trusted_comment=trusted,
                             untrusted_comment=untrusted)).decode() + "\n"

    def signatures(self, text: str) -> list:
        return [self.pm.Signature.from_bytes(text.encode())]  # its only reader: one signature per file

    def sig_facts(self, sig) -> tuple[bytes, str, str]:
        return sig._signature_algorithm.value, sig.trusted_comment, sig.untrusted_comment

    def verify(self, sig, data: bytes, pk) -> bool:
        try:
            pk.verify(data, sig)
        except self.pm.VerifyError:
            return False
        return True

    def secret_text(self, sk, password: Optional[bytes] = None, ops: int = FAST_OPS, mem: int = FAST_MEM) -> str:
        copy = self.pm.SecretKey.from_bytes(bytes(sk))
        if password is not None:
            copy.encrypt(password.decode("utf-8", "surrogateescape"), opslimit=ops, memlimit=mem)
        return bytes(copy).decode() + "\n"

    def read_secret(self, text: str, password: Optional[bytes] = None):
        sk = self.pm.SecretKey.from_bytes(text.encode())
        if password is not None:
            sk.decrypt(password.decode("utf-8", "surrogateescape"))  # it takes str, and encodes it as UTF-8
        if sk.is_encrypted():  # it reads an encrypted key without its password and refuses only at sign()
            sk.sign(b"")
        return sk


@pytest.fixture(params=["ours", "py-minisign"])
def impl(request):
    if request.param == "ours":
        return _Ours()
    pm = pytest.importorskip("minisign", reason="py-minisign is not installed")
    if not hasattr(pm, "KeyPair"):
        pytest.skip("the importable `minisign` is not py-minisign")
    return _PyMinisign(pm)


def _lacks(request, impl, why: str) -> None:
    """Mark this case a strict xfail for py-minisign: it must keep failing until py-minisign changes."""
    if impl.name == "py-minisign":
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"py-minisign: {why}"))


@pytest.fixture()
def signed(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.json"
    path.write_bytes(DATA)
    return path


@pytest.fixture(scope="module")
def minisign_unencrypted(tmp_path_factory) -> tuple[Path, Path]:
    if MINISIGN is None:
        pytest.skip("minisign is not installed")
    d = tmp_path_factory.mktemp("m")
    _minisign("-G", "-W", "-p", str(d / "m.pub"), "-s", str(d / "m.key"))
    return d / "m.pub", d / "m.key"


@pytest.fixture(scope="module")
def minisign_encrypted(tmp_path_factory) -> tuple[Path, Path]:
    """minisign -G at its own (sensitive) scrypt limits: 1 GiB, several seconds; made once."""
    if MINISIGN is None:
        pytest.skip("minisign is not installed")
    d = tmp_path_factory.mktemp("e")
    _minisign("-G", "-p", str(d / "m.pub"), "-s", str(d / "m.key"), stdin=PASSWORD + b"\n" + PASSWORD + b"\n")
    return d / "m.pub", d / "m.key"


# --- keys and key ids written by minisign ---


@needs_minisign
def test_reads_minisigns_public_key_file_and_bare_line(impl, minisign_unencrypted):
    pub, _ = minisign_unencrypted
    comment, line = pub.read_text().splitlines()
    pk = impl.load_public(pub.read_text())
    assert impl.load_public(line) == pk
    assert impl.public_line(pk) == line


@needs_minisign
def test_key_id_is_the_one_minisign_prints(request, impl, minisign_unencrypted):
    _lacks(request, impl, "prints key ids byte-reversed (key_id.hex(), not minisign's little-endian uint64); "
                          "and has no key-id accessor at all")
    pub, _ = minisign_unencrypted
    printed = _printed_id(pub.read_text())
    ours_id = impl.key_id_hex(impl.load_public(pub.read_text()))
    assert int(ours_id, 16) == int(printed, 16), f"{ours_id}, minisign: {printed}"


@needs_minisign
def test_the_pub_file_we_write_carries_minisigns_key_id(request, impl, tmp_path):
    _lacks(request, impl, "its default .pub comment names the key id byte-reversed")
    sk = impl.generate()
    (tmp_path / "k.pub").write_text(impl.public_text(impl.public(sk)))
    (tmp_path / "k.key").write_text(impl.secret_text(sk))
    recreated = _minisign("-R", "-s", str(tmp_path / "k.key"), "-p", str(tmp_path / "r.pub"))
    assert recreated.returncode == 0
    written, recreated = (tmp_path / "k.pub").read_text(), (tmp_path / "r.pub").read_text()
    assert written.splitlines()[1] == recreated.splitlines()[1]
    ours_id, printed = _printed_id(written), _printed_id(recreated)
    assert int(ours_id, 16) == int(printed, 16), f"{ours_id}, minisign -R: {printed}"


def _printed_id(pub_text: str) -> str:
    """The key id in a .pub's default comment, "untrusted comment: minisign public key <ID>"."""
    return pub_text.splitlines()[0].rsplit(" ", 1)[1]


@needs_minisign
def test_minisign_prints_a_key_id_without_leading_zeros(tmp_path):
    """minisign prints the id with "%" PRIX64 (no zero padding): 1 key in 16 has a shorter id there.
    Ours (and py-minisign) always write 16 digits; the ids compare equal as numbers, not as text."""
    sk = ours.generate()
    sk = ours.SecretKey(sk.key_id[:-1] + b"\0", sk.secret)  # the top byte of the little-endian id: 0
    (tmp_path / "k.key").write_text(ours.secret_key_text(sk))
    _minisign("-R", "-s", str(tmp_path / "k.key"), "-p", str(tmp_path / "r.pub"))
    printed = _printed_id((tmp_path / "r.pub").read_text())
    assert len(sk.key_id_hex) == 16 and sk.key_id_hex.startswith("00")
    assert printed == sk.key_id_hex.lstrip("0")


@needs_minisign
def test_reads_minisigns_unencrypted_secret_key(impl, minisign_unencrypted):
    pub, key = minisign_unencrypted
    raw = base64.b64decode(key.read_text().splitlines()[1])
    assert raw[2:4] == b"\0\0" and raw[-32:] == bytes(32)  # -G -W: no kdf, and minisign 0.11 leaves the checksum 0
    assert impl.public(impl.read_secret(key.read_text())) == impl.load_public(pub.read_text())


@needs_minisign
def test_reads_minisigns_encrypted_secret_key(impl, minisign_encrypted):
    pub, key = minisign_encrypted
    assert impl.public(impl.read_secret(key.read_text(), PASSWORD)) == impl.load_public(pub.read_text())


@needs_minisign
def test_a_pub_file_with_a_utf8_comment(request, impl, tmp_path, signed):
    """minisign reads a .pub whatever its comment says; fleet.trusted_keys may name such a file."""
    _lacks(request, impl, "PublicKey.from_bytes refuses any non-ASCII comment")
    sk = _Ours().generate()
    pub = tmp_path / "ops.pub"
    pub.write_text(f"untrusted comment: clé de l'équipe\n{sk.public_key.line}\n", encoding="utf-8")
    (tmp_path / "manifest.json.minisig").write_text(ours.sign(DATA, sk, COMMENT))
    _minisign("-V", "-q", "-m", str(signed), "-p", str(pub))
    assert impl.public_line(impl.load_public(pub.read_text(encoding="utf-8"))) == sk.public_key.line


# --- minisign's signatures, read and verified here ---


@needs_minisign
@pytest.mark.parametrize("legacy", [False, True])
def test_verifies_minisigns_signature_and_its_trusted_comment(impl, minisign_unencrypted, signed, legacy):
    pub, key = minisign_unencrypted
    _minisign("-S", *(["-l"] if legacy else []), "-s", str(key), "-m", str(signed), "-t", COMMENT)
    text = Path(f"{signed}.minisig").read_text()
    pk = impl.load_public(pub.read_text())
    (sig,) = impl.signatures(text)
    alg, trusted, untrusted = impl.sig_facts(sig)
    assert alg == (b"Ed" if legacy else b"ED") and trusted == COMMENT
    assert untrusted == "signature from minisign secret key"
    assert impl.verify(sig, DATA, pk)
    assert not impl.verify(sig, DATA + b"x", pk)
    (tampered,) = impl.signatures(text.replace("serial=4", "serial=5"))
    assert not impl.verify(tampered, DATA, pk)  # the global signature covers the trusted comment
    other = impl.public(impl.generate())
    assert not impl.verify(sig, DATA, other)


@needs_minisign
def test_verifies_minisigns_utf8_trusted_comment(impl, minisign_unencrypted, signed):
    pub, key = minisign_unencrypted
    _minisign("-S", "-s", str(key), "-m", str(signed), "-t", "modèle=activité")
    (sig,) = impl.signatures(Path(f"{signed}.minisig").read_text(encoding="utf-8"))
    assert impl.sig_facts(sig)[1] == "modèle=activité"
    assert impl.verify(sig, DATA, impl.load_public(pub.read_text()))


def test_several_signatures_concatenated(request, impl):
    """A release's minisig holds one signature per signer (publish.add_signature appends)."""
    _lacks(request, impl, "Signature.from_bytes reads exactly one signature (4 lines)")
    keys = [impl.generate() for _ in range(3)]
    text = "".join(impl.sign(DATA, sk, COMMENT) for sk in keys)
    sigs = impl.signatures(text)
    assert len(sigs) == 3
    assert all(impl.verify(sig, DATA, impl.public(sk)) for sig, sk in zip(sigs, keys))
    assert len(impl.signatures(text.replace("\n", "\r\n") + "\n\n")) == 3


# --- what we write, read by minisign ---


@needs_minisign
@pytest.mark.parametrize("prehashed", [True, False])
def test_minisign_verifies_our_signature(impl, tmp_path, signed, prehashed):
    sk = impl.generate()
    pk = impl.public(sk)
    pub = tmp_path / "k.pub"
    pub.write_text(impl.public_text(pk))
    sig = tmp_path / "manifest.json.minisig"
    sig.write_text(impl.sign(DATA, sk, COMMENT, prehashed=prehashed))
    out = _minisign("-V", *(["-H"] if prehashed else []), "-m", str(signed), "-p", str(pub))
    assert f"Trusted comment: {COMMENT}".encode() in out.stdout
    _minisign("-V", "-q", "-m", str(signed), "-P", impl.public_line(pk))
    signed.write_bytes(DATA + b" ")
    assert _minisign("-V", "-m", str(signed), "-p", str(pub), check=False).returncode != 0


@needs_minisign
def test_minisign_verifies_our_utf8_trusted_comment(request, impl, tmp_path, signed):
    _lacks(request, impl, "sign() refuses any trusted comment outside printable ASCII")
    sk = impl.generate()
    (tmp_path / "manifest.json.minisig").write_text(impl.sign(DATA, sk, "modèle=activité"), encoding="utf-8")
    out = _minisign("-V", "-m", str(signed), "-P", impl.public_line(impl.public(sk)))
    assert "Trusted comment: modèle=activité".encode() in out.stdout


@needs_minisign
@pytest.mark.parametrize("password", [None, PASSWORD])
def test_minisign_signs_with_our_secret_key(impl, tmp_path, signed, password):
    sk = impl.generate()
    key = tmp_path / "k.key"
    key.write_text(impl.secret_text(sk, password))
    _minisign("-S", "-s", str(key), "-m", str(signed), "-t", COMMENT, stdin=(password or b"") + b"\n")
    _minisign("-V", "-q", "-m", str(signed), "-P", impl.public_line(impl.public(sk)))


@needs_minisign
def test_a_password_that_is_not_utf8(request, impl, tmp_path, signed):
    """minisign takes the password as bytes (ours too: the password file's first line)."""
    _lacks(request, impl, "passwords are str, encoded as UTF-8: no str gives these bytes")
    password = b"caf\xe9"
    sk = ours.generate()
    key = tmp_path / "k.key"
    key.write_text(ours.secret_key_text(sk, password, FAST_OPS, FAST_MEM))
    _minisign("-S", "-s", str(key), "-m", str(signed), stdin=password + b"\n")  # minisign opens it
    assert impl.public_line(impl.public(impl.read_secret(key.read_text(), password))) == sk.public_key.line


# --- the limits minisign -V reads within: a signature it cannot read must not be written ---


@needs_minisign
def test_the_longest_trusted_comment_minisign_reads(impl, tmp_path, signed):
    sk = impl.generate()
    sig = tmp_path / "manifest.json.minisig"
    sig.write_text(impl.sign(DATA, sk, "v" * ours.TRUSTED_COMMENT_MAX_BYTES))
    _minisign("-V", "-q", "-m", str(signed), "-P", impl.public_line(impl.public(sk)))


@needs_minisign
def test_minisign_cannot_read_a_longer_trusted_comment(tmp_path, signed):
    """The limit above is minisign's: one byte more and -V fails (so a signer must refuse it)."""
    sk = ours.generate()
    signature = ours.sign(DATA, sk, "v" * ours.TRUSTED_COMMENT_MAX_BYTES)
    (tmp_path / "manifest.json.minisig").write_text(signature.replace("v\n", "vv\n"))
    assert _minisign("-V", "-q", "-m", str(signed), "-P", sk.public_key.line, check=False).returncode != 0


@pytest.mark.parametrize("extra", [1, 2])
def test_a_trusted_comment_minisign_cannot_read_is_refused(request, impl, tmp_path, signed, extra):
    _lacks(request, impl, "its limit is 8175 characters (8192 - prefix), not minisign's 8173 bytes "
                          "(the prefix, the newline and the NUL share minisign's 8192-byte buffer)")
    sk, long = impl.generate(), "v" * (ours.TRUSTED_COMMENT_MAX_BYTES + extra)
    try:
        text = impl.sign(DATA, sk, long)
    except impl.Error as exc:
        assert "trusted comment" in str(exc)
        return
    if MINISIGN is None:
        pytest.fail(f"signed a trusted comment of {len(long)} bytes")
    (tmp_path / "manifest.json.minisig").write_text(text)
    result = _minisign("-V", "-q", "-m", str(signed), "-P", impl.public_line(impl.public(sk)), check=False)
    pytest.fail(f"signed a trusted comment of {len(long)} bytes; minisign -V exit {result.returncode}: "
                f"{result.stderr.decode().strip()!r}")


def test_the_longest_trusted_comment_py_minisign_signs():
    """Where py-minisign's own limit is: 8175 characters (its TRUSTED_COMMENT_MAX_LEN)."""
    pm = pytest.importorskip("minisign", reason="py-minisign is not installed")
    if not hasattr(pm, "KeyPair"):
        pytest.skip("the importable `minisign` is not py-minisign")
    sk = pm.KeyPair.generate().secret_key
    assert pm.TRUSTED_COMMENT_MAX_LEN == 8175
    sk.sign(DATA, trusted_comment="v" * 8175)
    with pytest.raises(pm.ParseError, match="trusted comment too long"):
        sk.sign(DATA, trusted_comment="v" * 8176)


@needs_minisign
def test_the_longest_untrusted_comment_minisign_reads(impl, tmp_path, signed):
    sk = impl.generate()
    (tmp_path / "manifest.json.minisig").write_text(
        impl.sign(DATA, sk, COMMENT, "u" * ours.UNTRUSTED_COMMENT_MAX_BYTES))
    _minisign("-V", "-q", "-m", str(signed), "-P", impl.public_line(impl.public(sk)))


@needs_minisign
def test_an_untrusted_comment_minisign_cannot_read_is_refused(request, impl, tmp_path, signed):
    _lacks(request, impl, "no length limit on untrusted comments: it signs what minisign -V cannot read")
    sk = impl.generate()
    long = "u" * (ours.UNTRUSTED_COMMENT_MAX_BYTES + 1)
    try:
        text = impl.sign(DATA, sk, COMMENT, long)
    except impl.Error as exc:
        assert "untrusted comment" in str(exc)
        return
    (tmp_path / "manifest.json.minisig").write_text(text)
    result = _minisign("-V", "-q", "-m", str(signed), "-P", impl.public_line(impl.public(sk)), check=False)
    pytest.fail(f"signed an untrusted comment of {len(long)} bytes; minisign -V exit {result.returncode}: "
                f"{result.stderr.decode().strip()!r}")


# --- damaged keys ---


def _damaged(impl, offset: int) -> str:
    text = impl.secret_text(impl.generate())
    raw = bytearray(base64.b64decode(text.splitlines()[1]))
    raw[offset] ^= 1
    return f"untrusted comment: x\n{base64.b64encode(bytes(raw)).decode()}\n"


@pytest.mark.parametrize("where, offset", [("key id", 60), ("seed", 70), ("public half", 110)])
def test_a_damaged_unencrypted_key_is_refused(request, impl, where, offset):
    _lacks(request, impl, "checks no checksum on an unencrypted key, nor the public half against the seed")
    try:
        sk = impl.read_secret(_damaged(impl, offset))
    except impl.Error:
        return
    sig = impl.sign(DATA, sk, COMMENT)
    (parsed,) = impl.signatures(sig)
    pytest.fail(f"read a key with its {where} damaged; its own public key verifies what it signs: "
                f"{impl.verify(parsed, DATA, impl.public(sk))}")


# --- errors and messages the fleet code and its tests rely on ---


def _encrypted_text(impl) -> str:
    return impl.secret_text(impl.generate(), PASSWORD)


@pytest.mark.parametrize("case, call, message", [
    ("wrong password", lambda i: i.read_secret(_encrypted_text(i), b"wrong"), "wrong password"),
    ("no password", lambda i: i.read_secret(_encrypted_text(i)), "encrypted"),
    ("a two-line trusted comment", lambda i: i.sign(DATA, i.generate(), "a\nb"), "one line"),
    ("a two-line untrusted comment", lambda i: i.sign(DATA, i.generate(), COMMENT, "a\nb"), "one line"),
    ("a bad public key", lambda i: i.load_public("RWQ="), "public key"),
    ("a bad signature file", lambda i: i.signatures("untrusted comment: x\n"), "signature"),
])
def test_errors_are_minisign_errors_with_our_messages(request, impl, case, call, message):
    """release.py, commands.py and fleet_node.py catch MinisignError (a DaemonError: one line at the CLI)."""
    _lacks(request, impl, "its errors are minisign.Error (a ValueError, not a DaemonError), worded otherwise")
    with pytest.raises(ours.MinisignError, match=re.escape(message)):
        call(impl)


# --- scrypt ---


@pytest.mark.parametrize("limits, expected", [
    ((ours.OPSLIMIT_SENSITIVE, ours.MEMLIMIT_SENSITIVE), (20, 8, 1)),  # what minisign -G writes
    ((FAST_OPS, FAST_MEM), (14, 8, 2)),
    ((0, 1 << 30), (10, 8, 1)),  # libsodium raises opslimit to its floor
])
def test_scrypt_parameters_are_libsodiums(impl, limits, expected):
    if impl.name == "ours":
        assert ours.scrypt_params(*limits) == expected
    else:
        from minisign.scrypt import scrypt_params_from_limits
        n, r, p = scrypt_params_from_limits(*limits)
        assert (n.bit_length() - 1, r, p) == expected


def test_default_encryption_limits_are_minisigns(request, impl):
    """minisign -G encrypts at libsodium's *_SENSITIVE limits; `fleet keygen` does the same."""
    _lacks(request, impl, "SecretKey.encrypt() defaults to opslimit 2^20, memlimit 2^25 (32 MiB), not minisign's")
    if impl.name == "ours":
        import inspect
        defaults = inspect.signature(ours.secret_key_text).parameters
        limits = defaults["opslimit"].default, defaults["memlimit"].default
    else:
        limits = impl.pm.OPSLIMIT, impl.pm.MEMLIMIT
    assert limits == (ours.OPSLIMIT_SENSITIVE, ours.MEMLIMIT_SENSITIVE)
