"""minisign's key and signature formats (https://jedisct1.github.io/minisign/), in Python.

Ed25519 comes from `cryptography`, BLAKE2b and scrypt from hashlib, so a gateway needs no
libsodium or minisign binary to check a release; tests/fleet/release/test_minisign.py checks every
format against Debian's minisign 0.11 in both directions.

Formats (all binary fields base64 on one line, integers little-endian):
- public key: "Ed" + key id (8) + Ed25519 public key (32), after an `untrusted comment:` line;
- secret key: "Ed" + kdf ("Sc" scrypt or "\\0\\0" none) + "B2" + salt (32) + opslimit (8) +
  memlimit (8) + [key id (8) + libsodium secret key (seed 32 + public 32) + checksum (32)],
  the bracket XORed with a scrypt stream when the kdf is "Sc";
- signature: an `untrusted comment:` line; alg ("ED": Ed25519 over BLAKE2b-512 of the data,
  "Ed": over the data itself) + key id + signature (64); a `trusted comment:` line; the
  global signature (64), Ed25519 over the signature bytes and the trusted comment's bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from daemon.errors import DaemonError

KEY_ALG = b"Ed"
LEGACY_ALG = b"Ed"  # a signature of the data itself: minisign before 0.11 (and -l)
PREHASHED_ALG = b"ED"  # a signature of BLAKE2b-512(data): minisign 0.11's default
SIGNATURE_ALGS = (PREHASHED_ALG, LEGACY_ALG)
KDF_SCRYPT = b"Sc"
KDF_NONE = b"\0\0"
CHECKSUM_ALG = b"B2"
ALG_BYTES = 2
KEY_ID_BYTES = 8
PUBLIC_BYTES = 32
SEED_BYTES = 32
SECRET_BYTES = SEED_BYTES + PUBLIC_BYTES  # libsodium's secret key: the seed, then the public key
SIGNATURE_BYTES = 64
CHECKSUM_BYTES = 32
SALT_BYTES = 32
PREHASH_BYTES = 64
PUBLIC_KEY_BYTES = ALG_BYTES + KEY_ID_BYTES + PUBLIC_BYTES
SIGNATURE_LINE_BYTES = ALG_BYTES + KEY_ID_BYTES + SIGNATURE_BYTES
_SECRET_HEAD = struct.Struct("<2s2s2s32sQQ")  # sig alg, kdf alg, checksum alg, salt, opslimit, memlimit
KEYNUM_SK_BYTES = KEY_ID_BYTES + SECRET_BYTES + CHECKSUM_BYTES
SECRET_KEY_BYTES = _SECRET_HEAD.size + KEYNUM_SK_BYTES
# What minisign -G asks libsodium for (crypto_pwhash_scryptsalsa208sha256_*_SENSITIVE): N = 2^20,
# r = 8, p = 1, so 1 GiB of memory and a few seconds to open the key.
OPSLIMIT_SENSITIVE = 33554432
MEMLIMIT_SENSITIVE = 1073741824
# libsodium's pickparams(): its floor on opslimit, its fixed r, and the largest N (2^62).
_SCRYPT_MIN_OPSLIMIT = 32768
_SCRYPT_R = 8
_SCRYPT_MAX_N_LOG2 = 63
_SCRYPT_MAX_RP = 0x3FFFFFFF
_SCRYPT_BLOCK = 128  # bytes per r of one scrypt block
_MAXMEM_LIMIT = 2**31 - 1  # hashlib.scrypt's maxmem is a C int
UNTRUSTED_PREFIX = "untrusted comment: "
TRUSTED_PREFIX = "trusted comment: "
SIGNATURE_LINES = 4
# minisign -V reads the trusted comment line into an 8192-byte buffer (TRUSTEDCOMMENTMAXBYTES), its prefix,
# newline and NUL included: a longer comment signs here but fails there (checked against 0.11 by hand).
TRUSTED_COMMENT_MAX_BYTES = 8192 - len(TRUSTED_PREFIX) - 2
# Likewise an untrusted comment line (COMMENTMAXBYTES, 1024): a longer one breaks minisign's reading of the file.
UNTRUSTED_COMMENT_MAX_BYTES = 1024 - len(UNTRUSTED_PREFIX) - 2
DEFAULT_UNTRUSTED = "signature from minisign secret key"
SECRET_FILE_MODE = 0o600


class MinisignError(DaemonError):
    """A key or signature file that cannot be read (bad format, wrong password), or a key refused."""


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MinisignError(f"{what}: not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hex_id(key_id: bytes) -> str:
    """As minisign prints a key id: the little-endian uint64, in upper-case hex."""
    return key_id[::-1].hex().upper()


@dataclass(frozen=True)
class PublicKey:
    key_id: bytes
    key: bytes

    def __post_init__(self):
        if len(self.key_id) != KEY_ID_BYTES or len(self.key) != PUBLIC_BYTES:
            raise MinisignError("public key: wrong length")

    @classmethod
    def from_text(cls, text: str) -> "PublicKey":
        """A .pub file's text (comment line, key line) or the bare base64 key line."""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines and lines[0].startswith(UNTRUSTED_PREFIX.strip()):
            lines = lines[1:]
        if len(lines) != 1:
            raise MinisignError("public key: expected one base64 line (after an optional untrusted comment)")
        raw = _b64decode(lines[0], "public key")
        if len(raw) != PUBLIC_KEY_BYTES or raw[:ALG_BYTES] != KEY_ALG:
            raise MinisignError(f"public key: not an Ed25519 minisign key ({len(raw)} bytes)")
        return cls(raw[ALG_BYTES:ALG_BYTES + KEY_ID_BYTES], raw[ALG_BYTES + KEY_ID_BYTES:])

    @property
    def key_id_hex(self) -> str:
        return _hex_id(self.key_id)

    @property
    def line(self) -> str:
        """The bare base64 line, what `minisign -P` and `fleet.trusted_keys` take."""
        return _b64(KEY_ALG + self.key_id + self.key)

    def to_text(self, comment: Optional[str] = None) -> str:
        comment = _untrusted(comment or f"minisign public key {self.key_id_hex}")
        return f"{UNTRUSTED_PREFIX}{comment}\n{self.line}\n"

    def verifier(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.key)


@dataclass(frozen=True)
class SecretKey:
    key_id: bytes
    secret: bytes
    """libsodium's 64-byte secret key: the Ed25519 seed, then the public key."""

    def __post_init__(self):
        if len(self.key_id) != KEY_ID_BYTES or len(self.secret) != SECRET_BYTES:
            raise MinisignError("secret key: wrong length")
        derived = self.signer().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        if derived != self.secret[SEED_BYTES:]:
            raise MinisignError("secret key: its public half does not match its seed (a damaged key file)")

    @property
    def public_key(self) -> PublicKey:
        return PublicKey(self.key_id, self.secret[SEED_BYTES:])

    @property
    def key_id_hex(self) -> str:
        return _hex_id(self.key_id)

    def signer(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.secret[:SEED_BYTES])


def generate() -> SecretKey:
    """A new key pair with a random key id, as `minisign -G` makes."""
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SecretKey(os.urandom(KEY_ID_BYTES), seed + public)


# --- secret key files ---


def _checksum(key_id: bytes, secret: bytes) -> bytes:
    return hashlib.blake2b(KEY_ALG + key_id + secret, digest_size=CHECKSUM_BYTES).digest()


def scrypt_params(opslimit: int, memlimit: int) -> tuple[int, int, int]:
    """(log2 N, r, p) from opslimit and memlimit, as libsodium's crypto_pwhash_scryptsalsa208sha256
    picks them (pickparams() in crypto_pwhash/scryptsalsa208sha256/pwhash_scryptsalsa208sha256.c):
    minisign's file keeps only the two limits."""
    opslimit = max(opslimit, _SCRYPT_MIN_OPSLIMIT)
    r = _SCRYPT_R
    if opslimit < memlimit // 32:
        p, max_n = 1, opslimit // (r * 4)
        return _n_log2(max_n), r, p
    n_log2 = _n_log2(memlimit // (r * _SCRYPT_BLOCK))
    max_rp = min((opslimit // 4) // (1 << n_log2), _SCRYPT_MAX_RP)
    return n_log2, r, max_rp // r


def _n_log2(max_n: int) -> int:
    n_log2 = 1
    while n_log2 < _SCRYPT_MAX_N_LOG2 and (1 << n_log2) <= max_n // 2:
        n_log2 += 1
    return n_log2


def _scrypt_stream(password: bytes, salt: bytes, opslimit: int, memlimit: int) -> bytes:
    n_log2, r, p = scrypt_params(opslimit, memlimit)
    # scrypt's own working set: V (128 r N) and B (128 r p), with a little room for OpenSSL's bookkeeping.
    needed = _SCRYPT_BLOCK * r * ((1 << n_log2) + 2 + p) + (1 << 16)
    if p < 1 or needed > _MAXMEM_LIMIT:
        raise MinisignError(f"secret key: scrypt parameters out of reach (N=2^{n_log2}, r={r}, p={p})")
    return hashlib.scrypt(password, salt=salt, n=1 << n_log2, r=r, p=p, maxmem=needed, dklen=KEYNUM_SK_BYTES)


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


def parse_secret_key(text: str, password: Optional[bytes] = None) -> SecretKey:
    """A secret key file's text: unencrypted (`minisign -G -W`) or scrypt-encrypted with `password`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 2 or not lines[0].startswith(UNTRUSTED_PREFIX.strip()):
        raise MinisignError("secret key: expected an untrusted comment line and one base64 line")
    raw = _b64decode(lines[1], "secret key")
    if len(raw) != SECRET_KEY_BYTES:
        raise MinisignError(f"secret key: {len(raw)} bytes, a minisign secret key has {SECRET_KEY_BYTES}")
    sig_alg, kdf, chk_alg, salt, opslimit, memlimit = _SECRET_HEAD.unpack_from(raw)
    if sig_alg != KEY_ALG or chk_alg != CHECKSUM_ALG:
        raise MinisignError(f"secret key: unsupported algorithms {sig_alg!r}/{chk_alg!r}")
    keynum = raw[_SECRET_HEAD.size:]
    if kdf == KDF_SCRYPT:
        if password is None:
            raise MinisignError("secret key: it is encrypted; give its password")
        keynum = _xor(keynum, _scrypt_stream(password, salt, opslimit, memlimit))
    elif kdf != KDF_NONE:
        raise MinisignError(f"secret key: unsupported key derivation {kdf!r}")
    key_id, secret = keynum[:KEY_ID_BYTES], keynum[KEY_ID_BYTES:KEY_ID_BYTES + SECRET_BYTES]
    checksum = keynum[KEY_ID_BYTES + SECRET_BYTES:]
    # minisign 0.11's `-G -W` leaves the checksum of an unencrypted key all zeros (it computes
    # it only on the way to encrypting); the seed/public check in SecretKey still catches damage.
    unchecked = kdf == KDF_NONE and checksum == bytes(CHECKSUM_BYTES)
    if not unchecked and checksum != _checksum(key_id, secret):
        raise MinisignError("secret key: wrong password" if kdf == KDF_SCRYPT else "secret key: bad checksum")
    return SecretKey(key_id, secret)


def read_secret_key(path: Path | str, password: Optional[bytes] = None) -> SecretKey:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MinisignError(f"{path}: cannot read the secret key ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return parse_secret_key(text, password)
    except MinisignError as exc:
        raise MinisignError(f"{path}: {exc}") from None


def secret_key_text(sk: SecretKey, password: Optional[bytes] = None, opslimit: int = OPSLIMIT_SENSITIVE,
                    memlimit: int = MEMLIMIT_SENSITIVE) -> str:
    """The file's text: unencrypted when `password` is None (opslimit and memlimit 0, as `-W`)."""
    keynum = sk.key_id + sk.secret + _checksum(sk.key_id, sk.secret)
    if password is None:
        head = _SECRET_HEAD.pack(KEY_ALG, KDF_NONE, CHECKSUM_ALG, bytes(SALT_BYTES), 0, 0)
        comment = "minisign secret key"
    else:
        salt = os.urandom(SALT_BYTES)
        head = _SECRET_HEAD.pack(KEY_ALG, KDF_SCRYPT, CHECKSUM_ALG, salt, opslimit, memlimit)
        keynum = _xor(keynum, _scrypt_stream(password, salt, opslimit, memlimit))
        comment = "minisign encrypted secret key"
    return f"{UNTRUSTED_PREFIX}{comment}\n{_b64(head + keynum)}\n"


def write_secret_key(path: Path | str, sk: SecretKey, password: Optional[bytes] = None,
                     opslimit: int = OPSLIMIT_SENSITIVE, memlimit: int = MEMLIMIT_SENSITIVE) -> None:
    """Write a new key file, readable by its owner only; an existing file is never replaced."""
    text = secret_key_text(sk, password, opslimit, memlimit)
    try:
        # O_EXCL with the mode at creation: the key is never, even briefly, readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
    except FileExistsError:
        raise MinisignError(f"{path}: already exists; not overwriting a key") from None
    except OSError as exc:
        raise MinisignError(f"{path}: cannot create the secret key ({exc.strerror or exc})") from None
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(text)


def load_public_key(entry: str, base: Path) -> PublicKey:
    """A `fleet.trusted_keys` entry: a bare base64 key, else a path to a .pub file (relative to `base`)."""
    entry = entry.strip()
    try:
        return PublicKey.from_text(entry)
    except MinisignError:
        pass
    path = Path(entry) if Path(entry).is_absolute() else base / entry
    try:
        text = path.read_text(encoding="utf-8")  # its comment may be any text
    except (OSError, UnicodeDecodeError) as exc:
        raise MinisignError(f"{entry}: neither a minisign public key nor a readable .pub file "
                            f"({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return PublicKey.from_text(text)
    except MinisignError as exc:
        raise MinisignError(f"{path}: {exc}") from None


# --- signatures ---


def _signed_message(data: bytes, alg: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=PREHASH_BYTES).digest() if alg == PREHASHED_ALG else data


@dataclass(frozen=True)
class Signature:
    alg: bytes
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes
    untrusted_comment: str = ""

    @property
    def key_id_hex(self) -> str:
        return _hex_id(self.key_id)

    def verify(self, data: bytes, pk: PublicKey) -> bool:
        """True when `pk` made this signature of `data` and of its trusted comment (the global signature)."""
        if self.key_id != pk.key_id or self.alg not in SIGNATURE_ALGS:
            return False
        try:
            verifier = pk.verifier()
            verifier.verify(self.signature, _signed_message(data, self.alg))
            verifier.verify(self.global_signature, self.signature + self.trusted_comment.encode("utf-8"))
        except (InvalidSignature, ValueError):  # ValueError: 32 bytes that are not a curve point
            return False
        return True

    def to_text(self) -> str:
        return (f"{UNTRUSTED_PREFIX}{self.untrusted_comment}\n{_b64(self.alg + self.key_id + self.signature)}\n"
                f"{TRUSTED_PREFIX}{self.trusted_comment}\n{_b64(self.global_signature)}\n")


def _one_line(text: str, what: str) -> str:
    if "\n" in text or "\r" in text:
        raise MinisignError(f"{what} must be one line")
    return text


def _untrusted(comment: str) -> str:
    if len(_one_line(comment, "untrusted comment").encode("utf-8")) > UNTRUSTED_COMMENT_MAX_BYTES:
        raise MinisignError(f"untrusted comment: longer than the {UNTRUSTED_COMMENT_MAX_BYTES} bytes minisign reads")
    return comment


def sign(data: bytes, sk: SecretKey, trusted_comment: str, untrusted_comment: str = DEFAULT_UNTRUSTED,
         prehashed: bool = True) -> str:
    """A signature file's text (4 lines): prehashed "ED" as minisign 0.11 signs, or legacy "Ed"."""
    trusted = _one_line(trusted_comment, "trusted comment")
    if len(trusted.encode("utf-8")) > TRUSTED_COMMENT_MAX_BYTES:
        raise MinisignError(f"trusted comment: longer than the {TRUSTED_COMMENT_MAX_BYTES} bytes minisign reads")
    alg = PREHASHED_ALG if prehashed else LEGACY_ALG
    signer = sk.signer()
    signature = signer.sign(_signed_message(data, alg))
    global_signature = signer.sign(signature + trusted.encode("utf-8"))
    return Signature(alg, sk.key_id, signature, trusted, global_signature, _untrusted(untrusted_comment)).to_text()


def parse_signatures(text: str) -> list[Signature]:
    """Every signature of a .minisig file: one, or several concatenated (4 lines each; blank lines between
    them are allowed). MinisignError for anything malformed, and for a file with none."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    lines = [line for line in lines if line.strip()]
    if not lines or len(lines) % SIGNATURE_LINES:
        raise MinisignError(f"signature file: {len(lines)} lines; each signature has {SIGNATURE_LINES}")
    return [_parse_one(lines[i:i + SIGNATURE_LINES], i // SIGNATURE_LINES + 1)
            for i in range(0, len(lines), SIGNATURE_LINES)]


def _parse_one(lines: list[str], number: int) -> Signature:
    what = f"signature {number}"
    untrusted, sig_line, trusted, global_line = lines
    if not untrusted.startswith(UNTRUSTED_PREFIX):
        raise MinisignError(f"{what}: its first line is not an untrusted comment")
    if not trusted.startswith(TRUSTED_PREFIX):
        raise MinisignError(f"{what}: its third line is not a trusted comment")
    raw = _b64decode(sig_line, what)
    if len(raw) != SIGNATURE_LINE_BYTES or raw[:ALG_BYTES] not in SIGNATURE_ALGS:
        raise MinisignError(f"{what}: not an Ed25519 minisign signature")
    global_signature = _b64decode(global_line, f"{what}'s global signature")
    if len(global_signature) != SIGNATURE_BYTES:
        raise MinisignError(f"{what}: the global signature has {len(global_signature)} bytes")
    return Signature(raw[:ALG_BYTES], raw[ALG_BYTES:ALG_BYTES + KEY_ID_BYTES], raw[ALG_BYTES + KEY_ID_BYTES:],
                     trusted[len(TRUSTED_PREFIX):], global_signature, untrusted[len(UNTRUSTED_PREFIX):])
