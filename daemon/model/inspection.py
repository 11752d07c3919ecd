"""`edge-inferd inspect MODEL.tflite`: what a model takes and gives, and a route that serves it.

For the user who has a file and no idea what it wants: each input and output (name, dtype,
shape, quantization and the real values its integers stand for), the graph's ops, the kind
the outputs look like, every reason the daemon would refuse it, and a `models:` + `routes:`
snippet that `check-config` accepts once the labels file (when the kind needs one) exists.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from daemon.model.interface import Interface, TensorSpec, dynamic_dims, guess_kind, raw_anchor_heads
from daemon.model.runtime import open_interface

# Real input ranges that say how pixels 0..255 were scaled in training: (low, high) -> (mean, std).
_PIXEL_SCALINGS = {(-1.0, 1.0): (127.5, 127.5), (0.0, 1.0): (0.0, 255.0)}
_RANGE_TOLERANCE = 0.05
_IMAGE_CHANNELS = (1, 3)
# The shorter side of an input proposed as an image. The image models come at 28x28 (MNIST) to
# 300x300 (SSD); a sensor window puts its channels or frames on an axis, which stays small:
# [128, 3, 1] (a 3-axis accelerometer), [128, 9, 1] (an IMU), [5, 128, 1] (a stack of 5 spectra).
_IMAGE_MIN_SIDE = 16
_TOP_OPS = 8
# A time axis this long, of samples this small, is proposed as a stream (looks_like_series).
_SERIES_MIN_STEPS = 16
_SERIES_MAX_VALUES = 16
_TOP_K = 3  # a classifier's proposed top_k, or its number of classes when it has fewer
_BOX_COORDS = 4  # a box's values before its keypoints in a raw head's row
# A float input of one axis at least this long (0.5 s at 16 kHz), or of a dynamic length, is
# proposed as audio: sensor windows and traces put their channels on a second axis or are shorter.
_AUDIO_MIN_SAMPLES = 8000
_AUDIO_RATE_GUESS = 16000  # what wake-word and speech models take; the file does not say


def report(path: Path | str, backend: str = "auto") -> tuple[str, bool]:
    """The report, and whether the daemon can serve the model."""
    path = Path(path)
    interface = open_interface(path, backend)
    kind, looks = guess_kind(interface)
    lines = [f"{path}", "", "inputs:"]
    lines += [f"  {spec.describe()}" for spec in interface.inputs]
    lines += ["outputs:"] + [f"  {spec.describe()}" for spec in interface.outputs]
    ops = Counter(interface.ops)
    if ops:
        lines += ["ops: " + ", ".join(f"{name} x{n}" for name, n in ops.most_common(_TOP_OPS))
                  + (f", ... ({len(ops)} kinds)" if len(ops) > _TOP_OPS else "")]
    lines += ["", f"looks like: {looks}"]
    problems = interface.problems()
    if problems:
        lines += ["", "edge-inferd cannot serve it:"] + [f"  - it {p}" for p in problems]
        return "\n".join(lines), False
    if not interface.batchable:
        lines += ["batch: fixed at 1 (its batch dimension cannot change): each request runs alone"]
    lines += ["", "a config that serves it (check it with edge-inferd check-config):", "",
              snippet(path, interface, kind)]
    return "\n".join(lines), True


def looks_like_image(spec: TensorSpec) -> bool:
    """Whether to propose `format: image` for an input: [height, width, 3] (RGB), uint8 or float,
    both sides at least _IMAGE_MIN_SIDE. One channel or an int8 input may as well be a feature
    map (a keyword model's int8 [49, 40, 1] spectrogram: sent as a PNG it scored 0.25 on every
    class): `may_be_image` says so, and the snippet proposes json with the other reading named."""
    sample = spec.sample_shape
    return len(sample) == 3 and sample[2] == 3 and spec.dtype != np.int8 and min(sample[:2]) >= _IMAGE_MIN_SIDE


def looks_like_audio(spec: TensorSpec) -> bool:
    """Whether to propose `format: pcm16`: a float input of one long (or dynamic) time axis."""
    if len(spec.sample_shape) != 1 or spec.dtype.kind != "f":
        return False
    return spec.sample_shape[0] >= _AUDIO_MIN_SAMPLES or len(dynamic_dims(spec.signature)) > 0


def looks_like_series(spec: TensorSpec) -> bool:
    """Whether to propose a stream: a time axis of at least _SERIES_MIN_STEPS samples of at most
    _SERIES_MAX_VALUES values each ([50, 6]: an IMU's window; [150]: one channel), not audio."""
    sample = spec.sample_shape
    if not sample or len(sample) > 2 or sample[0] < _SERIES_MIN_STEPS or looks_like_audio(spec):
        return False
    return len(sample) == 1 or sample[1] <= _SERIES_MAX_VALUES


def stream_hint(spec: TensorSpec, fmt: str) -> list[str]:
    """A commented `input.stream` for devices that publish a few samples a message (docs/streams.md):
    a window every half window for a series, every quarter second (at most a window) for audio."""
    if fmt == "pcm16":
        hop = min(_AUDIO_RATE_GUESS // 4, spec.sample_shape[0])
        unit = f"samples ({hop / _AUDIO_RATE_GUESS:g} s at the guessed rate)"
    elif looks_like_series(spec):
        hop, unit = max(1, spec.sample_shape[0] // 2), "samples (half a window)"
    else:
        return []
    return [f"    # devices that publish a few samples a message: add `stream: {{hop: {hop}}}` to input, a "
            f"window every {hop} {unit} from each device's stream (docs/streams.md)"]


def may_be_image(spec: TensorSpec) -> bool:
    """A picture or a feature map, which the file cannot tell: [height, width, 1 or 3] or a uint8
    [height, width], both sides at least _IMAGE_MIN_SIDE, and not surely an image."""
    sample = spec.sample_shape
    if len(sample) == 3 and sample[2] in _IMAGE_CHANNELS:
        sides = sample[:2]
    elif len(sample) == 2 and spec.dtype == np.uint8:
        sides = sample
    else:
        return False
    return min(sides) >= _IMAGE_MIN_SIDE and not looks_like_image(spec)


def quantized_steps(spec: TensorSpec) -> list[str]:
    """For a quantized input fed as json: the normalize that maps the model's raw integers onto its
    scale and zero point (real = (q - zero point) x scale), for a user who has the integers."""
    if not spec.quantized:
        return []
    return ["    preprocess: []   # send real values: the daemon quantizes them with the model's scale and zero point",
            f"    # or, to send the raw {spec.dtype} values the model takes (real = (q - {spec.zero_point}) x "
            f"{spec.scale:.6g}):",
            f"    #   - normalize: {{mean: {spec.zero_point}, std: {1 / spec.scale:.6g}}}"]


def pixel_steps(spec: TensorSpec) -> list[str]:
    """preprocess lines that turn pixels 0..255 into the model's real input values."""
    if spec.dtype == np.uint8:
        return []  # quantized vision models take the decoded pixels as they are
    span = spec.real_range()
    for (low, high), (mean, std) in _PIXEL_SCALINGS.items():
        if span and abs(span[0] - low) < _RANGE_TOLERANCE * 2 and abs(span[1] - high) < _RANGE_TOLERANCE * 2:
            return ["    preprocess:", f"      - normalize: {{mean: {mean}, std: {std}}}   # pixels -> {low:g}..{high:g}"]
    return ["    preprocess: []   # scale pixels to the values the model was trained on (unknown from the file)"]


def snippet(path: Path, interface: Interface, kind: str) -> str:
    spec = interface.inputs[0]
    stem = path.parent.name if path.stem == "model" and path.parent.name else path.stem
    name = stem.replace("-", "_").replace(".", "_") or "model"
    labelled = kind in ("classify", "detect")
    lines = ["models:", f"  {name}:", f"    path: {path}"]
    if labelled:
        lines.append(f"    labels: {path.with_suffix('.labels.txt')}   # one label per line, or 'id label' lines")
    lines += ["routes:", f"  - name: {name}", f"    subscribe: sensors/+/{name}", f"    model: {name}"]
    if looks_like_audio(spec):
        lines += [f"    input: {{format: pcm16, shape: {list(spec.sample_shape)}, sample_rate: {_AUDIO_RATE_GUESS}}}"
                  "   # audio? the rate is a guess (the file does not say); else format: json",
                  "    preprocess: []   # pcm16 arrives as int16 / 32768; a model trained on int16 values: "
                  "normalize: {std: 0.000030517578125}", *stream_hint(spec, "pcm16")]
    elif looks_like_image(spec):
        resize = ", resize: letterbox" if kind == "detect" else ""
        lines.append(f"    input: {{format: image, shape: {list(spec.sample_shape)}, dtype: uint8{resize}}}")
        lines += pixel_steps(spec)
    else:
        json_input = f"    input: {{format: json, shape: {list(spec.sample_shape)}, dtype: float32}}"
        if may_be_image(spec):
            json_input += (f"   # or pictures? if it was trained on them: format: image, shape "
                           f"{list(spec.sample_shape)}; a feature map sent as a picture answers wrong")
        lines += [json_input, *stream_hint(spec, "json"), *quantized_steps(spec)]
    top_k = min(_TOP_K, interface.outputs[0].sample_size)
    output = {"classify": f"{{kind: classify, top_k: {top_k}}}", "detect": "{kind: detect, min_score: 0.5, max_results: 10}",
              "anomaly": "{kind: anomaly, threshold: null}   # set it from `validate` (ROC-AUC, threshold at an FPR)",
              "values": "{kind: values}"}[kind]
    lines += [f"    output: {output}", f"    publish: results/{{1}}/{name}"]
    heads = raw_anchor_heads(interface.outputs)
    if heads is not None:
        lines += anchors_steps(interface, heads)
    return "\n".join(lines)


def anchors_steps(interface: Interface, heads: tuple[int, int]) -> list[str]:
    """A commented `decode: anchors` output for raw SSD heads: what the tensors say, filled in; the
    anchors' own settings (from the model's documentation or its MediaPipe graph) left to fill.
    Commented, so a snippet pasted as it is serves values, not boxes from guessed anchors."""
    boxes, scores = (interface.outputs[i] for i in heads)
    n, coords, classes = boxes.shape[1], boxes.shape[2], scores.shape[2]
    height, width = (interface.inputs[0].sample_shape + (0, 0))[:2]
    keypoints = (coords - _BOX_COORDS) // 2
    return ["    # raw anchor heads: for boxes, replace `output` with this, the anchors filled from the model's docs",
            "    # output:",
            "    #   kind: detect",
            "    #   decode: anchors",
            f"    #   anchors: {{num_layers: ?, min_scale: ?, max_scale: ?, input_size_height: {height}, "
            f"input_size_width: {width}, strides: [?], aspect_ratios: [1.0], fixed_anchor_size: ?}}",
            f"    #   num_boxes: {n}",
            f"    #   num_classes: {classes}",
            f"    #   num_coords: {coords}",
            f"    #   num_keypoints: {keypoints}   # if the values after the box are keypoint x, y pairs",
            f"    #   x_scale: {width}",
            f"    #   y_scale: {height}",
            f"    #   w_scale: {width}",
            f"    #   h_scale: {height}",
            "    #   sigmoid_score: true"]
