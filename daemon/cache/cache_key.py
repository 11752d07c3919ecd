"""The cache key: a digest of the model and of its quantized input, one sample.

The same integer input gives exactly the same output, so float inputs that quantize
alike share an entry. hashlib only: the pure pipeline computes keys without importing
any storage library.
"""

from __future__ import annotations

import hashlib

import numpy as np


def make_key(model_sha256: str, int8_input: np.ndarray) -> str:
    """sha256 hex over the model digest, the tensor's dtype and shape, and its bytes."""
    header = f"{model_sha256}\0{int8_input.dtype.str}\0{int8_input.shape}\0".encode()
    digest = hashlib.sha256(header)
    digest.update(np.ascontiguousarray(int8_input))  # a no-op view for the usual C-ordered input
    return digest.hexdigest()
