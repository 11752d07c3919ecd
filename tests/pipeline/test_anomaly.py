"""Autoencoder scoring (daemon/pipeline/kinds/anomaly.py): per-row reconstruction error and the reply."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.pipeline.kinds.anomaly import anomaly_score, to_reply


def test_anomaly_score_is_each_rows_mean_squared_error_over_any_trailing_shape():
    x = np.array([[[0.0, 0.0], [0.0, 0.0]],
                  [[1.0, 2.0], [3.0, 4.0]]])
    reconstruction = np.array([[[0.5, -0.5], [0.5, 0.5]],       # errors 0.5 each: 0.25
                               [[0.0, 3.0], [3.0, 2.0]]])       # errors 1, -1, 0, 2: 6 / 4
    assert anomaly_score(x, reconstruction).tolist() == [0.25, 1.5]


def test_anomaly_score_of_a_flat_batch_is_each_values_squared_error():
    assert anomaly_score(np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 3.5])).tolist() == [0.0, 4.0, 0.25]


def test_anomaly_score_is_float64_for_float32_input():
    x = np.full((1, 4), 0.1, dtype=np.float32)
    score = anomaly_score(x, np.zeros((1, 4), dtype=np.float32))
    assert score.dtype == np.float64 and score[0] == pytest.approx(0.01)


def test_anomaly_score_of_an_empty_batch_is_empty():
    assert anomaly_score(np.zeros((0, 3)), np.zeros((0, 3))).shape == (0,)


@pytest.mark.parametrize("x, reconstruction, problem", [
    (np.zeros((2, 3)), np.zeros((2, 4)), "differ in shape"),
    (np.float64(1.0), np.float64(1.0), "batch axis"),
    (np.zeros((2, 0)), np.zeros((2, 0)), "no values"),
])
def test_anomaly_score_refuses_arrays_it_cannot_compare(x, reconstruction, problem):
    with pytest.raises(ValueError, match=problem):
        anomaly_score(x, reconstruction)


def test_to_reply_without_a_threshold_gives_the_score_only():
    assert to_reply(0.12345678, None) == {"anomaly_score": 0.123457}


@pytest.mark.parametrize("score, anomaly", [(0.5, True), (0.05, False), (0.1, False)])
def test_to_reply_with_a_threshold_says_whether_the_score_is_above_it(score, anomaly):
    assert to_reply(score, 0.1) == {"anomaly_score": score, "anomaly": anomaly, "threshold": 0.1}


def test_to_reply_decides_on_the_unrounded_score():
    assert to_reply(0.1000000004, 0.1) == {"anomaly_score": 0.1, "anomaly": True, "threshold": 0.1}


def test_to_reply_gives_plain_floats_for_numpy_scalars():
    reply = to_reply(np.float32(0.25), np.float64(0.5))
    assert [type(v) for v in reply.values()] == [float, bool, float]
