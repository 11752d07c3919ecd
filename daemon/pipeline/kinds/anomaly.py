"""Anomaly detection with an autoencoder: the model's reconstruction of its input -> a score.

An autoencoder trained on normal data reconstructs normal inputs well and anomalies badly,
so the score of a row is its mean squared reconstruction error. Both arrays are in the
model's float input units (the input after preprocessing, the output dequantized), so a
threshold chosen by `edge-inferd validate` (daemon/pipeline/scoring.py) keeps its meaning.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

SCORE_DECIMALS = 6


def anomaly_score(x: np.ndarray, reconstruction: np.ndarray) -> np.ndarray:
    """Per row (the first axis is the batch) mean squared error over all its other values."""
    x = np.asarray(x, dtype=np.float64)
    reconstruction = np.asarray(reconstruction, dtype=np.float64)
    if x.shape != reconstruction.shape:
        raise ValueError(f"input {x.shape} and reconstruction {reconstruction.shape} differ in shape")
    if x.ndim == 0:
        raise ValueError("anomaly_score needs a batch axis: got a scalar")
    per_row = int(np.prod(x.shape[1:]))
    if per_row == 0:
        raise ValueError(f"rows of shape {x.shape[1:]} hold no values to compare")
    # Accumulated in float64: a row of many small float32 errors would lose digits otherwise.
    error = (x - reconstruction).reshape(x.shape[0], per_row)
    return np.mean(error * error, axis=1)


def to_reply(score: float, threshold: Optional[float]) -> dict:
    """The reply's fields: the score, and with a threshold set, whether it is above it."""
    reply: dict = {"anomaly_score": round(float(score), SCORE_DECIMALS)}
    if threshold is not None:
        # Compared unrounded: the rounded score shown is for reading, not for the decision.
        reply["anomaly"] = bool(score > threshold)
        reply["threshold"] = float(threshold)
    return reply
