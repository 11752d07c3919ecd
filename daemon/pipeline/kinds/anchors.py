"""Raw SSD heads -> detections, as MediaPipe decodes them (`output.decode: anchors`).

A detector without TFLite_Detection_PostProcess (MediaPipe's BlazeFace: regressors [1, 896, 16],
classificators [1, 896, 1]) predicts, for each of a fixed set of anchors, a box (and keypoints)
as offsets from the anchor, and raw class scores. Three steps, each MediaPipe's calculator:

- `ssd_anchors`: the anchors, SsdAnchorsCalculator (ssd_anchors_calculator.cc), once per
  set of options;
- `decode`: offsets -> boxes and keypoints, scores -> each box's best class,
  TensorsToDetectionsCalculator (tensors_to_detections_calculator.cc, its CPU path);
- `daemon.pipeline.kinds.nms.suppress`: NonMaxSuppressionCalculator, weighted or hard.

`detections` runs the last two into `Detection`s. The arithmetic is float32 where the C++'s is
(proto floats, float locals), step for step, so the anchors and boxes are MediaPipe's, not a
float64 approximation of them. Boxes are normalized to the model input, x right, y down;
`detect.to_reply` maps them to the sent image.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from daemon.config.anchors import (BOX_COORDS, REDUCED_LOWEST_RATIOS, REDUCED_LOWEST_SCALE, AnchorDecode,
                                   AnchorOptions, grid_size, stride_groups)
from daemon.pipeline.kinds.detect import Box, Detection
from daemon.pipeline.kinds.nms import suppress

F32 = np.float32
ANCHOR_COLUMNS = 4
"""An anchor's x_center, y_center, w, h, normalized to the input."""
LAST_NEXT_SCALE = 1.0
"""The 'next layer's scale' of the last layer, for its interpolated anchor (as MediaPipe)."""
ANCHOR_SETS_CACHED = 16
"""Distinct anchor options kept computed: one per route is plenty; a reload's new ones push out old."""
_HALF = F32(0.5)
_ONE = F32(1.0)
_NO_CLASS = -1
# MediaPipe starts each box's best score at -FLT_MAX and takes a class only on a strictly greater
# score: a box with no allowed class, or only NaN or -inf scores, has none.
_FLOOR = F32(-np.finfo(np.float32).max)


@lru_cache(maxsize=ANCHOR_SETS_CACHED)
def ssd_anchors(options: AnchorOptions) -> np.ndarray:
    """The anchors, [N, 4] float32 rows of (x_center, y_center, w, h), in MediaPipe's order: by
    grid (consecutive layers of one stride share one), row by row, cell by cell, then the cell's
    anchors, layer by layer. Read-only: it is shared by every caller with these options."""
    parts = [_grid_anchors(options, first, end) for first, end in stride_groups(options.strides)]
    anchors = np.concatenate(parts) if parts else np.empty((0, ANCHOR_COLUMNS), dtype=F32)
    anchors.setflags(write=False)
    return anchors


def _grid_anchors(options: AnchorOptions, first: int, end: int) -> np.ndarray:
    """The anchors of layers first..end-1, which share a stride and so a grid."""
    height, width = grid_size(options, options.strides[first])
    shapes = [shape for layer in range(first, end) for shape in _layer_shapes(options, layer)]
    if options.fixed_anchor_size:
        sizes = np.ones((len(shapes), 2), dtype=F32)
    else:
        scales, ratios = (np.array(column, dtype=F32).reshape(-1) for column in zip(*shapes))
        root = np.sqrt(ratios)
        sizes = np.stack([scales * root, scales / root], axis=1)  # w = s * sqrt(r), h = s / sqrt(r)
    # (x + offset) / cells, in float32 like the C++ (an int plus a float is a float there).
    xs = (np.arange(width, dtype=F32) + F32(options.anchor_offset_x)) / F32(width)
    ys = (np.arange(height, dtype=F32) + F32(options.anchor_offset_y)) / F32(height)
    cy, cx = np.meshgrid(ys, xs, indexing="ij")  # y outer, x inner: MediaPipe's loop order
    centres = np.stack([cx.reshape(-1), cy.reshape(-1)], axis=1)
    cells, per_cell = len(centres), len(sizes)
    return np.concatenate([np.repeat(centres, per_cell, axis=0), np.tile(sizes, (cells, 1))], axis=1)


def _layer_shapes(options: AnchorOptions, layer: int) -> list[tuple[np.float32, np.float32]]:
    """(scale, aspect ratio) of each anchor one layer puts in a cell."""
    layers = len(options.strides)
    scale = _scale(options, layer, layers)
    if layer == 0 and options.reduce_boxes_in_lowest_layer:
        scales = (F32(REDUCED_LOWEST_SCALE), scale, scale)
        return [(s, F32(r)) for s, r in zip(scales, REDUCED_LOWEST_RATIOS)]
    shapes = [(scale, F32(r)) for r in options.aspect_ratios]
    if options.interpolated_scale_aspect_ratio > 0:
        following = F32(LAST_NEXT_SCALE) if layer == layers - 1 else _scale(options, layer + 1, layers)
        shapes.append((np.sqrt(scale * following), F32(options.interpolated_scale_aspect_ratio)))
    return shapes


def _scale(options: AnchorOptions, layer: int, layers: int) -> np.float32:
    """MediaPipe's CalculateScale: linear from min_scale to max_scale over the layers (their mean
    for one layer). The C++ takes max - min in float, the rest in double (its `* 1.0`), and
    returns a float."""
    low, high = F32(options.min_scale), F32(options.max_scale)
    if layers == 1:
        return (low + high) * _HALF
    return F32(float(low) + float(high - low) * layer / (layers - 1.0))


def decode(raw_boxes: np.ndarray, raw_scores: np.ndarray, anchors: np.ndarray,
           options: AnchorDecode) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(boxes [K, 4] as x_min, y_min, x_max, y_max; keypoints [K, num_keypoints, 2] as x, y;
    scores [K]; classes [K]), normalized to the model input, for the K anchors whose best allowed
    class scores at least `min_score_thresh` and whose box is not inverted or NaN; anchor order.
    `raw_boxes` holds num_boxes x num_coords values, `raw_scores` num_boxes x num_classes."""
    rows = _rows(raw_boxes, options.num_boxes, options.num_coords, "box")
    if anchors.shape != (options.num_boxes, ANCHOR_COLUMNS):
        raise ValueError(f"{options.num_boxes} boxes need as many anchors, got {anchors.shape[0]}")
    boxes = _boxes(rows, anchors, options)
    keypoints = _keypoints(rows, anchors, options)
    scores, classes = _best_classes(_rows(raw_scores, options.num_boxes, options.num_classes, "score"), options)
    keep = classes != _NO_CLASS
    if options.min_score_thresh is not None:
        keep &= scores >= F32(options.min_score_thresh)
    # MediaPipe drops boxes of negative or NaN width or height (a model's odd prediction).
    keep &= (boxes[:, 2] - boxes[:, 0] >= 0) & (boxes[:, 3] - boxes[:, 1] >= 0)
    return boxes[keep], keypoints[keep], scores[keep], classes[keep]


def _rows(values: np.ndarray, rows: int, columns: int, what: str) -> np.ndarray:
    values = np.asarray(values, dtype=F32)
    if values.size != rows * columns:
        raise ValueError(f"the {what} output holds {values.size} values, not {rows} x {columns}")
    return values.reshape(rows, columns)


def _boxes(rows: np.ndarray, anchors: np.ndarray, options: AnchorDecode) -> np.ndarray:
    """Each anchor's box offsets -> (x_min, y_min, x_max, y_max), MediaPipe's DecodeBoxes."""
    first, second, third, fourth = rows[:, options.box_coord_offset:options.box_coord_offset + BOX_COORDS].T
    if options.reverse_output_order:
        x, y, w, h = first, second, third, fourth
    else:
        y, x, h, w = first, second, third, fourth
    anchor_x, anchor_y, anchor_w, anchor_h = anchors.T
    x_center = x / F32(options.x_scale) * anchor_w + anchor_x
    y_center = y / F32(options.y_scale) * anchor_h + anchor_y
    if options.apply_exponential_on_box_size:
        with np.errstate(over="ignore"):  # an absurd size is inf, as in the C++, not a warning
            w = np.exp(w / F32(options.w_scale)) * anchor_w
            h = np.exp(h / F32(options.h_scale)) * anchor_h
    else:
        w = w / F32(options.w_scale) * anchor_w
        h = h / F32(options.h_scale) * anchor_h
    half_w, half_h = w / F32(2), h / F32(2)
    return np.stack([x_center - half_w, y_center - half_h, x_center + half_w, y_center + half_h], axis=1)


def _keypoints(rows: np.ndarray, anchors: np.ndarray, options: AnchorDecode) -> np.ndarray:
    """[N, num_keypoints, 2] (x, y): each offset from the anchor's centre, scaled by its size."""
    starts = options.keypoint_coord_offset + np.arange(options.num_keypoints) * options.num_values_per_keypoint
    first, second = rows[:, starts], rows[:, starts + 1]
    x, y = (first, second) if options.reverse_output_order else (second, first)
    anchor_x, anchor_y, anchor_w, anchor_h = (column[:, None] for column in anchors.T)
    return np.stack([x / F32(options.x_scale) * anchor_w + anchor_x,
                     y / F32(options.y_scale) * anchor_h + anchor_y], axis=2)


def _best_classes(raw: np.ndarray, options: AnchorDecode) -> tuple[np.ndarray, np.ndarray]:
    """Each box's best allowed class and its score (clipped, then the sigmoid, if asked);
    class -1 where none qualifies. Ties go to the lower class id, as MediaPipe's strict `<`."""
    scores = raw
    if options.sigmoid_score:
        if options.score_clipping_thresh is not None:
            limit = F32(options.score_clipping_thresh)
            scores = np.clip(scores, -limit, limit)
        with np.errstate(over="ignore"):  # exp(-x) of a large negative logit is inf: the score is 0
            scores = _ONE / (_ONE + np.exp(-scores))
    ranked = np.where(np.isnan(scores), -np.inf, scores)
    ranked[:, list(options.ignore_classes)] = -np.inf
    classes = np.argmax(ranked, axis=1)
    best = ranked[np.arange(len(ranked)), classes].astype(F32)
    return best, np.where(best > _FLOOR, classes, _NO_CLASS)


def detections(raw_boxes: np.ndarray, raw_scores: np.ndarray, anchors: np.ndarray,
               options: AnchorDecode) -> list[Detection]:
    """The detections, best first after `options.nms`: boxes clamped to the input, keypoints as
    decoded (the reply clamps them to the image)."""
    boxes, keypoints, scores, classes = decode(raw_boxes, raw_scores, anchors, options)
    boxes, keypoints, scores, classes = suppress(boxes, keypoints, scores, classes, options.nms)
    corners = np.clip(boxes, 0.0, 1.0)
    return [Detection(int(c), float(s), Box(*(float(v) for v in corner)),
                      tuple((float(x), float(y)) for x, y in points))
            for corner, points, s, c in zip(corners, keypoints, scores, classes)]
