"""What the real third-party models do, with the plain ai_edge_litert Interpreter and no daemon code.

The reference the daemon's own real-model tests stand on: the photos' known content
(scikit-image's astronaut, chelsea the cat, a cup of coffee), found by Coral's SSD MobileNet v2
(COCO, uint8 in, TFLite_Detection_PostProcess out) and EfficientNet-Lite0 (ImageNet, uint8 in
and out), each photo resized with Pillow BILINEAR and fed as raw uint8 pixels; and the two
models the daemon must refuse: a stateful streaming wake-word model (resource variables) and an
Edge TPU compiled one (a custom op no CPU runtime has). Files: tests/real_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.real_models import real_model

interpreter = pytest.importorskip("ai_edge_litert.interpreter")

SSD = "ssd_mobilenet_v2_coco_quant.tflite"
CLASSIFIER = "efficientnet_lite0_uint8.tflite"
IMAGENET_CATS = range(281, 286)  # tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat


def _pixels(photo: str, size: tuple[int, int]) -> np.ndarray:
    with Image.open(real_model(photo)) as im:
        return np.asarray(im.convert("RGB").resize(size, Image.BILINEAR), dtype=np.uint8)[None]


def _coco_labels() -> dict[int, str]:
    """"id  label" lines, ids 0-based with COCO's gaps (80 labels, ids up to 89)."""
    labels = {}
    for line in real_model("coco_labels.txt").read_text().splitlines():
        if line.strip():
            i, name = line.split(maxsplit=1)
            labels[int(i)] = name.strip()
    return labels


@pytest.fixture(scope="module")
def ssd():
    it = interpreter.Interpreter(model_path=str(real_model(SSD)))
    it.allocate_tensors()
    return it


@pytest.fixture(scope="module")
def classifier():
    it = interpreter.Interpreter(model_path=str(real_model(CLASSIFIER)))
    it.allocate_tensors()
    return it


def test_coco_labels_are_zero_based_with_gaps():
    labels = _coco_labels()
    assert len(labels) == 80 and max(labels) == 89
    assert (labels[0], labels[16], labels[46]) == ("person", "cat", "cup")


def test_ssd_signature(ssd):
    (inp,) = ssd.get_input_details()
    assert inp["dtype"] == np.uint8 and list(inp["shape"]) == [1, 300, 300, 3]
    outs = ssd.get_output_details()
    assert [o["dtype"] for o in outs] == [np.float32] * 4
    assert [list(o["shape"]) for o in outs] == [[1, 20, 4], [1, 20], [1, 20], [1]]  # boxes, classes, scores, count


@pytest.mark.parametrize(("photo", "cls", "label", "min_score"), [
    ("astronaut.png", 0, "person", 0.5),
    ("chelsea.png", 16, "cat", 0.6),
    ("coffee.png", 46, "cup", 0.6),
])
def test_ssd_finds_the_photos_subject_first(ssd, photo, cls, label, min_score):
    inp = ssd.get_input_details()[0]
    ssd.set_tensor(inp["index"], _pixels(photo, (300, 300)))
    ssd.invoke()
    boxes, classes, scores, count = (ssd.get_tensor(o["index"]) for o in ssd.get_output_details())
    assert int(count[0]) >= 1
    assert np.all(np.diff(scores[0, :int(count[0])]) <= 0)  # best first
    assert int(classes[0, 0]) == cls and _coco_labels()[cls] == label
    assert scores[0, 0] > min_score, f"{photo}: {label} only {scores[0, 0]:.3f}"
    ymin, xmin, ymax, xmax = boxes[0, 0]
    assert 0.0 <= ymin < ymax <= 1.05 and -0.05 <= xmin < xmax <= 1.05  # normalised, y first


def test_classifier_labels_ride_inside_the_model():
    """The .tflite carries its labels as a zip member; the fetch took them out, unchanged."""
    import zipfile

    with zipfile.ZipFile(real_model(CLASSIFIER)) as z:
        embedded = z.read("labels_without_background.txt")
    assert embedded == real_model("efficientnet_lite0_labels.txt").read_bytes()
    labels = embedded.decode().splitlines()
    assert len(labels) == 1000 and labels[281] == "tabby" and labels[285] == "Egyptian cat"


@pytest.mark.parametrize(("photo", "allowed"), [
    ("chelsea.png", {"tabby", "tiger cat", "Egyptian cat"}),
    ("coffee.png", {"espresso", "cup"}),
])
def test_classifier_top1(classifier, photo, allowed):
    (inp,), (out,) = classifier.get_input_details(), classifier.get_output_details()
    assert inp["dtype"] == np.uint8 and list(inp["shape"]) == [1, 224, 224, 3]
    assert out["dtype"] == np.uint8 and list(out["shape"]) == [1, 1000]
    classifier.set_tensor(inp["index"], _pixels(photo, (224, 224)))
    classifier.invoke()
    y = classifier.get_tensor(out["index"])[0]
    top = int(np.argmax(y))
    label = real_model("efficientnet_lite0_labels.txt").read_text().splitlines()[top]
    assert label in allowed, f"{photo}: top-1 {top} {label!r}"
    assert photo != "chelsea.png" or top in IMAGENET_CATS
    scale, zero = out["quantization"]
    assert (int(y[top]) - zero) * scale > 0.5  # a confident softmax, not a near tie


def test_wakeword_model_is_stateful():
    it = interpreter.Interpreter(model_path=str(real_model("okay_nabu_stateful.tflite")))
    ops = {d["op_name"] for d in it._get_ops_details()}
    assert {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} <= ops


def test_edgetpu_model_does_not_allocate_on_the_cpu():
    it = interpreter.Interpreter(model_path=str(real_model("ssd_mobilenet_v2_coco_quant_edgetpu.tflite")))
    assert "edgetpu-custom-op" in {d["op_name"] for d in it._get_ops_details()}
    with pytest.raises(RuntimeError, match="edgetpu-custom-op"):
        it.allocate_tensors()


def test_deeplab_is_a_float_model():
    it = interpreter.Interpreter(model_path=str(real_model("deeplabv3_float.tflite")))
    assert it.get_input_details()[0]["dtype"] == np.float32
    assert it.get_output_details()[0]["dtype"] == np.float32
