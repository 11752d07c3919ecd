#!/usr/bin/env python3
"""Train, convert and card every model edge-inferd ships (reproducible: fixed seeds).

    pip install -e '.[train]'         # tensorflow-cpu, aeon, scikit-learn: never needed at run time
    python scripts/train_models.py    # all models; or name some: activity appliance appliance_large digits

For each model it reads the route's `preprocess:` steps from the config that serves it
(config.yaml; models/appliance_large/config.yaml; the test fixture's for `digits`), runs the daemon's own
`daemon.preprocess` code over real data, trains a small Keras model on exactly that
output, converts it to a float reference (`model_float.tflite`) and to a full-integer
INT8 model (`model.tflite`, int8 in and out), scores both with `daemon.runtime`, and
writes `labels.txt`, `test.npz` (held-out split, sensor units) and `card.json`.
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

SEED = 1234


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
    """MiniRocket's 9,996 features and a ridge head as one Keras model (scripts/minirocket_tflite.py)."""
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
                   "module": "scripts/minirocket_tflite.py"},
         notes="the appliance route's escalation tier (docs/performance.md, Confidence cascade): the same "
               "data as `appliance` at full resolution (standardize, clip, no downsampling: on the near "
               "node, escalate.preprocess), MiniRocket's transform and a ridge classifier as INT8 layers"),
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


def convert(model, x_rep: np.ndarray, quantize: bool) -> bytes:
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        model.export(tmp, format="tf_saved_model", verbose=False)
        conv = tf.lite.TFLiteConverter.from_saved_model(tmp)
        if quantize:
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.representative_dataset = lambda: ([x_rep[i : i + 1]] for i in range(len(x_rep)))
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="models to train (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    wanted = args.names or [s.name for s in SPECS]
    unknown = set(wanted) - {s.name for s in SPECS}
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    for spec in SPECS:
        if spec.name in wanted:
            train_one(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
