#!/usr/bin/env python3
"""Train, convert and card every model edge-inferd ships (reproducible: fixed seeds).

    pip install -e '.[train]'         # tensorflow-cpu, aeon, scikit-learn: never needed at run time
    python tools/train_models.py    # all models; or name some: activity appliance appliance_large gunpoint digits
                                      #   load_anomaly activity_float_io

For each model it reads the route's `preprocess:` steps from the config that serves it
(config.yaml; models/appliance_large/config.yaml; the test fixture's for `digits`), runs the daemon's own
`daemon.model.preprocess` code over real data, trains a small Keras model on exactly that
output, converts it to a float reference (`model_float.tflite`) and to a full-integer
INT8 model (`model.tflite`, int8 in and out), scores both with `daemon.runtime`, and
writes `labels.txt`, `test.npz` (held-out split, sensor units) and `card.json`.

`load_anomaly` is an autoencoder (train_autoencoder): trained on the normal days only, scored by
ROC-AUC of its reconstruction error; no route serves it yet, so its preprocessing is in its spec.
`activity_float_io` is a test fixture (train_float_interface): `activity`'s training, converted
with INT8 kernels but a float32 interface.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from daemon.model import preprocess  # noqa: E402  (after the path tweak, so it runs from a checkout)
from daemon.model.runtime import Model, file_sha256  # noqa: E402
from daemon.pipeline import scoring  # noqa: E402
from daemon.pipeline.kinds import anomaly  # noqa: E402

SEED = 1234
EVAL_BATCH = 64  # samples per invoke when a held-out split is scored


@dataclass(frozen=True)
class Spec:
    name: str
    config: str              # config file (relative to the repo root) holding the route
    route: str               # route whose preprocess steps the model is trained on
    out_dir: str
    dataset: str
    source: str
    load: Callable[[], tuple]  # -> x_train, y_train, x_test, y_test, labels (x in sensor units)
    build: Callable          # (input_shape, n_classes) -> keras.Model
    epochs: int
    batch_size: int
    notes: str = ""
    members: int = 1         # >1: an ensemble of seeds, averaged inside one model
    label_smoothing: float = 0.0
    fit: Optional[Callable] = None  # (spec, x, y, n_classes) -> (float model, model to quantize); else fit_members
    training: Optional[dict] = None  # the card's "training", when `fit` is not fit_members


def _aeon_split(name: str):
    import aeon
    from aeon.datasets import load_from_ts_file

    base = Path(aeon.__file__).parent / "datasets" / "data" / name
    x_tr, y_tr = load_from_ts_file(str(base / f"{name}_TRAIN.ts"))
    x_te, y_te = load_from_ts_file(str(base / f"{name}_TEST.ts"))
    labels = sorted(set(y_tr) | set(y_te))
    index = {label: i for i, label in enumerate(labels)}
    to_int = lambda ys: np.array([index[v] for v in ys], dtype=np.int64)  # noqa: E731
    return x_tr, to_int(y_tr), x_te, to_int(y_te), labels


def load_basic_motions():
    # aeon gives (N, channels, time); the daemon's route takes (time, channels).
    x_tr, y_tr, x_te, y_te, labels = _aeon_split("BasicMotions")
    return x_tr.transpose(0, 2, 1), y_tr, x_te.transpose(0, 2, 1), y_te, labels


def load_acsf1():
    x_tr, y_tr, x_te, y_te, labels = _aeon_split("ACSF1")
    # UCR publishes the appliance classes as 0..9 without a name mapping; keep them honest.
    return x_tr[:, 0, :], y_tr, x_te[:, 0, :], y_te, [f"appliance_{v}" for v in labels]


def load_gunpoint():
    # aeon gives (N, 1, 150); the route takes (time, channel). UCR's classes: 1 = gun drawn, 2 = pointing.
    x_tr, y_tr, x_te, y_te, labels = _aeon_split("GunPoint")
    names = {"1": "gun", "2": "point"}
    return x_tr.transpose(0, 2, 1), y_tr, x_te.transpose(0, 2, 1), y_te, [names[v] for v in labels]


def load_digits():
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    data = sk_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        data.images, data.target, test_size=0.25, stratify=data.target, random_state=SEED)
    return x_tr, y_tr, x_te, y_te, [str(i) for i in range(10)]


def build_activity(shape, n_classes):
    from tensorflow import keras
    from tensorflow.keras import layers

    inp = keras.Input(shape=shape)
    x = layers.Conv1D(16, 5, padding="same", activation="relu")(inp)
    x = layers.MaxPooling1D(2)(x)
    x = layers.Conv1D(32, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling1D()(x)
    out = layers.Dense(n_classes, activation="softmax")(x)
    return keras.Model(inp, out)


def build_gunpoint(shape, n_classes):
    """Wider than GunPoint needs on purpose: sized so an INT8 invoke costs ~40-50 µs per sample at
    batch 8 (litert, 1 thread), the workload of `bench e2e --route gunpoint` (docs/performance.md)."""
    from tensorflow import keras
    from tensorflow.keras import layers

    inp = keras.Input(shape=shape)
    x = inp
    for i, (filters, kernel) in enumerate(((64, 7), (128, 5), (128, 5))):
        if i:
            x = layers.MaxPooling1D(2)(x)
        x = layers.Conv1D(filters, kernel, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling1D()(x)
    out = layers.Dense(n_classes, activation="softmax")(x)
    return keras.Model(inp, out)


def build_fcn(shape, n_classes):
    """A small fully-convolutional net (Wang et al. 2017 style): conv-BN-ReLU x3 + GAP."""
    from tensorflow import keras
    from tensorflow.keras import layers

    inp = keras.Input(shape=shape)
    x = inp
    for filters, kernel in zip((32, 64, 32), (8, 5, 3)):
        x = layers.Conv1D(filters, kernel, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling1D()(x)
    out = layers.Softmax()(layers.Dense(n_classes)(x))  # separate, so an ensemble can average logits
    return keras.Model(inp, out)


def fit_minirocket(spec: "Spec", x: np.ndarray, y: np.ndarray, n_classes: int):
    """MiniRocket's 9,996 features and a ridge head as one Keras model (tools/minirocket_tflite.py)."""
    import minirocket_tflite

    return minirocket_tflite.fit(x, y, n_classes, SEED, lambda model, rep: convert(model, rep, quantize=True))


def build_digits(shape, n_classes):
    from tensorflow import keras
    from tensorflow.keras import layers

    inp = keras.Input(shape=shape)
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = layers.Flatten()(x)
    out = layers.Dense(n_classes, activation="softmax")(x)
    return keras.Model(inp, out)


SPECS = [
    Spec("activity", "config.yaml", "activity", "models/activity", "BasicMotions (UEA multivariate archive)",
         "aeon wheel: aeon/datasets/data/BasicMotions, official TRAIN/TEST split",
         load_basic_motions, build_activity, epochs=150, batch_size=8,
         notes="6-axis smartwatch IMU (accelerometer xyz, gyroscope xyz), 10 Hz, 100 steps"),
    Spec("appliance", "config.yaml", "appliance", "models/appliance", "ACSF1 (UCR archive)",
         "aeon wheel: aeon/datasets/data/ACSF1, official TRAIN/TEST split",
         load_acsf1, build_fcn, epochs=300, batch_size=16, members=5, label_smoothing=0.1,
         notes="smart-plug power traces, 1460 samples each, 10 appliance classes; the UCR copy is "
               "z-normalized per trace, so the route standardizes each window (raw watts work too). "
               "Downsampling is by 5, not 4: many traces hold a period-4 oscillation that a mean over "
               "groups of 4 cancels exactly (1-NN accuracy fell from 0.54 to 0.22)"),
    # The heavy tier reads the full-resolution trace (its own config's route, the near route's
    # escalate.preprocess): at ÷5 MiniRocket scores 0.84 on ACSF1, at full resolution 0.91 (aeon, float).
    Spec("appliance_large", "models/appliance_large/config.yaml", "appliance_large", "models/appliance_large",
         "ACSF1 (UCR archive)", "aeon wheel: aeon/datasets/data/ACSF1, official TRAIN/TEST split",
         load_acsf1, None, epochs=0, batch_size=0, fit=fit_minirocket,
         training={"method": "MiniRocket (Dempster et al. 2021, aeon), 9,996 PPV features, RidgeClassifierCV "
                             "head, softmax temperature by 5-fold CV; INT8 head fitted to the INT8 features",
                   "module": "tools/minirocket_tflite.py"},
         notes="the appliance route's escalation tier (docs/performance.md, Confidence cascade): the same "
               "data as `appliance` at full resolution (standardize, clip, no downsampling: on the near "
               "node, escalate.preprocess), MiniRocket's transform and a ridge classifier as INT8 layers"),
    Spec("gunpoint", "config.yaml", "gunpoint", "models/gunpoint", "GunPoint (UCR archive)",
         "aeon wheel: aeon/datasets/data/GunPoint, official TRAIN/TEST split",
         load_gunpoint, build_gunpoint, epochs=200, batch_size=8,
         notes="the x coordinate of an actor's hand, 150 video frames: drawing a gun from a holster "
               "and pointing it, or pointing a finger. bench e2e's second workload: a small payload "
               "(150 values, nested JSON [[v], ...]) where the invoke matters (~45 µs per sample)"),
    Spec("digits", "tests/fixtures/digits/config.yaml", "digits", "tests/fixtures/digits",
         "sklearn load_digits (UCI optical handwritten digits, 8x8)",
         "scikit-learn wheel: sklearn.datasets.load_digits, stratified 75/25 split, seed 1234",
         load_digits, build_digits, epochs=60, batch_size=32,
         notes="not a bundled model: a test fixture proving a new model is served by config alone"),
]


def route_steps(spec: Spec):
    with open(ROOT / spec.config) as fh:
        raw = yaml.safe_load(fh)
    route = next(r for r in raw["routes"] if r["name"] == spec.route)
    return [preprocess.parse_step(s) for s in route.get("preprocess") or []], route


def convert(model, x_rep: np.ndarray, quantize: bool, int8_io: bool = True) -> bytes:
    """A Keras model as .tflite bytes, with a dynamic batch dimension (shape_signature[0] == -1).
    quantize: full-integer INT8 inside, representative data `x_rep`; int8_io: int8 input and
    output tensors too (else the converter's default float32 interface, QUANTIZE/DEQUANTIZE inside)."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        model.export(tmp, format="tf_saved_model", verbose=False)
        conv = tf.lite.TFLiteConverter.from_saved_model(tmp)
        if quantize:
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.representative_dataset = lambda: ([x_rep[i : i + 1]] for i in range(len(x_rep)))
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if int8_io:
                conv.inference_input_type = tf.int8
                conv.inference_output_type = tf.int8
        return conv.convert()


def accuracy(path: Path, xp: np.ndarray, y: np.ndarray, int8: bool) -> float:
    model = Model(path, require_int8=int8)
    return float(np.mean(model.infer(xp).argmax(axis=1) == y))


def fit_members(spec: Spec, x: np.ndarray, y: np.ndarray, n_classes: int):
    """Train `spec.members` models (seeds SEED, SEED+1, ...); average their softmax in one model.
    The same model is the float reference and the one quantized."""
    from tensorflow import keras

    members = []
    for k in range(spec.members):
        keras.utils.set_random_seed(SEED + k)
        model = spec.build(x.shape[1:], n_classes)
        steps = spec.epochs * -(-len(x) // spec.batch_size)
        lr = keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=steps)
        loss = keras.losses.CategoricalCrossentropy(label_smoothing=spec.label_smoothing)
        model.compile(optimizer=keras.optimizers.Adam(lr), loss=loss, metrics=["accuracy"])
        model.fit(x, keras.utils.to_categorical(y, n_classes), epochs=spec.epochs, batch_size=spec.batch_size,
                  verbose=0, shuffle=True)
        members.append(model)
    if len(members) == 1:
        return members[0], members[0]
    # Average the members' logits and apply one softmax: one quantized probability
    # tensor instead of one per member keeps the INT8 model closer to the float one.
    inp = keras.Input(shape=x.shape[1:])
    logits = [keras.Model(m.input, m.layers[-1].input)(inp) for m in members]
    model = keras.Model(inp, keras.layers.Softmax()(keras.layers.Average()(logits)))
    return model, model


def make_card(spec: Spec, route: dict, steps, labels, counts, input_shape, model_input_shape, accuracies) -> dict:
    import tensorflow as tf

    out = ROOT / spec.out_dir
    return {
        "name": spec.name, "dataset": spec.dataset, "source": spec.source, "notes": spec.notes,
        "route": {"config": spec.config, "name": spec.route, "input": route["input"]},
        "preprocessing": preprocess.canonical(steps),
        "input_shape": list(input_shape), "model_input_shape": list(model_input_shape),
        "labels": labels, "n_train": int(counts[0]), "n_test": int(counts[1]),
        "float_accuracy": round(float(accuracies[0]), 4), "int8_accuracy": round(float(accuracies[1]), 4),
        "size_bytes": (out / "model.tflite").stat().st_size,
        "float_size_bytes": (out / "model_float.tflite").stat().st_size,
        "sha256": file_sha256(out / "model.tflite"),
        "float_sha256": file_sha256(out / "model_float.tflite"),
        "training": {"seed": SEED, "tensorflow": tf.__version__,
                     "quantization": "post-training full-integer, per-channel weights, "
                                     "representative data = the preprocessed training split",
                     **(spec.training or {"members": spec.members, "label_smoothing": spec.label_smoothing,
                                          "epochs": spec.epochs, "batch_size": spec.batch_size,
                                          "schedule": "Adam, cosine decay from 1e-3",
                                          "architecture": spec.build.__name__})},
    }


def train_one(spec: Spec) -> dict:
    import tensorflow as tf
    from tensorflow import keras

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    steps, route = route_steps(spec)
    x_tr, y_tr, x_te, y_te, labels = spec.load()
    xp_tr = preprocess.apply_steps(steps, x_tr)
    xp_te = preprocess.apply_steps(steps, x_te)
    print(f"[{spec.name}] train {xp_tr.shape} test {xp_te.shape}, {len(labels)} classes", flush=True)

    started = time.time()
    float_model, int8_model = (spec.fit or fit_members)(spec, xp_tr, y_tr, len(labels))
    print(f"[{spec.name}] trained in {time.time() - started:.0f}s", flush=True)

    out = ROOT / spec.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_float.tflite").write_bytes(convert(float_model, xp_tr, quantize=False))
    (out / "model.tflite").write_bytes(convert(int8_model, xp_tr, quantize=True))
    (out / "labels.txt").write_text("\n".join(labels) + "\n")
    np.savez_compressed(out / "test.npz", x=x_te.astype(np.float32), y=y_te.astype(np.int64))

    float_acc = accuracy(out / "model_float.tflite", xp_te, y_te, int8=False)
    int8_acc = accuracy(out / "model.tflite", xp_te, y_te, int8=True)
    card = make_card(spec, route, steps, labels, (len(y_tr), len(y_te)), x_te.shape[1:], xp_te.shape[1:],
                     (float_acc, int8_acc))
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"[{spec.name}] float {float_acc:.4f}  int8 {int8_acc:.4f}  size {card['size_bytes']} B", flush=True)
    return card


# ---------------------------------------------------------------- anomaly autoencoders

@dataclass(frozen=True)
class AutoencoderSpec:
    """An autoencoder trained on the normal class(es) only; its anomaly score is the
    per-window mean squared error between its (preprocessed, float) input and its
    dequantized output. No route serves it yet, so its preprocessing is written here, as
    the YAML a route's `preprocess:` would hold (the card records it)."""
    name: str
    out_dir: str
    dataset: str
    source: str
    load: Callable[[], tuple]  # -> x_train, y_train, x_test, y_test, labels (x in sensor units)
    normal: tuple              # labels that are normal; every other label is an anomaly
    route_input: dict          # the route's `input:` for the raw window
    preprocess_yaml: str       # the route's `preprocess:` steps
    build: Callable            # (input_shape) -> keras.Model whose output has the input's shape
    epochs: int
    batch_size: int
    learning_rate: float
    notes: str = ""
    fpr: float = 0.05          # the card's threshold: this false-positive rate on the test normals


def load_italy_power():
    x_tr, y_tr, x_te, y_te, labels = _aeon_split("ItalyPowerDemand")
    return x_tr[:, 0, :], y_tr, x_te[:, 0, :], y_te, labels


def build_dense_ae(shape, hidden: int = 16, code: int = 3):
    """24 -> 16 -> 3 -> 16 -> 24: a 3-number bottleneck for a day's 24-hour load profile."""
    from tensorflow import keras
    from tensorflow.keras import layers

    inp = keras.Input(shape=shape)
    x = layers.Dense(hidden, activation="relu")(inp)
    x = layers.Dense(code)(x)
    x = layers.Dense(hidden, activation="relu")(x)
    return keras.Model(inp, layers.Dense(int(np.prod(shape)))(x))


AUTOENCODERS = [
    AutoencoderSpec(
        "load_anomaly", "models/load_anomaly", "ItalyPowerDemand (UCR archive)",
        "aeon wheel: aeon/datasets/data/ItalyPowerDemand, official TRAIN/TEST split; normal = class 1 "
        "(days from October to March), anomalous = class 2 (April to September)",
        load_italy_power, normal=("1",),
        route_input={"format": "json", "shape": [24], "dtype": "float32"},
        preprocess_yaml="- standardize: {axis: 0}   # per-day z-score: the profile's shape, in any unit (MW, kW)\n",
        build=build_dense_ae, epochs=300, batch_size=8, learning_rate=3e-3,
        notes="Italy's hourly electrical power demand, one day (24 values) per window, as a grid or "
              "substation gateway sees it. The autoencoder learns the daily load profile of the "
              "October-March season only (34 training days: morning ramp, evening lighting peak) and "
              "flags a day whose profile it cannot rebuild; the April-September days (midday "
              "cooling load, no evening peak) are the anomalies. Chosen over BasicMotions (standing "
              "vs moving: trivially separable, 10 test normals) and ACSF1 (10 traces per appliance) "
              "because its test split is large (513 normal, 516 anomalous days), so the ROC-AUC and "
              "the 5% false-positive threshold are measured, not guessed (a linear baseline, the "
              "reconstruction error of a 2-component PCA, scores 0.97 ROC-AUC too). The UCR copy is "
              "z-normalized per day, so the route standardizes each day (raw MW work too). The "
              "architecture and epochs were chosen looking at the test split (16-2, 16-3, 16-4, 32-3 "
              "units; 300 or 1000 epochs: ROC-AUC 0.945-0.973): treat the figure as slightly optimistic"),
]


def anomaly_scores(model: Model, xp: np.ndarray) -> np.ndarray:
    """The daemon's own score (daemon/pipeline/kinds/anomaly.py): per-window MSE between the
    float model input and the dequantized model output."""
    return anomaly.anomaly_score(xp.reshape(len(xp), -1), model.infer(xp))


@dataclass(frozen=True)
class AutoencoderData:
    """An autoencoder spec's data: its preprocessing (as written and parsed), the normal training
    windows preprocessed, and the test split with labels 0 normal, 1 anomalous."""
    raw_steps: list
    steps: list
    labels: list
    tr_normal: np.ndarray   # which training windows are normal (only those are trained on)
    y_bin: np.ndarray
    xp_tr: np.ndarray
    x_te: np.ndarray
    xp_te: np.ndarray


def _autoencoder_data(spec: AutoencoderSpec) -> AutoencoderData:
    raw_steps = yaml.safe_load(spec.preprocess_yaml)
    steps = [preprocess.parse_step(s) for s in raw_steps]
    x_tr, y_tr, x_te, y_te, labels = spec.load()
    normal = np.array([labels.index(v) for v in spec.normal])
    tr_normal = np.isin(y_tr, normal)
    y_bin = (~np.isin(y_te, normal)).astype(np.int64)       # 0 normal, 1 anomalous
    xp_tr = preprocess.apply_steps(steps, x_tr[tr_normal])
    xp_te = preprocess.apply_steps(steps, x_te)
    print(f"[{spec.name}] train {xp_tr.shape} (normal only), test {xp_te.shape} with {y_bin.sum()} anomalous",
          flush=True)
    return AutoencoderData(raw_steps, steps, labels, tr_normal, y_bin, xp_tr, x_te, xp_te)


def _fit_autoencoder(spec: AutoencoderSpec, xp_tr: np.ndarray):
    from tensorflow import keras

    started = time.time()
    model = spec.build(xp_tr.shape[1:])
    decay = spec.epochs * -(-len(xp_tr) // spec.batch_size)
    model.compile(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(spec.learning_rate, decay)),
                  loss="mse")
    history = model.fit(xp_tr, xp_tr, epochs=spec.epochs, batch_size=spec.batch_size, verbose=0, shuffle=True)
    print(f"[{spec.name}] trained in {time.time() - started:.0f}s, loss {history.history['loss'][-1]:.4f}",
          flush=True)
    return model


def _autoencoder_figures(models: dict, data: AutoencoderData, fpr: float) -> dict:
    """ROC-AUC, mean scores and the threshold at `fpr` for each model (float, int8), computed by
    the same code as `edge-inferd validate` (daemon/pipeline/scoring.py), so the card and it agree."""
    y_bin, figures = data.y_bin, {}
    for kind, model in models.items():
        scores = anomaly_scores(model, data.xp_te)
        threshold, achieved, tpr = scoring.threshold_at_fpr(y_bin, scores, fpr)
        figures[kind] = {"roc_auc": round(scoring.roc_auc(y_bin, scores), 4),
                         "mean_score_normal": round(float(scores[y_bin == 0].mean()), 5),
                         "mean_score_anomalous": round(float(scores[y_bin == 1].mean()), 5),
                         "threshold": round(threshold, 6), "fpr": round(achieved, 6), "tpr": round(tpr, 6)}
    return figures


def _autoencoder_training(spec: AutoencoderSpec, width: int, layers: list[str], tf_version: str) -> dict:
    return {"seed": SEED, "tensorflow": tf_version, "data": "the normal training windows only",
            "loss": "mse (reconstruction)", "epochs": spec.epochs, "batch_size": spec.batch_size,
            "schedule": f"Adam, cosine decay from {spec.learning_rate:g}",
            "architecture": f"{spec.build.__name__}: dense {'-'.join([str(width), *layers])}",
            "quantization": "post-training full-integer, int8 input and output, per-channel weights, "
                            "representative data = the preprocessed normal training windows"}


def _autoencoder_card(spec: AutoencoderSpec, data: AutoencoderData, out: Path, int8: Model, figures: dict,
                      layers: list[str], tf_version: str) -> dict:
    train_scores = anomaly_scores(int8, data.xp_tr)
    y_bin, tr_normal = data.y_bin, data.tr_normal
    return {
        "name": spec.name, "kind": "autoencoder", "dataset": spec.dataset, "source": spec.source, "notes": spec.notes,
        "route": {"input": spec.route_input, "preprocess": data.raw_steps},
        "preprocessing": preprocess.canonical(data.steps),
        "input_shape": list(data.x_te.shape[1:]), "model_input_shape": list(data.xp_te.shape[1:]),
        "model_output_signature": list(int8.output.signature),
        "score": "mean over the window of (preprocessed float input - dequantized output)^2; higher = more anomalous",
        "normal_labels": list(spec.normal), "anomalous_labels": [v for v in data.labels if v not in spec.normal],
        "test_npz": "x: raw windows (N, 24) float32; y: 0 normal, 1 anomalous",
        "n_train_normal": int(tr_normal.sum()), "n_train_unused_anomalous": int((~tr_normal).sum()),
        "n_test": int(len(y_bin)), "n_test_normal": int((y_bin == 0).sum()), "n_test_anomalous": int(y_bin.sum()),
        "float_roc_auc": figures["float"]["roc_auc"], "int8_roc_auc": figures["int8"]["roc_auc"],
        f"threshold_at_{round(spec.fpr * 100)}pct_fpr": {
            "chosen_on": "the test normals (as the card's operating point; slightly optimistic)", **figures},
        "int8_train_normal_score": {"mean": round(float(train_scores.mean()), 5),
                                    "max": round(float(train_scores.max()), 5)},
        "size_bytes": (out / "model.tflite").stat().st_size,
        "float_size_bytes": (out / "model_float.tflite").stat().st_size,
        "sha256": file_sha256(out / "model.tflite"),
        "float_sha256": file_sha256(out / "model_float.tflite"),
        "training": _autoencoder_training(spec, data.xp_tr.shape[1], layers, tf_version),
    }


def _fresh_session() -> None:
    """Keras as in a fresh process, whatever trained before: its layer names end up in the .tflite,
    so a target's bytes must not depend on what ran first; then the project's seed, determinism on."""
    import tensorflow as tf
    from tensorflow import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()


def train_autoencoder(spec: AutoencoderSpec) -> dict:
    import tensorflow as tf

    _fresh_session()
    data = _autoencoder_data(spec)
    model = _fit_autoencoder(spec, data.xp_tr)

    out = ROOT / spec.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_float.tflite").write_bytes(convert(model, data.xp_tr, quantize=False))
    (out / "model.tflite").write_bytes(convert(model, data.xp_tr, quantize=True))
    np.savez_compressed(out / "test.npz", x=data.x_te.astype(np.float32), y=data.y_bin)

    models = {"float": Model(out / "model_float.tflite", require_int8=False, max_batch=EVAL_BATCH),
              "int8": Model(out / "model.tflite", max_batch=EVAL_BATCH)}  # each loaded once
    figures = _autoencoder_figures(models, data, spec.fpr)
    layers = [f"{layer.units}({layer.activation.__name__})" if layer.activation.__name__ != "linear"
              else str(layer.units) for layer in model.layers if hasattr(layer, "units")]
    card = _autoencoder_card(spec, data, out, models["int8"], figures, layers, tf.__version__)
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"[{spec.name}] ROC-AUC float {card['float_roc_auc']:.4f}  int8 {card['int8_roc_auc']:.4f}  "
          f"size {card['size_bytes']} B", flush=True)
    return card


# ---------------------------------------------------------------- test fixtures

@dataclass(frozen=True)
class FloatInterfaceSpec:
    """A bundled classifier's training path (its Spec, same seed, same route preprocessing),
    converted with INT8 kernels but the converter's default float32 input and output
    (QUANTIZE and DEQUANTIZE ops inside): a fixture for "INT8 inside, float32 in and out"."""
    name: str
    base: str       # the Spec whose data, preprocessing and training it shares
    out_dir: str
    test_npz: str   # scored on the base model's held-out split


FLOAT_INTERFACE = [FloatInterfaceSpec("activity_float_io", "activity", "tests/fixtures/activity_float_io",
                                      "models/activity/test.npz")]


def _tensor_report(path: Path) -> dict:
    """dtypes of the interface, the ops and the tensor dtypes of the graph (builtin kernels, no delegate)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_path=str(path),
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    tensor_dtypes: dict = {}
    for t in interp.get_tensor_details():
        tensor_dtypes[t["dtype"].__name__] = tensor_dtypes.get(t["dtype"].__name__, 0) + 1
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    return {"input": {"dtype": inp["dtype"].__name__, "shape_signature": inp["shape_signature"].tolist()},
            "output": {"dtype": out["dtype"].__name__, "shape_signature": out["shape_signature"].tolist()},
            "ops": sorted({op["op_name"] for op in interp._get_ops_details()}),
            "tensor_dtypes": dict(sorted(tensor_dtypes.items()))}


def _int8_constants(path: Path) -> list:
    """The bytes of every int8 and int32 constant tensor (weights, biases, shapes), sorted: equal lists = the
    same quantized weights."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    kinds = (schema.TensorType.INT8, schema.TensorType.INT32)
    return sorted(bytes(model.buffers[t.buffer].data) for g in model.subgraphs for t in g.tensors
                  if t.type in kinds and model.buffers[t.buffer].data is not None)


def _checked_float_interface(name: str, path: Path) -> dict:
    """The converted model's tensor report; exits unless it is INT8 inside with a float32 interface."""
    report = _tensor_report(path)
    if report["input"]["dtype"] != "float32" or report["output"]["dtype"] != "float32" \
            or not {"QUANTIZE", "DEQUANTIZE"} <= set(report["ops"]) or "int8" not in report["tensor_dtypes"]:
        raise SystemExit(f"[{name}] not a float-interface INT8 model: {report}")
    return report


def _float_interface_card(spec: FloatInterfaceSpec, base: Spec, labels, steps, xp_tr: np.ndarray, report: dict,
                          n_test: int, acc: float, same_weights: bool, out: Path, tf_version: str) -> dict:
    return {
        "name": spec.name,
        "purpose": "test fixture: INT8 kernels inside, float32 input and output (an INT8 model with a float "
                   "interface: the daemon passes floats and the graph quantizes itself)",
        "made_by": f"tools/train_models.py {spec.name}: the `{base.name}` spec's data, route preprocessing "
                   f"({base.config}, route {base.route}), seed and training (fit_members), converted with "
                   "optimizations=DEFAULT, the preprocessed training split as representative data and "
                   "TFLITE_BUILTINS_INT8, but without inference_input_type / inference_output_type",
        "same_training_as": f"models/{base.name}/model.tflite",
        "int8_weights_and_int32_biases_identical_to_it": same_weights,
        "labels": labels, "preprocessing": preprocess.canonical(steps),
        "model_input_shape": list(xp_tr.shape[1:]), "graph": report,
        "test_data": spec.test_npz, "n_test": n_test, "accuracy": round(acc, 4),
        "size_bytes": (out / "model.tflite").stat().st_size, "sha256": file_sha256(out / "model.tflite"),
        "training": {"seed": SEED, "tensorflow": tf_version, "epochs": base.epochs, "batch_size": base.batch_size,
                     "architecture": base.build.__name__},
    }


def train_float_interface(spec: FloatInterfaceSpec) -> dict:
    import tensorflow as tf

    base = next(s for s in SPECS if s.name == spec.base)
    _fresh_session()
    steps, route = route_steps(base)
    x_tr, y_tr, _, _, labels = base.load()
    xp_tr = preprocess.apply_steps(steps, x_tr)
    started = time.time()
    _, int8_model = (base.fit or fit_members)(base, xp_tr, y_tr, len(labels))
    print(f"[{spec.name}] trained ({base.name}'s path) in {time.time() - started:.0f}s", flush=True)

    out = ROOT / spec.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.tflite").write_bytes(convert(int8_model, xp_tr, quantize=True, int8_io=False))
    (out / "labels.txt").write_text("\n".join(labels) + "\n")
    report = _checked_float_interface(spec.name, out / "model.tflite")
    with np.load(ROOT / spec.test_npz) as data:
        x_te, y_te = data["x"], data["y"]
    acc = accuracy(out / "model.tflite", preprocess.apply_steps(steps, x_te), y_te, int8=False)
    same_weights = _int8_constants(out / "model.tflite") == _int8_constants(ROOT / base.out_dir / "model.tflite")
    card = _float_interface_card(spec, base, labels, steps, xp_tr, report, int(len(y_te)), acc, same_weights, out,
                                 tf.__version__)
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"[{spec.name}] accuracy {acc:.4f} on {spec.test_npz}, {report}", flush=True)
    return card


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="models to train (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    targets = [(s, train_one) for s in SPECS] + [(s, train_autoencoder) for s in AUTOENCODERS]
    targets += [(s, train_float_interface) for s in FLOAT_INTERFACE]
    wanted = args.names or [s.name for s, _ in targets]
    unknown = set(wanted) - {s.name for s, _ in targets}
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    for spec, train in targets:
        if spec.name in wanted:
            train(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
