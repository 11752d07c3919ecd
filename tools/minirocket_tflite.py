"""MiniRocket (Dempster et al. 2021) as one INT8 TFLite model: the heavy tier of the appliance cascade.

Used by tools/train_models.py (`appliance_large`); needs the `train` extra (tensorflow-cpu,
aeon, scikit-learn), never the daemon.

aeon's MiniRocket chooses the dilations and the biases from the training split. Its transform
is laid out here as ordinary layers that TFLite runs in INT8:

- per dilation, the 84 fixed kernels (9 taps: -1, and 2 at three of them) as one dilated
  Conv1D: zero padding ('same') for the kernels MiniRocket pads, the output cropped to the
  valid part for the others (it alternates by kernel and dilation);
- a 1x1 DepthwiseConv1D with one output per bias of that kernel: weight K, bias -K*b, fused
  ReLU6, i.e. a steep step at the bias;
- global average pooling: 6 x the proportion of positive values (PPV), MiniRocket's feature;
- the 9,996 features into a ridge classifier (RidgeClassifierCV), as the Dense head, and one
  softmax whose temperature is chosen by 5-fold cross-validation on the training split, so
  that the large tier's scores are probabilities too.

The INT8 model's head is fitted to the INT8 features: the feature layers are converted on
their own (same layers, same representative data, so the same quantization) and run over
the training split. INT8 rounds the convolution outputs that PPV compares with each bias,
and ACSF1's flat stretches put many outputs exactly at a bias, so a head fitted to float
features loses points in INT8 (measured: 0.81 against 0.90 on the test split). The float
reference keeps a head fitted to the float features.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

KERNEL_TAPS = 9
STEP_GAIN = 1000.0  # K: the DepthwiseConv1D's slope; ReLU6 saturates 6/K above the bias
RELU_MAX = 6.0
ALPHAS = np.logspace(-3, 3, 10)
TEMPERATURES = np.logspace(-1, 2, 61)
CV_FOLDS = 5


def fit(x: np.ndarray, y: np.ndarray, n_classes: int, seed: int,
        to_int8: Callable[[object, np.ndarray], bytes]) -> tuple:
    """(float Keras model, Keras model for INT8 conversion), both (N, L, 1) -> (N, n_classes) probabilities.

    `to_int8(keras_model, representative_x)` converts like the real INT8 model (train_models.convert)."""
    from aeon.transformations.collection.convolution_based import MiniRocket

    rocket = MiniRocket(random_state=seed)
    rocket.fit(x[:, :, 0][:, None, :].astype(np.float32))
    _, _, dilations, per_dilation, biases = rocket.parameters
    features = _features(x.shape[1:], dilations, per_dilation, biases, MiniRocket._indices)
    float_head = _head(features.predict(x, verbose=0) / RELU_MAX, y, n_classes)
    int8_head = _head(_int8_features(features, x, to_int8), y, n_classes)
    return _classifier(features, *float_head), _classifier(features, *int8_head)


def _features(shape, dilations, per_dilation, biases, indices):
    """Input -> (N, 9996) features, 6 x PPV each, in aeon's order within each (dilation, padding) group."""
    from tensorflow import keras
    from tensorflow.keras import layers

    inp = keras.Input(shape=shape)
    outputs, start = [], 0
    for j, (dilation, count) in enumerate(zip(map(int, dilations), map(int, per_dilation))):
        for padded in (True, False):
            kernels = [k for k in range(len(indices)) if ((j % 2) + k) % 2 == (0 if padded else 1)]
            weights = -np.ones((KERNEL_TAPS, 1, len(kernels)), np.float32)
            for column, k in enumerate(kernels):
                weights[list(indices[k]), 0, column] = 2.0
            conv = layers.Conv1D(len(kernels), KERNEL_TAPS, dilation_rate=dilation, padding="same", use_bias=False)
            c = conv(inp)
            conv.set_weights([weights])
            if not padded:
                c = layers.Cropping1D(((KERNEL_TAPS - 1) * dilation // 2,) * 2)(c)
            step = layers.DepthwiseConv1D(1, depth_multiplier=count, activation="relu6")
            s = step(c)
            offsets = [start + k * count + f for k in kernels for f in range(count)]
            step.set_weights([np.full((1, len(kernels), count), STEP_GAIN, np.float32),
                              (-STEP_GAIN * np.asarray(biases)[offsets]).astype(np.float32)])
            outputs.append(layers.GlobalAveragePooling1D()(s))
        start += len(indices) * count
    return keras.Model(inp, layers.Concatenate()(outputs))


def _int8_features(features, x: np.ndarray, to_int8) -> np.ndarray:
    from daemon.model.runtime import Model

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "features.tflite"
        path.write_bytes(to_int8(features, x))
        return Model(path, require_int8=True).infer(x) / RELU_MAX


def _head(f: np.ndarray, y: np.ndarray, n_classes: int) -> tuple:
    """(coef (features, classes), intercept, temperature): ridge, and a softmax temperature by CV."""
    from sklearn.linear_model import RidgeClassifier, RidgeClassifierCV
    from sklearn.model_selection import StratifiedKFold

    ridge = RidgeClassifierCV(alphas=ALPHAS).fit(f, y)
    decisions = np.zeros((len(y), n_classes))
    for train, held in StratifiedKFold(CV_FOLDS, shuffle=True, random_state=0).split(f, y):
        decisions[held] = RidgeClassifier(alpha=ridge.alpha_).fit(f[train], y[train]).decision_function(f[held])
    nll = [_nll(t * decisions, y) for t in TEMPERATURES]
    return ridge.coef_.T, ridge.intercept_, float(TEMPERATURES[int(np.argmin(nll))])


def _nll(logits: np.ndarray, y: np.ndarray) -> float:
    logits = logits - logits.max(axis=1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean())


def _classifier(features, coef: np.ndarray, intercept: np.ndarray, temperature: float):
    from tensorflow import keras
    from tensorflow.keras import layers

    dense = layers.Dense(coef.shape[1])
    logits = dense(features.output)
    dense.set_weights([(coef * temperature / RELU_MAX).astype(np.float32),
                       (intercept * temperature).astype(np.float32)])
    return keras.Model(features.input, layers.Softmax()(logits))
