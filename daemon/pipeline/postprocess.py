"""One row of a model's outputs -> the fields of a reply, by the route's output kind.

The model's outputs arrive flattened and concatenated in output order (one float32 row per
request: runtime.Model.infer_quantized), which is also what the cache and the reuse fast path
keep, so every kind is cached and reused alike. `ModelOutputs` says where each output sits
in that row; each kind reads its own part:
- classify: the scores' top_k, labelled (the caller may pass the order of a sorted batch);
- detect: an SSD's four outputs or a YOLO tensor -> boxes in the sent image's pixels;
- anomaly: the reconstruction error against the model's real-valued input;
- values: every output, dequantized, by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

import numpy as np

from daemon.config.anchors import AnchorDecode, find_outputs
from daemon.config.schema import ANOMALY, CLASSIFY, DETECT, RouteConfig
from daemon.model.interface import Interface, SsdOutputs, TensorSpec, ssd_outputs
from daemon.pipeline.geometry import Geometry
from daemon.pipeline.kinds import anchors, anomaly, detect

VALUE_DECIMALS = 6
# A `values` reply without output.outputs carries each output of at most this many values: a
# segmentation mask (256 x 256) or a heatmap stack would make every reply megabytes of JSON.
VALUES_DEFAULT_MAX = 4096
# Routes with `decode: anchors` whose heads are remembered (a reload's new ones push out the old).
ANCHOR_ROUTES_CACHED = 64


Labelled = Callable[[int], str]  # a label by output index or class id


@dataclass(frozen=True)
class ModelOutputs:
    """Where each output of a model lies in its flat row, and what a detector's are."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # start of each output in the row; the last entry is the row's length
    input_size: tuple[int, int]  # (width, height) of an image model's input, else (1, 1)
    ssd: Optional[SsdOutputs] = None  # None: the YOLO layout (check-config allows no other detector)

    @classmethod
    def of(cls, interface: Interface) -> "ModelOutputs":
        specs: tuple[TensorSpec, ...] = interface.outputs
        offsets = [0]
        for spec in specs:
            offsets.append(offsets[-1] + spec.sample_size)
        shape = interface.inputs[0].sample_shape if interface.inputs else ()
        size = (shape[1], shape[0]) if len(shape) >= 2 else (1, 1)
        return cls(tuple(s.name for s in specs), tuple(s.sample_shape for s in specs), tuple(offsets), size,
                   ssd_outputs(specs))

    def part(self, row: np.ndarray, index: int) -> np.ndarray:
        return row[self.offsets[index]:self.offsets[index + 1]].reshape(self.shapes[index])


def fields(route: RouteConfig, labels: Labelled, outputs: Optional[ModelOutputs], row: np.ndarray,
           order: Optional[np.ndarray] = None, x: Optional[np.ndarray] = None,
           geometry: Optional[Geometry] = None) -> dict[str, Any]:
    """The kind's fields of one reply. `x`: the model's real-valued input row (anomaly);
    `geometry`: where the sent image lies in the model's input (detect)."""
    if route.kind == CLASSIFY:
        return _classify(route, labels, row, order)
    if route.kind == DETECT:
        return {"detections": detect.to_reply(_detections(route, outputs, row), labels,
                                              geometry or Geometry.identity(*outputs.input_size))}
    if route.kind == ANOMALY:
        score = float(anomaly.anomaly_score(x.reshape(1, -1), row.reshape(1, -1))[0])
        return anomaly.to_reply(score, route.threshold)
    return _values(route, outputs, row)


def _values(route: RouteConfig, outputs: ModelOutputs, row: np.ndarray) -> dict[str, Any]:
    """The named outputs (route.outputs), else every one of at most VALUES_DEFAULT_MAX values;
    what that leaves out is named with its shape, so a reply never hides an output silently."""
    named = route.outputs or tuple(n for i, n in enumerate(outputs.names)
                                   if outputs.offsets[i + 1] - outputs.offsets[i] <= VALUES_DEFAULT_MAX)
    index = {name: i for i, name in enumerate(outputs.names)}
    reply: dict[str, Any] = {"values": {name: np.round(outputs.part(row, index[name]), VALUE_DECIMALS).tolist()
                                        for name in named}}
    left = {name: list(outputs.shapes[i]) for name, i in index.items() if name not in named}
    if left and not route.outputs:
        reply["left_out"] = left
    return reply


def _classify(route: RouteConfig, labels: Labelled, scores: np.ndarray, order: Optional[np.ndarray]) -> dict:
    if order is None:
        order = np.argsort(-scores, kind="stable")
    best = int(order[0])
    return {
        "label": labels(best),
        "index": best,
        "score": round(float(scores[best]), VALUE_DECIMALS),
        "top_k": [{"label": labels(int(i)), "score": round(float(scores[i]), VALUE_DECIMALS)}
                  for i in order[: route.top_k]],
    }


def _detections(route: RouteConfig, outputs: ModelOutputs, row: np.ndarray) -> list[detect.Detection]:
    if route.anchor_decode is not None:
        return _anchor_detections(route, route.anchor_decode, outputs, row)
    if outputs.ssd is not None:
        s = outputs.ssd
        return detect.ssd(outputs.part(row, s.boxes), outputs.part(row, s.classes), outputs.part(row, s.scores),
                          outputs.part(row, s.count), route.min_score, route.max_results)
    return detect.yolo(outputs.part(row, 0), route.min_score, route.max_results, outputs.input_size)


def _anchor_detections(route: RouteConfig, decode: AnchorDecode, outputs: ModelOutputs,
                       row: np.ndarray) -> list[detect.Detection]:
    """Raw SSD heads (output.decode: anchors): MediaPipe's decode and NMS, then the route's own
    min_score and max_results, as every detector's."""
    boxes, scores = _anchor_heads(decode, outputs.shapes)
    found = anchors.detections(outputs.part(row, boxes), outputs.part(row, scores), anchors.ssd_anchors(decode.anchors),
                               decode)
    return [d for d in found if d.score >= route.min_score][: route.max_results]


@lru_cache(maxsize=ANCHOR_ROUTES_CACHED)
def _anchor_heads(decode: AnchorDecode, shapes: tuple) -> tuple[int, int]:
    """Which outputs hold the boxes and the scores: found once per route and model, not per reply
    (checked at check-config: it cannot fail here)."""
    return find_outputs(decode, shapes)
