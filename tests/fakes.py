"""Test doubles shared by the unit tests."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from daemon.model.interface import TensorSpec


class FakeClock:
    """A clock set by hand: calling it returns `now`, which a test assigns or advances."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class DictCache:
    """A dict behind the pipeline's ScoreCache protocol (no tiers, no expiry)."""

    def __init__(self):
        self.rows: dict = {}

    def get_many(self, keys, invoke_cost_s=0.0):
        return [self.rows.get(k) for k in keys]

    def put_many(self, items, invoke_cost_s=0.0):
        self.rows.update(items)  # admits everything: the pipeline's tests see the cache's protocol only


def tensor_spec(shape, dtype=np.float32, name="t", scale=0.0, zero_point=0, index=0) -> TensorSpec:
    """A model tensor as an interpreter would describe it (its signature: its shape)."""
    return TensorSpec(index, name, tuple(shape), tuple(shape), np.dtype(dtype), scale, zero_point)


def png_claiming(width: int, height: int) -> bytes:
    """A ~60-byte PNG whose IHDR claims width x height (valid CRCs, a one-byte IDAT): a decompression bomb."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b"")
