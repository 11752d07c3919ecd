"""Real float models written by others (issue 36), through the daemon's runtime and a plain
interpreter: what they are, what the daemon says of them today, and reference answers a later
decoder can be checked against.

- MediaPipe's BlazeFace (face_detection_short_range): a raw-anchor SSD with keypoints, 128x128x3
  float in [-1, 1], regressors [1, 896, 16] (box dx, dy, w, h, then 6 keypoints x, y, in input
  pixels from the anchor centre) and classificators [1, 896, 1] (logits); float16 weights.
- MediaPipe's pose_detection (the same kind, 2254 anchors, 4 keypoints) and pose_landmark_full
  (five named outputs).
- openWakeWord's chain: melspectrogram (input [-1, -1]: a number of audio samples fixed only by
  resize_tensor_input before allocate_tensors), embedding (dynamic batch), hey_jarvis.

The daemon serves each as it is (a float model is said so once: Interface.float_note);
melspectrogram, which no interpreter allocates at its stored [1, 1] shape, is sized to the
route's shape before allocation (daemon/model/dynamic.py). Files: scripts/fetch_test_models.sh,
tests/real_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from daemon.errors import ModelError
from daemon.model.interface import read_interface
from daemon.model.runtime import Model, open_interface
from tests.real_models import real_model

interpreter = pytest.importorskip("ai_edge_litert.interpreter")

BLAZEFACE = "face_detection_short_range.tflite"
POSE_DETECTOR = "pose_detection.tflite"
POSE_LANDMARKS = "pose_landmark_full.tflite"
MEL = "openwakeword_melspectrogram.tflite"
EMBEDDING = "openwakeword_embedding.tflite"
HEY_JARVIS = "openwakeword_hey_jarvis.tflite"

# name -> ((input name, shape, signature), [(output name, shape)]); all float32, none quantized.
INTERFACES = {
    BLAZEFACE: (("input", (1, 128, 128, 3), (1, 128, 128, 3)),
                [("regressors", (1, 896, 16)), ("classificators", (1, 896, 1))]),
    POSE_DETECTOR: (("input_1", (1, 224, 224, 3), (1, 224, 224, 3)),
                    [("Identity", (1, 2254, 12)), ("Identity_1", (1, 2254, 1))]),
    POSE_LANDMARKS: (("input_1", (1, 256, 256, 3), (1, 256, 256, 3)),
                     [("Identity", (1, 195)), ("Identity_1", (1, 1)), ("Identity_2", (1, 256, 256, 1)),
                      ("Identity_3", (1, 64, 64, 39)), ("Identity_4", (1, 117))]),
    EMBEDDING: (("serving_default_input_1:0", (1, 76, 32, 1), (-1, 76, 32, 1)),
                [("StatefulPartitionedCall:0", (1, 1, 1, 96))]),
    HEY_JARVIS: (("serving_default_x.1:0", (1, 16, 96), (1, 16, 96)), [("PartitionedCall:0", (1, 1))]),
}

# Hand-placed on scikit-image's astronaut (512x512 pixels): her right eye, left eye, nose tip, mouth
# centre, in BlazeFace's keypoint order.
ASTRONAUT_FACE_POINTS = [(202, 101), (246, 103), (224, 127), (222, 146)]


def _plain(name: str, **kwargs) -> object:
    return interpreter.Interpreter(model_path=str(real_model(name)), **kwargs)


@pytest.mark.parametrize("name", list(INTERFACES))
def test_the_daemon_serves_each_float_model_and_says_it_computes_in_float(name):
    model = Model(real_model(name))
    (in_name, in_shape, in_sig), outputs = INTERFACES[name]
    assert (model.input.name, model.input.shape, model.input.signature) == (in_name, in_shape, in_sig)
    assert [(o.name, o.shape) for o in model.outputs] == outputs
    specs = (model.input, *model.outputs)
    assert all(s.dtype == np.float32 and not s.quantized for s in specs)
    assert model.interface.quantized_tensors == 0 and model.interface.problems() == []
    assert "computes in float" in model.interface.float_note(name)
    assert model.batchable == (in_sig[0] == -1)


@pytest.mark.parametrize("name", [BLAZEFACE, POSE_DETECTOR, POSE_LANDMARKS])
def test_mediapipe_models_keep_float16_weights_dequantized_in_the_graph(name):
    it = _plain(name)
    it.allocate_tensors()
    dtypes = [np.dtype(d["dtype"]) for d in it.get_tensor_details()]
    assert dtypes.count(np.dtype(np.float16)) > 0  # the weights
    assert "DEQUANTIZE" in read_interface(it).ops  # float16 -> float32, before the float kernels
    # float16 is not a quantized integer: the daemon counts no quantized tensor here.
    assert read_interface(it).quantized_tensors == 0


def _astronaut_128() -> np.ndarray:
    with Image.open(real_model("astronaut.png")) as im:
        pixels = np.asarray(im.convert("RGB").resize((128, 128), Image.BILINEAR), dtype=np.float32)
    return (pixels / 127.5 - 1.0)[None]


def _blazeface_anchor_centres() -> np.ndarray:
    """The short-range model's 896 anchor centres (x, y in 0..1): strides 8 and 16, 2 anchors per
    cell of the 16x16 grid, then 6 per cell of the 8x8 (MediaPipe's SsdAnchorsCalculator, fixed size)."""
    centres = [((x + 0.5) / grid, (y + 0.5) / grid)
               for grid, per_cell in ((16, 2), (8, 6))
               for y in range(grid) for x in range(grid) for _ in range(per_cell)]
    return np.array(centres, dtype=np.float32)


def test_blazeface_finds_the_astronauts_face_through_the_daemons_runtime():
    x = _astronaut_128()
    model = Model(real_model(BLAZEFACE))
    out = model.infer(x)  # both outputs, flattened and concatenated in output order
    assert out.shape == (1, 896 * 16 + 896)
    regressors, logits = out[0, :896 * 16].reshape(896, 16), out[0, 896 * 16:]

    it = _plain(BLAZEFACE)  # the same answer as a plain interpreter's
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    ref = {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}
    np.testing.assert_allclose(regressors, ref["regressors"][0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(logits, ref["classificators"][0, :, 0], rtol=0, atol=1e-5)

    scores = 1.0 / (1.0 + np.exp(-np.clip(logits, -80.0, 80.0)))
    best = int(np.argmax(scores))
    assert best == 141 and scores[best] == pytest.approx(0.921, abs=0.01)
    assert int((scores > 0.5).sum()) >= 2  # neighbours overlap: a decoder needs its NMS

    centre = _blazeface_anchor_centres()[best]
    r = regressors[best] / 128.0  # input pixels -> fraction of the input
    cx, cy, w, h = centre[0] + r[0], centre[1] + r[1], r[2], r[3]
    box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) * 512
    keypoints = (centre + r[4:16].reshape(6, 2)) * 512
    for (px, py), (kx, ky) in zip(ASTRONAUT_FACE_POINTS, keypoints[:4]):
        assert abs(kx - px) <= 12 and abs(ky - py) <= 12, (keypoints.round().tolist(), ASTRONAUT_FACE_POINTS)
        assert box[0] < px < box[2] and box[1] < py < box[3], box.round().tolist()
    assert 70 <= box[2] - box[0] <= 130 and 70 <= box[3] - box[1] <= 130  # a face, not the whole photo


def test_pose_landmarks_serve_all_five_outputs_in_order():
    model = Model(real_model(POSE_LANDMARKS))
    assert model.num_outputs == 195 + 1 + 256 * 256 + 64 * 64 * 39 + 117
    out = model.infer(np.zeros((1, 256, 256, 3), np.float32))
    assert out.shape == (1, model.num_outputs) and np.isfinite(out).all()


def _mel(samples: np.ndarray) -> np.ndarray:
    it = _plain(MEL)
    it.resize_tensor_input(0, list(samples.shape))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], samples)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_melspectrogram_needs_its_sample_count_before_allocate():
    it = _plain(MEL)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    assert list(inp["shape"]) == [1, 1] and list(inp["shape_signature"]) == [-1, -1]
    assert list(out["shape_signature"]) == [-1, 1, -1, 32]
    with pytest.raises(RuntimeError, match="failed to prepare"):  # 1 sample: shorter than one window
        it.allocate_tensors()
    # 512-sample windows every 160 samples (16 kHz: 32 ms every 10 ms), 32 mel bands each.
    for n in (512, 1280, 1760):
        assert _mel(np.zeros((1, n), np.float32)).shape == (1, 1, (n - 512) // 160 + 1, 32)
    # The daemon sizes it to the route's shape before allocating, and says what to set without one.
    audio = np.random.default_rng(4).standard_normal((3, 1280)).astype(np.float32) * 300
    model = Model(real_model(MEL), sample_shape=(1280,), max_batch=4)
    assert model.sample_shape == (1280,) and model.input.signature == (-1, -1) and model.batchable
    np.testing.assert_allclose(model.infer(audio), np.stack([_mel(a[None]).ravel() for a in audio]),
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(ModelError, match=r"dynamic dimension\(s\) \[1\] .*set routes\[\]\.input\.shape"):
        Model(real_model(MEL))
    with pytest.raises(ModelError, match=r"cannot take a sample of \[2, 1280\]"):
        Model(real_model(MEL), sample_shape=(2, 1280))
    interface = open_interface(real_model(MEL))  # inspect: sized with the first length it prepares with
    assert interface.inputs[0].signature == (-1, -1) and interface.inputs[0].shape[1] >= 512


def test_the_openwakeword_chain_runs_with_the_embedding_batched_by_the_daemon():
    rng = np.random.default_rng(36)
    frames = 76 + 15 * 8  # 16 embedding windows of 76 mel frames, 8 apart
    audio = (rng.standard_normal((1, 512 + (frames - 1) * 160)) * 300).astype(np.float32)  # int16-scale noise
    mel = _mel(audio)[0, 0] / 10.0 + 2.0  # openWakeWord's own scaling of the model's output
    assert mel.shape == (frames, 32)
    windows = np.stack([mel[i:i + 76] for i in range(0, frames - 75, 8)])[..., None]
    assert windows.shape == (16, 76, 32, 1)

    embedding = Model(real_model(EMBEDDING), max_batch=16)
    assert embedding.batchable and embedding.buckets == (1, 2, 4, 8, 16)
    features = embedding.infer(windows)  # one invoke at batch 16
    one = _plain(EMBEDDING)
    one.allocate_tensors()
    for i in (0, 15):  # each row as it scores alone
        one.set_tensor(one.get_input_details()[0]["index"], windows[i:i + 1])
        one.invoke()
        np.testing.assert_allclose(features[i], one.get_tensor(one.get_output_details()[0]["index"]).ravel(),
                                   rtol=1e-4, atol=1e-4)

    jarvis = Model(real_model(HEY_JARVIS))
    score = float(jarvis.infer(features[None])[0, 0])
    assert 0.0 <= score < 0.5  # noise is no wake word
