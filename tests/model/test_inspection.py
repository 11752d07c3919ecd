"""`edge-inferd inspect`: the report on a model, and a snippet that check-config accepts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from daemon import cli
from daemon.config.loader import load_config
from daemon.model.interface import Interface
from daemon.model.inspection import looks_like_image, report
from daemon.model.runtime import Model, open_interface
from tests.real_models import real_model

ROOT = Path(__file__).resolve().parents[2]


def _snippet_config(tmp_path: Path, text: str, labels: int = 0) -> Path:
    """The report's snippet as a whole config file, with a labels file of `labels` lines."""
    snippet = yaml.safe_load(text.split("check it with edge-inferd check-config):", 1)[1])
    for model in snippet["models"].values():
        if "labels" in model:
            Path(model["labels"]).write_text("".join(f"class {i}\n" for i in range(labels)))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"mqtt": {"broker": "localhost:1883"}, "cache": {"dir": str(tmp_path / "c")},
                                    **snippet}))
    return path


def test_a_bundled_classifier_is_described_and_its_snippet_checks(tmp_path):
    model = tmp_path / "activity" / "model.tflite"
    model.parent.mkdir()
    model.write_bytes((ROOT / "models/activity/model.tflite").read_bytes())
    text, servable = report(model)
    assert servable and "looks like: a classifier over 4 classes" in text
    assert "int8 [1, 50, 6] (dynamic batch; scale" in text and "real values -6.793 .. 6.635" in text
    config = load_config(_snippet_config(tmp_path, text, labels=4))
    assert config.routes[0].name == "activity" and config.routes[0].kind == "classify"


def test_a_two_class_classifier_is_proposed_top_k_2(tmp_path):
    model = tmp_path / "gunpoint" / "model.tflite"
    model.parent.mkdir()
    model.write_bytes((ROOT / "models/gunpoint/model.tflite").read_bytes())
    text, servable = report(model)
    assert servable and "output: {kind: classify, top_k: 2}" in text  # check-config refuses top_k 3 of 2
    assert load_config(_snippet_config(tmp_path, text, labels=2)).routes[0].top_k == 2


@pytest.mark.parametrize("name, kind, labels", [("ssd_mobilenet_v2_coco_quant.tflite", "detect", 90),
                                                ("efficientnet_lite0_uint8.tflite", "classify", 1000)])
def test_real_models_get_a_snippet_that_checks(tmp_path, name, kind, labels):
    model = tmp_path / name
    model.write_bytes(real_model(name).read_bytes())
    text, servable = report(model)
    assert servable and "batch: fixed at 1" in text
    config = load_config(_snippet_config(tmp_path, text, labels))
    route = config.routes[0]
    assert route.kind == kind and route.input.format == "image" and route.input.dtype == "uint8"


def test_a_stateful_model_is_named_and_the_command_exits_1(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["inspect", str(real_model("okay_nabu_stateful.tflite"))])
    assert done.value.code == cli.EXIT_FAIL
    out = capsys.readouterr().out
    assert "looks like: a stateful streaming model: not supported" in out and "VAR_HANDLE" in out
    assert "routes:" not in out


def test_an_edge_tpu_model_is_a_model_error_that_says_so(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["inspect", str(real_model("ssd_mobilenet_v2_coco_quant_edgetpu.tflite"))])
    assert done.value.code == cli.EXIT_CONFIG
    assert "Edge TPU model" in capsys.readouterr().err


def test_an_int8_image_model_gets_the_pixel_scaling_its_input_range_says(tmp_path):
    from daemon.model.inspection import pixel_steps
    from tests.fakes import tensor_spec

    assert pixel_steps(tensor_spec((1, 96, 96, 3), np.int8, scale=1 / 128, zero_point=0)) == [
        "    preprocess:", "      - normalize: {mean: 127.5, std: 127.5}   # pixels -> -1..1"]
    assert pixel_steps(tensor_spec((1, 96, 96, 3), np.uint8, scale=1 / 255, zero_point=0)) == []


# --- What inspect reads and proposes, held against every real model the tests fetch and every bundled one ---

# name -> whether its input is an image. The image models: the two SSD MobileNets (uint8 [300, 300, 3]),
# EfficientNet-Lite0 (uint8 [224, 224, 3]) and DeepLab v3 (float [257, 257, 3]); the others take a
# sensor window, a feature vector or (okay_nabu) audio features [3, 40].
REAL_MODELS = {"ssd_mobilenet_v2_coco_quant.tflite": True, "ssd_mobilenet_v2_coco_quant_edgetpu.tflite": True,
               "efficientnet_lite0_uint8.tflite": True, "deeplabv3_float.tflite": True,
               "okay_nabu_stateful.tflite": False,
               # MediaPipe's (float16 weights): BlazeFace [128, 128, 3], BlazePose's detector [224, 224, 3]
               # and its landmarks [256, 256, 3]; openWakeWord's chain: audio samples (a dynamic [-1, -1]),
               # a mel feature map [76, 32, 1] (one channel: a picture to a guess, and wrong) and [16, 96]
               "face_detection_short_range.tflite": True, "pose_detection.tflite": True,
               "pose_landmark_full.tflite": True, "openwakeword_melspectrogram.tflite": False,
               "openwakeword_embedding.tflite": False, "openwakeword_hey_jarvis.tflite": False}
AUDIO = {"openwakeword_melspectrogram.tflite"}  # a dynamic run of samples: proposed as pcm16
BUNDLED = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("models/*/*.tflite"))


def _model_path(name: str) -> Path:
    return ROOT / name if name.startswith("models/") else real_model(name)


def _file_ops(path: Path) -> tuple[str, ...]:
    """The operators of the file's main subgraph, read from the flatbuffer by the TFLite schema
    that ai-edge-litert ships (no runtime involved)."""
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    model = schema.Model.GetRootAsModel(path.read_bytes(), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    codes = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())  # the schema's rule for old files
        codes.append(code.CustomCode().decode() if builtin == schema.BuiltinOperator.CUSTOM else names[builtin])
    graph = model.Subgraphs(0)
    return tuple(codes[graph.Operators(j).OpcodeIndex()] for j in range(graph.OperatorsLength()))


def test_every_model_is_held_here():
    manifest = json.loads((real_model("coco_labels.txt").parent / "MANIFEST.json").read_text())
    assert set(REAL_MODELS) == {name for name in manifest if name.endswith(".tflite")}
    assert len(BUNDLED) == 10  # model.tflite and model_float.tflite of the five bundled models


@pytest.mark.parametrize("name", [*REAL_MODELS, *BUNDLED])
def test_the_ops_are_the_files_own_not_a_delegates(name):
    path = _model_path(name)
    if name.endswith("_edgetpu.tflite"):  # no runtime here loads it (test_an_edge_tpu_model_is_a_model_error...)
        assert "DELEGATE" not in _file_ops(path)
        return
    interface = open_interface(path)
    assert "DELEGATE" not in interface.ops and "DELEGATE" not in report(path)[0]
    if not interface.problems():  # as the daemon loads it, XNNPACK and all: the same ops
        assert Model(path, sample_shape=interface.inputs[0].sample_shape).interface.ops == interface.ops
    assert interface.ops == _file_ops(path)  # (skipped where ai-edge-litert is not installed)


@pytest.mark.parametrize("name", [n for n in [*REAL_MODELS, *BUNDLED] if not n.endswith("_edgetpu.tflite")])
def test_an_image_is_proposed_for_the_image_models_only(tmp_path, name):
    """(The Edge TPU model cannot be opened here; its CPU version, the same interface, stands for it.)"""
    source = _model_path(name)
    model = tmp_path / source.parent.name / source.name  # models/X/model.tflite keeps its name X
    model.parent.mkdir()
    model.write_bytes(source.read_bytes())
    image = REAL_MODELS.get(name, False)
    interface = open_interface(model)
    assert looks_like_image(interface.inputs[0]) is image
    text, servable = report(model)
    if servable:  # the snippet proposes that format, and check-config takes it
        labels = 90 if len(interface.outputs) > 1 else interface.outputs[0].sample_size
        route = load_config(_snippet_config(tmp_path, text, labels)).routes[0]
        assert route.input.format == ("image" if image else "pcm16" if name in AUDIO else "json")
        assert tuple(route.input.shape) == interface.inputs[0].sample_shape


@pytest.mark.parametrize("shape, dtype, image, maybe", [
    ((1, 128, 3, 1), np.int8, False, False),  # an accelerometer window: x, y, z over 128 samples
    ((1, 5, 128, 1), np.int8, False, False),  # five stacked spectra
    ((1, 1460, 1), np.int8, False, False),  # a power trace
    ((1, 100, 6), np.float32, False, False),  # an IMU window
    ((1, 96, 96, 1), np.int8, False, True),  # person detection, grayscale ... or a feature map
    ((1, 49, 40, 1), np.int8, False, True),  # a keyword model's spectrogram: json, the picture named
    ((1, 76, 32, 1), np.float32, False, True),  # openWakeWord's mel window
    ((1, 224, 224, 3), np.float32, True, False),
    ((1, 224, 224, 3), np.uint8, True, False),
    ((1, 28, 28), np.uint8, False, True),  # grayscale without a channel axis: pixels, or not
    ((1, 28, 28), np.int8, False, False),  # an int8 [H, W] is a window or a spectrogram as often
    ((1, 128, 3, 1), np.uint8, False, False),  # uint8 does not make an accelerometer window an image
    ((1, 15, 64, 3), np.uint8, False, False),  # a side under 16
    ((1, 16, 16, 3), np.int8, False, True),  # int8 RGB: a picture, or three feature planes
    ((1, 224, 224, 4), np.uint8, False, False),  # RGBA: the image route takes 1 or 3 channels
    ((1, 3, 224, 224), np.float32, False, False),  # channels first: not the image route's layout
])
def test_the_image_heuristic(shape, dtype, image, maybe):
    from daemon.model.inspection import may_be_image
    from tests.fakes import tensor_spec

    spec = tensor_spec(shape, dtype, scale=0.1 if dtype != np.float32 else 0.0)
    assert (looks_like_image(spec), may_be_image(spec)) == (image, maybe)


@pytest.mark.parametrize("shape, signature, dtype, audio", [
    ((1, 1280), (-1, -1), np.float32, True),  # openWakeWord's melspectrogram: any number of samples
    ((1, 16000), (1, 16000), np.float32, True),  # one second at 16 kHz
    ((1, 1460), (1, 1460), np.float32, False),  # a power trace: too short for audio
    ((1, 16000), (1, 16000), np.int8, False),  # quantized: a feature vector, not samples
    ((1, 16000, 1), (1, 16000, 1), np.float32, False),  # a second axis: a sensor window
])
def test_the_audio_heuristic(shape, signature, dtype, audio):
    from daemon.model.inspection import looks_like_audio
    from daemon.model.interface import TensorSpec

    assert looks_like_audio(TensorSpec(0, "t", shape, signature, np.dtype(dtype), 0.0, 0)) is audio


def test_a_feature_map_is_proposed_as_json_with_the_picture_named_and_its_raw_integers_normalize():
    """An int8 [49, 40, 1] input (a keyword model's spectrogram) once got `format: image`: the features
    sent as a PNG scored 0.25 on all four classes, where a direct invoke said _silence_ 0.996."""
    from daemon.model.inspection import snippet
    from tests.fakes import tensor_spec

    spec = tensor_spec((1, 49, 40, 1), np.int8, scale=0.1, zero_point=-128)
    interface = Interface((spec,), (tensor_spec((1, 4), np.int8, scale=1 / 256, zero_point=-128),), (), 5)
    text = snippet(Path("kws.tflite"), interface, "classify")
    route = yaml.safe_load(text)["routes"][0]
    assert route["input"] == {"format": "json", "shape": [49, 40, 1], "dtype": "float32"}
    assert "or pictures? if it was trained on them: format: image" in text
    assert route["preprocess"] == [] and "#   - normalize: {mean: -128, std: 10}" in text
    raw = np.array([-128, 0, 127], np.float32)  # what that normalize makes of raw integers: the real values
    assert np.allclose((raw - -128) / 10, (raw - spec.zero_point) * spec.scale)


def test_raw_anchor_heads_are_recognised_with_an_anchors_snippet_to_fill(tmp_path):
    name = "face_detection_short_range.tflite"
    model = tmp_path / name
    model.write_bytes(real_model(name).read_bytes())
    text, servable = report(model)
    assert servable and "an SSD detector with raw anchor heads (boxes [1, 896, 16], scores [1, 896, 1]" in text
    assert "#   decode: anchors" in text and "#   num_boxes: 896" in text and "#   num_keypoints: 6" in text
    route = load_config(_snippet_config(tmp_path, text)).routes[0]
    assert route.kind == "values"  # pasted as it is: values, never boxes from guessed anchors


@pytest.mark.parametrize("shape, dtype, hop", [
    ((1, 50, 6), np.int8, 25),  # an IMU window: a stream of 6-value samples
    ((1, 150), np.float32, 75),  # one channel's trace
    ((1, 16000), np.float32, 4000),  # audio: every 0.25 s
    ((1, 1280), np.float32, 640),  # a fixed 1280-value trace: too short for audio, a series
    ((1, 49, 40, 1), np.int8, None),  # a feature map: no time axis of samples
    ((1, 8, 6), np.float32, None),  # too short a window to stream
    ((1, 50, 64), np.float32, None),  # samples too wide: features, not a sensor's readings
])
def test_a_long_time_axis_is_proposed_as_a_stream_and_the_stream_it_proposes_checks(tmp_path, shape, dtype, hop):
    from daemon.model.inspection import snippet
    from tests.fakes import tensor_spec

    interface = Interface((tensor_spec(shape, dtype, scale=0.1 if dtype == np.int8 else 0.0),),
                          (tensor_spec((1, 4), np.float32),), (), 5)
    text = snippet(tmp_path / "m.tflite", interface, "values")
    proposed = [line for line in text.splitlines() if "stream: {hop:" in line]
    assert proposed == ([] if hop is None else [proposed[0]]) and (hop is None or f"stream: {{hop: {hop}}}" in text)
    if hop is not None:  # taken at its word, the proposal is a config that checks
        raw = yaml.safe_load(text)
        raw["routes"][0]["input"]["stream"] = {"hop": hop}
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({"mqtt": {"broker": "localhost:1883"}, **raw}))
        assert load_config(path, check_models=False).routes[0].input.stream.hop == hop
