"""Sub-labels (`then:` on a detect route): each chosen box of a batch's replies is cropped from
its sent image and classified by the `then` route's model, all the batch's crops together.

No threads, no MQTT, no clocks of its own, like request_path.py: the caller passes the
classifier (a Runner) and the clock. The crops are cut from the payload decoded again at full
resolution (the detector saw it resized), resized to the classify route's input as that route
resizes a whole picture, preprocessed by its steps, and run in one `infer_quantized` call:
as few invokes as the classifier's batch buckets allow. The maths of which boxes and which
pixels is in crops.py.

The cache (when a detect route uses it) holds the detector's outputs, never a reply: a cached
answer's boxes are classified again here, so no reply goes out without its sub-labels.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from daemon.pipeline import crops, images
from daemon.pipeline.postprocess import VALUE_DECIMALS
from daemon.pipeline.route_pipeline import Clock, Outcome, Request, RoutePipeline, Runner

MS = 1000.0
STAGE = "sub_labels"
"""The stage the crops' time is observed under (decode again, crop, preprocess, infer)."""


def classify_boxes(pipe: RoutePipeline, requests: Sequence[Request], outcome: Outcome, model: Runner,
                   clock: Clock) -> int:
    """Every result of `outcome` (one per request) gets its boxes' `sub_label` and `sub_score`, from
    `pipe.then_to`'s model (`model`); returns how many crops were classified."""
    started = clock()
    then = pipe.route.then
    picked: list[tuple[dict, list[int]]] = []
    answered: list[Request] = []
    pixels: list[np.ndarray] = []
    for request, reply in zip(requests, outcome.replies):
        boxes = reply.get("detections") if reply is not None else None
        if boxes is None:  # an error reply
            continue
        positions = crops.chosen(boxes, then.min_score, then.max_crops)
        picked.append((reply, positions))
        answered.append(request)
        if positions:
            pixels.append(_crops(pipe, request.payload, [boxes[i] for i in positions]))
    labels, scores = _classify(pipe.then_to, pixels, model)
    done, now = 0, clock()
    for (reply, positions), request in zip(picked, answered):
        crops.attach(reply["detections"], positions, labels[done:done + len(positions)],
                     scores[done:done + len(positions)])
        done += len(positions)
        reply["latency_ms"] = round((now - request.received_at) * MS, 3)  # the reply leaves after its crops
    outcome.stages[STAGE] = outcome.stages.get(STAGE, 0.0) + now - started
    return done


def unlabelled(outcome: Outcome) -> None:
    """Every box of the results `sub_label: null` (the sub-model failed: the boxes still go out)."""
    for reply in outcome.replies:
        if reply is not None and "detections" in reply:
            crops.attach(reply["detections"], (), (), ())


def _crops(pipe: RoutePipeline, payload: bytes, boxes: Sequence[dict]) -> np.ndarray:
    """The detections' padded regions of the sent picture, at the classify route's input size."""
    then_input = pipe.then_to.route.input
    height, width = then_input.shape[:2]
    channels = then_input.shape[2] if len(then_input.shape) == 3 else 1
    picture = images.decode_full(payload, channels, pipe.route.input.max_pixels)
    out = np.empty((len(boxes), *then_input.shape), dtype=np.uint8)
    for k, box in enumerate(boxes):
        region = crops.padded_region(box["box"], pipe.route.then.pad, picture.width, picture.height)
        out[k] = images.fit(picture.crop(region), height, width, channels, then_input.resize).reshape(then_input.shape)
    return out


def _classify(then_pipe: RoutePipeline, pixels: list[np.ndarray], model: Runner) -> tuple[list[str], list[float]]:
    """Top-1 label and score of each crop, the classify route's way (its preprocess, its labels)."""
    if not pixels:
        return [], []
    x = then_pipe.preprocess(np.concatenate(pixels))
    scores = model.infer_quantized(model.quantize(x, then_pipe.pixels_as_is))
    best = np.argmax(scores, axis=1)
    return ([then_pipe.label(int(i)) for i in best],
            [round(float(row[i]), VALUE_DECIMALS) for row, i in zip(scores, best)])
