"""`output.decode: anchors`: a detector's raw SSD heads, decoded as MediaPipe does.

Many downloaded detectors (MediaPipe's BlazeFace, palm and pose detectors) end at their raw
heads, without TFLite_Detection_PostProcess: one tensor of box (and keypoint) offsets per
anchor, one of class scores per anchor. The route then says how the anchors were laid out and
how the offsets are read, in the words of MediaPipe's own options, so a graph's `.pbtxt` can be
copied over key by key:

- `anchors`: SsdAnchorsCalculatorOptions (mediapipe/calculators/tflite/ssd_anchors_calculator.proto);
- the decode keys: TensorsToDetectionsCalculatorOptions
  (mediapipe/calculators/tensor/tensors_to_detections_calculator.proto);
- `nms`: NonMaxSuppressionCalculatorOptions, cut down to IoU overlap.

Defaults are the protos' where those make sense; a key whose proto default cannot work (a
scale of 0 divides by zero) is required instead. The frozen sections, their reader, and the
two checks check-config needs (the anchor count, the model's outputs) live here, in the config
wing; the decoding itself is daemon/pipeline/kinds/anchors.py.

Wiring, in loader.py `_read_output`: add `*ANCHOR_DECODE_KEYS` to the section's known keys
(each may also go in `_KIND_KEYS` as belonging to `detect`), then
`anchor_decode = read_anchor_decode(r, o, p)`: None when the route has no `decode` key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from math import prod
from typing import Mapping, Optional, Sequence

from daemon.config.reader import Reader, optional_float

DECODE_ANCHORS = "anchors"
DECODE_CHOICES = (DECODE_ANCHORS,)
WEIGHTED, HARD = "weighted", "hard"
NMS_MODES = (WEIGHTED, HARD)
BOX_COORDS = 4  # the box's four values (centre and size) ahead of any keypoints
KEYPOINT_XY = 2  # the keypoint values read: x and y (MediaPipe decodes 2-D keypoints only)
# MediaPipe's face, palm and pose detection graphs all suppress with weighted NMS at IoU 0.3;
# the proto's own defaults (hard NMS at 1.0) suppress nothing, so this path's defaults are theirs.
DEFAULT_NMS_IOU = 0.3
DEFAULT_NMS_MODE = WEIGHTED
DEFAULT_ANCHOR_OFFSET = 0.5
DEFAULT_INTERPOLATED_RATIO = 1.0
DEFAULT_ASPECT_RATIOS = (1.0,)
# The lowest layer's fixed boxes under reduce_boxes_in_lowest_layer (ssd_anchors_calculator.cc):
# aspect ratios 1, 2 and 1/2, the first at scale 0.1, the others at the layer's own scale.
REDUCED_LOWEST_RATIOS = (1.0, 2.0, 0.5)
REDUCED_LOWEST_SCALE = 0.1

_REQUIRED = {"doc_default": "required"}


@dataclass(frozen=True)
class AnchorOptions:
    """`output.anchors`: where the model's anchors sit, as MediaPipe's SsdAnchorsCalculator lays them out."""

    num_layers: int = field(default=1, metadata=_REQUIRED)
    """Feature maps (output layers) the anchors are laid on; one stride each."""
    min_scale: float = field(default=0.0, metadata=_REQUIRED)
    """Anchor scale of the first layer, a fraction of the input; later layers interpolate
    linearly up to `max_scale` (one layer alone takes their mean)."""
    max_scale: float = field(default=0.0, metadata=_REQUIRED)
    """Anchor scale of the last layer, a fraction of the input."""
    input_size_height: int = field(default=1, metadata=_REQUIRED)
    """The model input's height in pixels, as the anchors were computed for."""
    input_size_width: int = field(default=1, metadata=_REQUIRED)
    """The model input's width in pixels."""
    anchor_offset_x: float = DEFAULT_ANCHOR_OFFSET
    """An anchor's centre within its feature-map cell, in cells (0.5: the cell's middle)."""
    anchor_offset_y: float = DEFAULT_ANCHOR_OFFSET
    """As `anchor_offset_x`, down."""
    strides: tuple[int, ...] = field(default=(), metadata=_REQUIRED)
    """Each layer's stride in input pixels: its grid is ceil(input / stride) cells a side.
    Consecutive layers of one stride share a grid, their anchors interleaved cell by cell."""
    aspect_ratios: tuple[float, ...] = DEFAULT_ASPECT_RATIOS
    """Width / height of each anchor in a cell, one anchor per ratio and layer."""
    reduce_boxes_in_lowest_layer: bool = False
    """The first layer takes three fixed anchors per cell instead (ratios 1, 2, 0.5; the first at
    scale 0.1), as the TensorFlow Object Detection API's SSD MobileNets do."""
    interpolated_scale_aspect_ratio: float = DEFAULT_INTERPOLATED_RATIO
    """One more anchor per cell and layer with this ratio, at the geometric mean of the layer's
    scale and the next one's (1.0 past the last layer); 0 adds none."""
    fixed_anchor_size: bool = False
    """Every anchor is 1 x 1 (BlazeFace and friends, whose box sizes are in input pixels,
    divided by the scales below), not the scale and ratio's size."""


@dataclass(frozen=True)
class NmsOptions:
    """`output.nms`: how overlapping boxes are merged (MediaPipe's NonMaxSuppressionCalculator, IoU overlap)."""

    iou: float = DEFAULT_NMS_IOU
    """A box overlapping a better one by more than this IoU joins it (weighted) or is dropped (hard)."""
    max_detections: Optional[int] = None
    """Detections kept at most, best first; null keeps them all."""
    mode: str = DEFAULT_NMS_MODE
    """`weighted` (MediaPipe's face, palm and pose detectors): each kept box is the score-weighted
    mean of the boxes overlapping the best one, keypoints too, with the best one's score;
    `hard`: the best box is kept as it is and the ones overlapping it dropped."""


@dataclass(frozen=True)
class AnchorDecode:
    """`output` of a `detect` route with `decode: anchors`: how raw box and score tensors are read."""

    anchors: AnchorOptions = field(default_factory=AnchorOptions, metadata=_REQUIRED)
    """The anchor layout (above)."""
    num_classes: int = field(default=1, metadata=_REQUIRED)
    """Scores per anchor in the score tensor."""
    num_boxes: int = field(default=0, metadata={"doc_default": "the anchor count"})
    """Anchors (rows) in each tensor; it must equal the count the `anchors` options give."""
    num_coords: int = field(default=BOX_COORDS, metadata=_REQUIRED)
    """Values per anchor in the box tensor: the box's 4, then keypoints (BlazeFace: 4 + 6 x 2 = 16)."""
    box_coord_offset: int = 0
    """Where an anchor's 4 box values start in its row."""
    keypoint_coord_offset: int = field(default=0, metadata={"doc_default": "required with keypoints"})
    """Where its first keypoint starts in its row."""
    num_keypoints: int = 0
    """Keypoints per box (BlazeFace: 6, eyes, nose tip, mouth, ear tragions)."""
    num_values_per_keypoint: int = KEYPOINT_XY
    """Values per keypoint in the row; the first two are its x and y (or y and x, as the box)."""
    x_scale: float = field(default=1.0, metadata=_REQUIRED)
    """A centre or keypoint x offset is divided by this, then scaled by the anchor's width (BlazeFace:
    the input width; SSD MobileNet: 10)."""
    y_scale: float = field(default=1.0, metadata=_REQUIRED)
    """As `x_scale`, for y and the anchor's height."""
    w_scale: float = field(default=1.0, metadata=_REQUIRED)
    """A box width is divided by this (before the exponential), then scaled by the anchor's width."""
    h_scale: float = field(default=1.0, metadata=_REQUIRED)
    """As `w_scale`, for the height."""
    apply_exponential_on_box_size: bool = False
    """Width and height are exp(value / scale) x the anchor's (SSD MobileNet), not linear (BlazeFace)."""
    reverse_output_order: bool = False
    """Boxes are x_center, y_center, w, h and keypoints x, y; left false: y_center, x_center, h, w and y, x."""
    sigmoid_score: bool = False
    """Scores are logits: each goes through a sigmoid (after `score_clipping_thresh`)."""
    score_clipping_thresh: Optional[float] = None
    """Logits are clipped to +- this before the sigmoid (with `sigmoid_score` only); null: not clipped."""
    min_score_thresh: Optional[float] = None
    """Boxes whose best score is below this are dropped before NMS; null keeps every box."""
    ignore_classes: tuple[int, ...] = ()
    """Class ids never taken as a box's class (a background class, say)."""
    nms: NmsOptions = field(default_factory=NmsOptions)
    """Non-maximum suppression (above)."""


ANCHOR_DECODE_KEYS = ("decode", *(f.name for f in fields(AnchorDecode)))
"""The keys of `routes[i].output` this module reads: the caller's section lists them as known."""


def read_anchor_decode(r: Reader, o: Mapping, p: str) -> Optional[AnchorDecode]:
    """`p` (a route's `output` path, `routes[i].output`) from its mapping `o`: None without a
    `decode` key; every problem recorded on `r` with its key path."""
    decode = r.get(o, "decode", p, str, None, choices=DECODE_CHOICES)
    if decode is None:
        for key in ANCHOR_DECODE_KEYS[1:]:
            if key in o and r.ok(f"{p}.decode"):
                r.error(o, key, p, f"applies to decode: {DECODE_ANCHORS} only")
        return None
    anchors = _read_anchors(r, r.section(o, "anchors", AnchorOptions, path=f"{p}.anchors", required=True),
                            f"{p}.anchors")
    num_classes = r.get(o, "num_classes", p, int, 1, minimum=1, required=True)
    layout = _read_layout(r, o, p)
    return AnchorDecode(
        anchors=anchors,
        num_classes=num_classes,
        num_boxes=_read_num_boxes(r, o, p, anchors),
        **layout,
        x_scale=_scale(r, o, p, "x_scale"),
        y_scale=_scale(r, o, p, "y_scale"),
        w_scale=_scale(r, o, p, "w_scale"),
        h_scale=_scale(r, o, p, "h_scale"),
        apply_exponential_on_box_size=r.get(o, "apply_exponential_on_box_size", p, bool, False),
        reverse_output_order=r.get(o, "reverse_output_order", p, bool, False),
        sigmoid_score=r.get(o, "sigmoid_score", p, bool, False),
        score_clipping_thresh=optional_float(r.get(o, "score_clipping_thresh", p, (int, float, type(None)),
                                                   None, check=_positive_or_null)),
        min_score_thresh=optional_float(r.get(o, "min_score_thresh", p, (int, float, type(None)), None)),
        ignore_classes=_read_ignore_classes(r, o, p, num_classes),
        nms=_read_nms(r, r.section(o, "nms", NmsOptions, path=f"{p}.nms"), f"{p}.nms"),
    )


def _read_anchors(r: Reader, m: Mapping, p: str) -> AnchorOptions:
    layers = r.get(m, "num_layers", p, int, 1, minimum=1, required=True)
    strides = tuple(_positive_list(r, m, p, "strides", (), integers=True, required=True))
    if strides and len(strides) != layers and r.ok(f"{p}.num_layers"):
        r.error(m, "strides", p, f"must give one stride per layer: num_layers is {layers}, got {len(strides)} "
                "strides")
        strides = ()
    ratios = tuple(float(v) for v in _positive_list(r, m, p, "aspect_ratios", DEFAULT_ASPECT_RATIOS))
    if not ratios and "aspect_ratios" in m:
        r.error(m, "aspect_ratios", p, "must list at least one aspect ratio")
    return AnchorOptions(
        num_layers=layers,
        min_scale=r.get(m, "min_scale", p, float, 0.0, minimum=0, required=True),
        max_scale=r.get(m, "max_scale", p, float, 0.0, minimum=0, required=True),
        input_size_height=r.get(m, "input_size_height", p, int, 1, minimum=1, required=True),
        input_size_width=r.get(m, "input_size_width", p, int, 1, minimum=1, required=True),
        anchor_offset_x=r.get(m, "anchor_offset_x", p, float, DEFAULT_ANCHOR_OFFSET),
        anchor_offset_y=r.get(m, "anchor_offset_y", p, float, DEFAULT_ANCHOR_OFFSET),
        strides=strides,
        aspect_ratios=ratios or DEFAULT_ASPECT_RATIOS,
        reduce_boxes_in_lowest_layer=r.get(m, "reduce_boxes_in_lowest_layer", p, bool, False),
        interpolated_scale_aspect_ratio=r.get(m, "interpolated_scale_aspect_ratio", p, float,
                                              DEFAULT_INTERPOLATED_RATIO, minimum=0),
        fixed_anchor_size=r.get(m, "fixed_anchor_size", p, bool, False),
    )


def _positive_list(r: Reader, m: Mapping, p: str, key: str, default: Sequence, integers: bool = False,
                   required: bool = False) -> Sequence:
    """A list of positive numbers (or `default`, reported, when it is anything else)."""
    values = r.get(m, key, p, list, None, required=required)
    if values is None:
        return default
    number = int if integers else (int, float)
    if not all(isinstance(v, number) and not isinstance(v, bool) and v > 0 for v in values):
        r.error(m, key, p, f"must be a list of positive {'integers' if integers else 'numbers'}, got {values!r}")
        return default
    return values


def _read_num_boxes(r: Reader, o: Mapping, p: str, anchors: AnchorOptions) -> int:
    """num_boxes, which must be the anchor count (left out, it is): the model's rows are the anchors."""
    count = expected_boxes(anchors) if r.ok(f"{p}.anchors") else None
    given = r.get(o, "num_boxes", p, int, None, minimum=1)
    if given is not None and count is not None and given != count:
        r.error(o, "num_boxes", p, f"is {given}, but the anchors options lay out {count} anchors")
    return given if given is not None else count or 0


def _read_layout(r: Reader, o: Mapping, p: str) -> dict:
    """Where the box and keypoints sit in a row of num_coords values, checked against each other."""
    coords = r.get(o, "num_coords", p, int, BOX_COORDS, minimum=BOX_COORDS, required=True)
    box_at = r.get(o, "box_coord_offset", p, int, 0, minimum=0)
    keypoints = r.get(o, "num_keypoints", p, int, 0, minimum=0)
    per_keypoint = r.get(o, "num_values_per_keypoint", p, int, KEYPOINT_XY, minimum=KEYPOINT_XY)
    keypoints_at = r.get(o, "keypoint_coord_offset", p, int, 0, minimum=0, required=keypoints > 0)
    if r.ok(f"{p}.num_coords", f"{p}.box_coord_offset") and coords < box_at + BOX_COORDS:
        r.error(o, "num_coords", p, f"must hold the box: at least box_coord_offset + 4 = {box_at + BOX_COORDS}, "
                f"got {coords}")
    end = keypoints_at + keypoints * per_keypoint
    if keypoints and r.ok(f"{p}.num_coords", f"{p}.keypoint_coord_offset") and coords < end:
        r.error(o, "num_coords", p, f"must hold the keypoints: at least keypoint_coord_offset + num_keypoints "
                f"x num_values_per_keypoint = {keypoints_at} + {keypoints} x {per_keypoint} = {end}, got {coords}")
    return {"num_coords": coords, "box_coord_offset": box_at, "keypoint_coord_offset": keypoints_at,
            "num_keypoints": keypoints, "num_values_per_keypoint": per_keypoint}


def _scale(r: Reader, o: Mapping, p: str, key: str) -> float:
    # Required: the proto's default of 0 would divide every offset by zero.
    return float(r.get(o, key, p, (int, float), 1.0, required=True, check=_positive))


def _read_ignore_classes(r: Reader, o: Mapping, p: str, num_classes: int) -> tuple[int, ...]:
    ids = r.get(o, "ignore_classes", p, list, [])
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_classes for i in ids):
        r.error(o, "ignore_classes", p, f"must list class ids in 0..{num_classes - 1} (num_classes is "
                f"{num_classes}), got {ids!r}")
        return ()
    if set(range(num_classes)) <= set(ids):
        r.error(o, "ignore_classes", p, f"ignores every one of the {num_classes} classes: nothing could be found")
        return ()
    return tuple(ids)


def _read_nms(r: Reader, m: Mapping, p: str) -> NmsOptions:
    return NmsOptions(
        iou=r.get(m, "iou", p, float, DEFAULT_NMS_IOU, minimum=0),
        max_detections=r.get(m, "max_detections", p, (int, type(None)), None, minimum=1),
        mode=r.get(m, "mode", p, str, DEFAULT_NMS_MODE, choices=NMS_MODES),
    )


def _positive(value: float) -> Optional[str]:
    return None if value > 0 else f"must be > 0, got {value!r}"


def _positive_or_null(value: Optional[float]) -> Optional[str]:
    return None if value is None else _positive(value)


def stride_groups(strides: Sequence[int]) -> list[tuple[int, int]]:
    """(first, end) layer ranges of consecutive equal strides: MediaPipe lays such layers on one
    grid, each cell's anchors of all of them together (a stride met again later starts a new grid)."""
    groups, first = [], 0
    for layer in range(1, len(strides) + 1):
        if layer == len(strides) or strides[layer] != strides[first]:
            groups.append((first, layer))
            first = layer
    return groups


def anchors_per_cell(options: AnchorOptions, layer: int) -> int:
    """Anchors one layer puts in each cell of its grid."""
    if layer == 0 and options.reduce_boxes_in_lowest_layer:
        return len(REDUCED_LOWEST_RATIOS)
    return len(options.aspect_ratios) + (options.interpolated_scale_aspect_ratio > 0)


def grid_size(options: AnchorOptions, stride: int) -> tuple[int, int]:
    """(height, width) in cells of a layer of this stride: ceil(input / stride)."""
    return -(-options.input_size_height // stride), -(-options.input_size_width // stride)


def expected_boxes(options: AnchorOptions) -> int:
    """The anchor count the options lay out: the rows a model's box and score outputs must have."""
    total = 0
    for first, end in stride_groups(options.strides):
        height, width = grid_size(options, options.strides[first])
        total += height * width * sum(anchors_per_cell(options, layer) for layer in range(first, end))
    return total


def find_outputs(decode: AnchorDecode, shapes: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(box output, score output): the indices among a model's output `shapes` (with or without
    the batch) of its [num_boxes, num_coords] and [num_boxes, num_classes] heads, the box tensor
    first when both fit either. ValueError naming the numbers when the model has no such pair."""
    boxes = [i for i, s in enumerate(shapes) if _holds(s, decode.num_boxes, decode.num_coords)]
    scores = [i for i, s in enumerate(shapes) if _holds(s, decode.num_boxes, decode.num_classes)]
    for b in boxes:
        for s in scores:
            if s != b:
                return b, s
    found = ", ".join(str(list(s)) for s in shapes) or "no outputs"
    raise ValueError(f"decode: anchors needs a box output [1, {decode.num_boxes}, {decode.num_coords}] "
                     f"(num_boxes x num_coords) and a score output [1, {decode.num_boxes}, {decode.num_classes}] "
                     f"(num_boxes x num_classes); the model has {found}")


def _holds(shape: Sequence[int], rows: int, columns: int) -> bool:
    """A tensor of `rows` x `columns` values, laid out [.., rows, columns] (or flat, for one column)."""
    return prod(shape) == rows * columns and (columns == 1 or bool(shape) and shape[-1] == columns)
