"""Inputs with dynamic dimensions beyond the batch (a shape signature like [1, -1] or [-1, -1]).

A converter leaves a dimension at -1 where the graph takes any size: audio front ends take any
number of samples (openWakeWord's melspectrogram: [1, -1]). Such a tensor allocates as 1 in that
dimension, and the delegate then fails to prepare the graph ("XNNPack delegate failed to
reshape ... failed to prepare"): the runtime's words say nothing of the cause. So the input is
resized before its tensors are allocated, to the route's shape (what `routes[].input.shape`
becomes after its preprocessing), and a model with a dynamic dimension and no route to size it
is refused, naming the dimension and the key. `edge-inferd inspect` has no route: it sizes each
dynamic dimension with the first of INSPECT_SIZES the graph prepares with, and says so.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from daemon.errors import ModelError
from daemon.model.interface import DYNAMIC, dynamic_dims

# What `inspect` tries for a dynamic dimension, smallest first: 1, then sizes audio and sensor
# front ends are commonly fed (a 10 ms hop at 16 kHz, 80 ms, 1 s).
INSPECT_SIZES = (1, 160, 1280, 16000)


def _input(interp: Any) -> Optional[tuple[dict, list[int]]]:
    """The one input's details and shape signature (None for several: refused elsewhere, by name)."""
    details = interp.get_input_details()
    if len(details) != 1:
        return None
    detail = details[0]
    return detail, [int(v) for v in detail.get("shape_signature", detail["shape"])]


def size_input(interp: Any, sample_shape: Optional[Sequence[int]], path: Any) -> None:
    """Before allocate_tensors(): resize a dynamic input to [batch, *sample_shape]; ModelError
    when it has a dynamic dimension and no shape was given, or a shape that does not fit it."""
    found = _input(interp)
    dims = dynamic_dims(found[1]) if found is not None else []
    if not dims:
        return
    detail, signature = found
    name = detail["name"]
    if sample_shape is None:
        raise ModelError(path, f"its input {name} has dynamic dimension(s) {dims} (shape signature {signature}): "
                         "set routes[].input.shape (after its preprocess steps) to the size you will send, and "
                         "the daemon sizes the input with it before allocating")
    fixed = signature[1:]
    if len(sample_shape) != len(fixed) or any(v not in (DYNAMIC, s) for v, s in zip(fixed, sample_shape)):
        raise ModelError(path, f"its input {name} (shape signature {signature}) cannot take a sample of "
                         f"{list(sample_shape)}: routes[].input.shape (after preprocessing) must keep its fixed "
                         "dimensions")
    batch = 1 if signature[0] == DYNAMIC else int(detail["shape"][0])
    interp.resize_tensor_input(detail["index"], [batch, *sample_shape])


def inspect_sizes(interp: Any) -> list[list[int]]:
    """Sample shapes for `inspect` to try, one per INSPECT_SIZES (empty: nothing dynamic)."""
    found = _input(interp)
    if found is None or not dynamic_dims(found[1]):
        return []
    signature = found[1]
    return [[size if v == DYNAMIC else v for v in signature[1:]] for size in INSPECT_SIZES]
