"""A model's kind read from its tensors (daemon/model/interface.py): the detector layouts, the
guess `inspect` prints, and the reasons a model cannot be served."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.model.interface import SSD, YOLO, Interface, TensorSpec, detector_layout, guess_kind, ssd_outputs
from tests.fakes import tensor_spec


def _outputs(*shapes, names=None) -> tuple[TensorSpec, ...]:
    names = names or [f"out{i}" for i in range(len(shapes))]
    return tuple(tensor_spec(s, name=n, index=i) for i, (s, n) in enumerate(zip(shapes, names)))


@pytest.mark.parametrize("shapes", [[(1, 20, 4), (1, 20), (1, 20), (1,)], [(1, 10, 4), (1, 10), (1, 10), (1, 1)]])
def test_the_ssd_post_process_outputs_are_a_detector(shapes):
    assert detector_layout(_outputs(*shapes)) == SSD


def test_ssd_outputs_in_another_order_are_found_by_shape_and_name():
    found = ssd_outputs(_outputs((1, 10), (1, 10, 4), (1,), (1, 10),
                                 names=["detection_scores", "detection_boxes", "num", "detection_classes"]))
    assert (found.boxes, found.classes, found.scores, found.count) == (1, 3, 0, 2)


@pytest.mark.parametrize("shape", [(1, 84, 8400), (1, 8400, 84)])
def test_a_yolo_output_either_way_round_is_a_detector(shape):
    assert detector_layout(_outputs(shape)) == YOLO


@pytest.mark.parametrize("shapes", [
    [(1, 1000)], [(1, 4, 8400)], [(1, 20, 4), (1, 19), (1, 20), (1,)], [(1, 20, 4), (1, 20), (1, 20)],
    [(2, 84, 8400)], [(1, 84, 8400), (1, 84, 8400)], [(1, 28, 28)], [],
])
def test_other_outputs_are_no_detector(shapes):
    assert detector_layout(_outputs(*shapes)) is None


def _interface(inputs, outputs, ops=(), quantized=10, resources=0) -> Interface:
    return Interface(tuple(inputs), tuple(outputs), tuple(ops), quantized, resources)


def test_the_guess_names_each_kind():
    image = tensor_spec((1, 300, 300, 3), np.uint8, scale=0.0078125, zero_point=128)
    window = tensor_spec((1, 50, 6), np.int8, scale=0.05, zero_point=1)
    assert guess_kind(_interface([image], _outputs((1, 20, 4), (1, 20), (1, 20), (1,))))[0] == "detect"
    assert guess_kind(_interface([window], _outputs((1, 4))))[0] == "classify"
    assert guess_kind(_interface([window], _outputs((1, 50, 6))))[0] == "anomaly"
    assert guess_kind(_interface([window], _outputs((1, 1))))[0] == "values"
    assert guess_kind(_interface([window], _outputs((1, 1)), ops=("VAR_HANDLE",)))[0] == ""


def test_the_reasons_a_model_cannot_be_served():
    window = tensor_spec((1, 50, 6), np.int8, scale=0.05, zero_point=1)
    assert _interface([window], _outputs((1, 4))).problems() == []
    two = _interface([window, tensor_spec((1, 3), name="mask")], _outputs((1, 4))).problems()
    assert two == ["takes 2 inputs (t, mask); edge-inferd feeds one tensor per request"]
    stateful = _interface([window], _outputs((1, 4)), resources=2).problems()
    assert len(stateful) == 1 and "stateful streaming model (2 resource tensors)" in stateful[0]
    floats = _interface([tensor_spec((1, 50, 6))], _outputs((1, 4)), quantized=0)
    assert floats.problems() == [] and floats.computes_in_float  # served, and said so once (float_note)
    raw_int = _interface([tensor_spec((1, 50, 6), np.int8)], _outputs((1, 4)))
    assert "int8 unquantized" in raw_int.problems()[0]


def test_a_quantized_tensor_says_what_real_values_its_integers_stand_for():
    spec = tensor_spec((1, 300, 300, 3), np.uint8, "image", 0.0078125, 128)
    assert spec.real_range() == (-1.0, 127 * 0.0078125) and tensor_spec((1, 4)).real_range() is None
    assert "real values -1 .. 0.9922" in spec.describe() and "batch 1" in spec.describe()
