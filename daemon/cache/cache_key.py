"""The cache key: a 128-bit blake2b digest of the model and of its quantized input, one sample.

The same integer input gives exactly the same output, so float inputs that quantize
alike share an entry. The digest covers the model's sha256, the tensor's dtype and shape
(hashed once per batch, then copied per row) and the row's bytes. The preprocessing is not
in it on purpose: the key is made of the model's own input tensor, after preprocessing, so
two routes whose steps differ but give the same tensor get the same answer from the model,
and may share it.

Why 128 bits, as bytes: the first 64 bits are the hash (the doorkeeper's bits come from
them too, doorkeeper.py), the other 64 are the check. A dict compares the whole key on a
hit, so two inputs share an entry only when all 128 bits agree: with N entries about
N²/2^129, 1e-27 for a million. A 16-byte `bytes` costs 49 bytes in memory, against 113 for
the sha256 hex `str` this replaced, and hashes at half its cost (benchmarks/bench_cache.py).
hashlib only: the pure pipeline computes keys without importing any storage library.
"""

from __future__ import annotations

import hashlib

import numpy as np

KEY_BYTES = 16


def make_keys(model_sha256: str, batch: np.ndarray) -> list[bytes]:
    """One key per row of `batch` (N, *sample_shape), the model's input tensor."""
    batch = np.ascontiguousarray(batch)  # a no-op for the usual C-ordered input; keys go by value
    header = f"{model_sha256}\0{batch.dtype.str}\0{batch.shape[1:]}\0".encode()
    base = hashlib.blake2b(header, digest_size=KEY_BYTES)
    keys = []
    for row in batch:
        digest = base.copy()
        digest.update(row)
        keys.append(digest.digest())
    return keys


def make_key(model_sha256: str, sample: np.ndarray) -> bytes:
    """The key of one sample (`sample` without the batch dimension)."""
    return make_keys(model_sha256, sample[None])[0]
