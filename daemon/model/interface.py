"""What a model takes and gives: its tensors, its ops, and whether the daemon can serve it.

Read from a loaded interpreter, without running it. `runtime.Model` refuses a model for
the first of `problems()`; `edge-inferd inspect` prints them all beside the tensors and a
guess of the model's kind, so a user with a file and no idea what it wants learns both.

Served: one input tensor, int8 or uint8 (quantized: the daemon quantizes real values with
the tensor's scale and zero point) or float32 (an INT8 model with a float interface, whose
graph quantizes itself, or a float model); any number of outputs, integer ones dequantized.
A float model (no quantized tensor: float32 weights, or float16 ones that DEQUANTIZE to float32,
as MediaPipe ships them) is served as it is, and said so once (`float_note`): INT8 is the fast
path, and `validate --float-model` compares an INT8 build with it. Refused:
- several inputs (one request is one tensor);
- stateful streaming models (variable ops, e.g. microWakeWord): each output depends on the
  requests before it, which caching, batching and a worker shared by devices all break.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

# Ops that keep state between invokes (resource variables).
STATEFUL_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})
# The node a delegate (XNNPACK) adds in place of the ops it takes over; those ops stay listed
# beside it, and no converter writes it into a file, so the file's ops are the others.
DELEGATE_OP = "DELEGATE"
INTEGER_INPUTS = (np.dtype(np.int8), np.dtype(np.uint8))
FLOAT_INPUT = np.dtype(np.float32)
_QUANTIZED_KINDS = "iu"


DYNAMIC = -1  # a dimension the converter left open, in a shape signature


def dynamic_dims(signature: Sequence[int]) -> list[int]:
    """The dimensions past the batch (index 0) that a shape signature leaves dynamic (dynamic.py)."""
    return [k for k, v in enumerate(signature) if k > 0 and v == DYNAMIC]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor: shape (batch first), dtype and quantization."""

    index: int
    name: str
    shape: tuple[int, ...]
    signature: tuple[int, ...]
    dtype: np.dtype
    scale: float
    zero_point: int

    @classmethod
    def from_details(cls, d: dict) -> "TensorSpec":
        scale, zero_point = d.get("quantization", (0.0, 0))
        shape = tuple(int(v) for v in d["shape"])
        signature = tuple(int(v) for v in d.get("shape_signature", shape))
        return cls(int(d["index"]), str(d["name"]), shape, signature, np.dtype(d["dtype"]),
                   float(scale), int(zero_point))

    @property
    def quantized(self) -> bool:
        return self.scale != 0.0 and self.dtype.kind in _QUANTIZED_KINDS

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def sample_size(self) -> int:
        return math.prod(self.sample_shape)

    def real_range(self) -> Optional[tuple[float, float]]:
        """The real values the integers stand for, (lowest, highest); None for a float tensor."""
        if not self.quantized:
            return None
        info = np.iinfo(self.dtype)
        return (info.min - self.zero_point) * self.scale, (info.max - self.zero_point) * self.scale

    def describe(self) -> str:
        quant = f"scale {self.scale:.6g}, zero point {self.zero_point}" if self.quantized else "not quantized"
        span = self.real_range()
        real = f"; real values {span[0]:.4g} .. {span[1]:.4g}" if span else ""
        batch = "dynamic batch" if self.signature and self.signature[0] == -1 else f"batch {self.shape[0]}"
        dims = dynamic_dims(self.signature)
        if dims:  # sized for this reading only: a route's input.shape sizes it (dynamic.py)
            batch += f"; dynamic dimension(s) {dims}, signature {list(self.signature)}, sized here to try it"
        return f"{self.name}: {self.dtype} {list(self.shape)} ({batch}; {quant}{real})"


@dataclass(frozen=True)
class Interface:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ops: tuple[str, ...]
    """The file's op names, main subgraph, in order (empty when the backend cannot list them):
    what the model is, not what a delegate made of it."""
    quantized_tensors: int
    """How many tensors of the whole graph are quantized integers."""
    resource_tensors: int = 0
    """Tensors of resource (variable) type: a stateful graph."""

    @property
    def stateful_ops(self) -> list[str]:
        return sorted(STATEFUL_OPS.intersection(self.ops))

    @property
    def stateful(self) -> bool:
        return bool(self.stateful_ops) or self.resource_tensors > 0

    @property
    def batchable(self) -> bool:
        """The input's batch dimension is dynamic, so one invoke can run N samples."""
        signature = self.inputs[0].signature if self.inputs else ()
        return bool(signature) and signature[0] == -1

    @property
    def computes_in_float(self) -> bool:
        """No quantized tensor in the graph: the model computes in float (float32 or float16 weights)."""
        return self.quantized_tensors == 0

    def float_note(self, name: str) -> Optional[str]:
        """What a float model's user should know, once (check-config and the start-up log), or None."""
        if not self.computes_in_float:
            return None
        return (f"model {name!r} computes in float (no quantized tensor in the graph): it is served as it is; "
                "an INT8 build of it is the fast path, and `edge-inferd validate --float-model` compares "
                "one with it on your data")

    def problems(self) -> list[str]:
        """Why the daemon cannot serve this model (empty when it can)."""
        found = []
        if len(self.inputs) != 1:
            names = ", ".join(spec.name for spec in self.inputs) or "none"
            found.append(f"takes {len(self.inputs)} inputs ({names}); edge-inferd feeds one tensor per request")
        if self.stateful:
            what = ", ".join(self.stateful_ops) or f"{self.resource_tensors} resource tensors"
            found.append(f"is a stateful streaming model ({what}): each output depends on the requests before it, "
                         "which breaks the cache, batching and a worker shared by many devices")
        if len(self.inputs) == 1:
            spec = self.inputs[0]
            if spec.dtype not in (*INTEGER_INPUTS, FLOAT_INPUT) or (spec.dtype in INTEGER_INPUTS and not spec.quantized):
                found.append(f"its input {spec.name} is {spec.dtype}{'' if spec.quantized else ' unquantized'}; "
                             "edge-inferd feeds int8 or uint8 (quantized) or float32")
        bad_out = [spec.name for spec in self.outputs if spec.dtype.kind not in "fiub"]
        if bad_out:
            found.append(f"output(s) {', '.join(bad_out)} are not numeric")
        return found


def read_interface(interp: Any) -> Interface:
    """The interface of an allocated interpreter (ai-edge-litert or tflite-runtime)."""
    inputs = tuple(TensorSpec.from_details(d) for d in interp.get_input_details())
    outputs = tuple(TensorSpec.from_details(d) for d in interp.get_output_details())
    try:
        ops = tuple(name for name in (str(op.get("op_name", "")) for op in interp._get_ops_details())
                    if name != DELEGATE_OP)
    except (AttributeError, RuntimeError, ValueError):  # a private API: not every build has it
        ops = ()
    quantized = resource = 0
    for detail in _tensor_details(interp):
        dtype = np.dtype(detail["dtype"])
        scale = detail.get("quantization", (0.0, 0))[0]
        quantized += dtype.kind in _QUANTIZED_KINDS and scale != 0.0
        resource += dtype == np.dtype(object)
    return Interface(inputs, outputs, ops, quantized, resource)


def _tensor_details(interp: Any) -> list[dict]:
    """Every tensor of the graph; only the inputs and outputs where the interpreter cannot list them."""
    try:
        return list(interp.get_tensor_details())
    except (AttributeError, RuntimeError, ValueError):
        return [*interp.get_input_details(), *interp.get_output_details()]


# --- The kind of model, read from its outputs: what `check-config` and `inspect` go by ---

SSD, YOLO = "ssd", "yolo"
_BOX_COORDS = 4  # x/y pairs of a box, in every detector layout
_YOLO_MIN_ROWS = _BOX_COORDS + 1  # four box values and at least one class score


@dataclass(frozen=True)
class SsdOutputs:
    """Which output is which in a TFLite_Detection_PostProcess model (its order varies by converter)."""

    boxes: int
    classes: int
    scores: int
    count: int


def ssd_outputs(outputs: tuple[TensorSpec, ...]) -> Optional[SsdOutputs]:
    """The four outputs of an SSD detector (boxes [1, N, 4], classes and scores [1, N], count [1]),
    or None. Classes and scores share a shape: their names decide when they say, else the
    post-process op's own order (boxes, classes, scores, count)."""
    if len(outputs) != 4:
        return None
    boxes = [i for i, o in enumerate(outputs) if len(o.shape) == 3 and o.shape[2] == _BOX_COORDS]
    count = [i for i, o in enumerate(outputs) if o.sample_size == 1]
    rows = [i for i, o in enumerate(outputs) if len(o.shape) == 2 and o.sample_size > 1]
    if len(boxes) != 1 or len(count) != 1 or len(rows) != 2:
        return None
    n = outputs[boxes[0]].shape[1]
    if any(outputs[i].shape[1] != n for i in rows):
        return None
    named = [i for i in rows if "class" in outputs[i].name.lower()]
    classes = named[0] if len(named) == 1 else rows[0]
    scores = rows[1] if classes == rows[0] else rows[0]
    return SsdOutputs(boxes[0], classes, scores, count[0])


def yolo_output(outputs: tuple[TensorSpec, ...]) -> bool:
    """One output [1, 4 + C, N] or [1, N, 4 + C]: box centre and size, then C class scores."""
    if len(outputs) != 1 or len(outputs[0].shape) != 3 or outputs[0].shape[0] != 1:
        return False
    small, large = sorted(outputs[0].shape[1:])
    return small >= _YOLO_MIN_ROWS and large > small


def raw_anchor_heads(outputs: tuple[TensorSpec, ...]) -> Optional[tuple[int, int]]:
    """(boxes output, scores output) of an SSD without TFLite_Detection_PostProcess: boxes
    [1, N, K] with K >= 4 (a box, then keypoints) beside scores [1, N, C], one row per anchor
    (MediaPipe's BlazeFace: [1, 896, 16] and [1, 896, 1]); None otherwise. Which is which: the
    wider one holds the boxes; with equal widths, the one named like boxes or regressors."""
    if len(outputs) != 2 or any(len(o.shape) != 3 or o.shape[0] != 1 for o in outputs):
        return None
    a, b = outputs
    if a.shape[1] != b.shape[1] or a.shape[1] < 2:
        return None
    widths = (a.shape[2], b.shape[2])
    if widths[0] != widths[1]:
        boxes = 0 if widths[0] > widths[1] else 1
    else:
        named = [i for i, o in enumerate(outputs) if any(w in o.name.lower() for w in ("box", "regress", "loc"))]
        boxes = named[0] if len(named) == 1 else 0
    return (boxes, 1 - boxes) if outputs[boxes].shape[2] >= _BOX_COORDS else None


def detector_layout(outputs: tuple[TensorSpec, ...]) -> Optional[str]:
    if ssd_outputs(outputs) is not None:
        return SSD
    return YOLO if yolo_output(outputs) else None


def guess_kind(interface: Interface) -> tuple[str, str]:
    """(output kind to serve it with, what it looks like), from its tensors alone."""
    if interface.stateful:
        return "", "a stateful streaming model: not supported"
    if len(interface.outputs) == 1 and interface.inputs:
        out, inp = interface.outputs[0], interface.inputs[0]
        if out.sample_shape == inp.sample_shape and out.sample_size > 1:  # before YOLO: [1, 50, 6] is both
            return "anomaly", "an autoencoder (its output reconstructs its input)"
    layout = detector_layout(interface.outputs)
    if layout == SSD:
        return "detect", "an SSD object detector (TFLite_Detection_PostProcess: boxes, classes, scores, count)"
    if layout == YOLO:
        return "detect", "a YOLO-style object detector (one [1, 4+C, N] tensor, decoded with per-class NMS)"
    heads = raw_anchor_heads(interface.outputs)
    if heads is not None:
        boxes, scores = (interface.outputs[i].shape for i in heads)
        return "values", (f"an SSD detector with raw anchor heads (boxes {list(boxes)}, scores {list(scores)}, one row "
                          "per anchor): serve it with output {kind: detect, decode: anchors, ...}, its anchors "
                          "taken from the model's own documentation (the snippet lists the keys)")
    if len(interface.outputs) == 1 and interface.inputs:
        out, inp = interface.outputs[0], interface.inputs[0]
        if out.sample_size == inp.sample_size and out.sample_size > 1:
            return "anomaly", "an autoencoder (its output reconstructs its input, flattened)"
        if len(out.sample_shape) == 1 and out.sample_size > 1:
            return "classify", f"a classifier over {out.sample_size} classes"
    return "values", "a regressor or other model: its outputs are served as values"
