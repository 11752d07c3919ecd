"""Each preprocessing step against a direct (loop) reference computation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from daemon.model import preprocess as pp

RNG = np.random.default_rng(7)


def test_downsample_is_the_mean_of_each_group():
    x = RNG.standard_normal((3, 12, 2)).astype(np.float32)
    out = pp.Downsample(factor=4, axis=0).apply(x)
    ref = np.array([[[x[n, 4 * i : 4 * i + 4, c].mean() for c in range(2)] for i in range(3)] for n in range(3)])
    assert out.shape == (3, 3, 2) and np.allclose(out, ref)
    assert pp.Downsample(factor=4).out_shape((12, 2)) == (3, 2)
    with pytest.raises(ValueError, match="not a multiple"):
        pp.Downsample(factor=5).out_shape((12, 2))


def test_downsample_on_another_axis():
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    out = pp.Downsample(factor=2, axis=1).apply(x)
    assert np.allclose(out, (x[:, :, 0::2] + x[:, :, 1::2]) / 2)


def test_normalize_scalar_and_per_channel():
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    assert np.allclose(pp.Normalize(mean=1.0, std=2.0).apply(x), (x - 1.0) / 2.0)
    step = pp.Normalize(mean=(1.0, 2.0, 3.0), std=(1.0, 0.5, 4.0))
    ref = np.stack([(x[..., c] - m) / s for c, (m, s) in enumerate([(1, 1), (2, 0.5), (3, 4)])], axis=-1)
    assert np.allclose(step.apply(x), ref)
    with pytest.raises(ValueError, match="3 values but the input has 2"):
        step.out_shape((5, 2))
    with pytest.raises(ValueError, match="std must not be 0"):
        pp.Normalize(std=0.0).out_shape((5,))


def test_standardize_is_a_per_sample_per_channel_zscore():
    x = (RNG.standard_normal((2, 40, 2)) * 50 + 300).astype(np.float32)
    out = pp.Standardize(axis=0).apply(x)
    for n in range(2):
        for c in range(2):
            col = x[n, :, c].astype(np.float64)
            assert np.allclose(out[n, :, c], (col - col.mean()) / (col.std() + 1e-6), atol=1e-4)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=2, max_size=3), axis=st.integers(0, 1),
       dtype=st.sampled_from([np.float32, np.float64, np.int16, np.uint8]), seed=st.integers(0, 2**32 - 1),
       spread=st.floats(1e-3, 1e4), offset=st.floats(-1e5, 1e5))
def test_standardize_gives_the_bits_of_numpy_s_mean_and_std(shape, axis, dtype, seed, spread, offset):
    """Its shortcut for float batches (one reduce each, the centred values kept) changes no bit."""
    rng = np.random.default_rng(seed)
    values = rng.normal(offset, spread, size=shape)
    if np.issubdtype(dtype, np.integer):
        values = np.clip(values, np.iinfo(dtype).min, np.iinfo(dtype).max)
    batch = values.astype(dtype)
    step = pp.Standardize(axis=axis % (batch.ndim - 1))
    mean = batch.mean(axis=step.axis + 1, keepdims=True)
    expected = (batch - mean) / (batch.std(axis=step.axis + 1, keepdims=True) + step.eps)
    out = step.apply(batch)
    assert out.dtype == expected.dtype and np.array_equal(out, expected, equal_nan=True)


def test_clip_limits_values():
    x = np.array([[-5.0, -1.0, 0.5, 9.0]], np.float32)
    assert pp.Clip(min=-3, max=3).apply(x).tolist() == [[-3.0, -1.0, 0.5, 3.0]]
    with pytest.raises(ValueError, match="must be below"):
        pp.Clip(min=1, max=1).out_shape((4,))


def test_window_keeps_the_last_samples_and_pads_at_the_front():
    x = np.arange(10, dtype=np.float32).reshape(1, 10)
    assert pp.Window(size=4).apply(x).tolist() == [[6, 7, 8, 9]]
    assert pp.Window(size=13).apply(x).tolist() == [[0, 0, 0] + list(range(10))]
    assert pp.Window(size=4).out_shape((10,)) == (4,)


def test_transpose_and_reshape():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert np.array_equal(pp.Transpose(axes=(1, 0)).apply(x), x.transpose(0, 2, 1))
    assert pp.Reshape(shape=(12, 1)).apply(x).shape == (2, 12, 1)
    with pytest.raises(ValueError, match="cannot reshape"):
        pp.Reshape(shape=(5,)).out_shape((3, 4))
    with pytest.raises(ValueError, match="not a permutation"):
        pp.Transpose(axes=(0, 0)).out_shape((3, 4))


def test_resize_matches_a_direct_bilinear_reference():
    x = RNG.uniform(0, 255, (1, 4, 6, 3)).astype(np.float32)
    out = pp.Resize(height=8, width=3).apply(x)

    def sample(img, fy, fx):
        y0, x0 = int(np.floor(fy)), int(np.floor(fx))
        y1, x1 = min(y0 + 1, img.shape[0] - 1), min(x0 + 1, img.shape[1] - 1)
        wy, wx = fy - y0, fx - x0
        top = img[y0, x0] * (1 - wx) + img[y0, x1] * wx
        bottom = img[y1, x0] * (1 - wx) + img[y1, x1] * wx
        return top * (1 - wy) + bottom * wy

    def src(i, dst, n):
        return min(max((i + 0.5) * n / dst - 0.5, 0), n - 1)

    ref = np.array([[sample(x[0], src(i, 8, 4), src(j, 3, 6)) for j in range(3)] for i in range(8)])
    assert out.shape == (1, 8, 3, 3) and np.allclose(out[0], ref, atol=1e-3)
    assert np.allclose(pp.Resize(height=4, width=6).apply(x), x)  # same size is the identity


def test_grayscale_uses_bt601_weights():
    x = RNG.uniform(0, 255, (2, 3, 3, 3)).astype(np.float32)
    ref = 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]
    assert np.allclose(pp.Grayscale().apply(x), ref, atol=1e-3)
    with pytest.raises(ValueError, match="grayscale needs"):
        pp.Grayscale().out_shape((3, 3))


def test_parse_step_and_shape_chain():
    steps = [pp.parse_step({"downsample": {"factor": 2}}), pp.parse_step("standardize"),
             pp.parse_step({"reshape": {"shape": [5, 1]}})]
    assert pp.output_shape(steps, (10,)) == (5, 1)
    assert pp.canonical(steps)[0] == {"downsample": {"factor": 2, "axis": 0}}
    with pytest.raises(ValueError, match="unknown step 'blur'"):
        pp.parse_step({"blur": {}})
    with pytest.raises(ValueError, match="downsample: .*unexpected keyword"):
        pp.parse_step({"downsample": {"factr": 2}})
    with pytest.raises(ValueError, match=r"step 1 \(reshape\)"):
        pp.output_shape([steps[0], pp.Reshape(shape=(3,))], (10,))
