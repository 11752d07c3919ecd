"""Camera images as cameras send them: a JPEG or PNG of any size -> the model's input array.

`decode_image` reads the size from the header, refuses a decompression bomb before a pixel
is decoded, lets libjpeg decode a much larger JPEG at 1/2, 1/4 or 1/8 scale, converts to RGB
or grayscale and resizes to the model's input: stretched (each axis on its own) or
letterboxed (one scale, centred, padded). The `Geometry` it returns says where the sent
image lies in that input, so a box in model pixels maps back to the sent pixels.

`Image.MAX_IMAGE_PIXELS`, Pillow's global, is neither read nor written here. `Image.open` checks
`Image.MAX_IMAGE_PIXELS` (89.5 MP: a warning above it, `DecompressionBombError` above
twice it) before its caller sees the size, so a bomb would be refused by Pillow's rule,
not ours, and a route allowed more than 89.5 MP would warn or fail. Changing the global,
even for the span of one call, would change it for every other thread and library in the
process. So the file is opened with the JPEG or PNG plugin's own class, chosen by the
format's signature (the two formats `Image.open(formats=("JPEG", "PNG"))` would allow):
the same header parsing, without the global check, and `max_pixels` is the only limit.
Truncated files are refused because `ImageFile.LOAD_TRUNCATED_IMAGES` is False, Pillow's
default; code that sets it True would make a truncated image decode grey-filled.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
from PIL import Image, JpegImagePlugin, PngImagePlugin

from daemon.config.schema import DEFAULT_MAX_PIXELS, RESIZE_MODES, STRETCH
from daemon.errors import BAD_PAYLOAD, TOO_LARGE, PayloadError
from daemon.pipeline.geometry import Geometry

# Letterbox padding: mid-grey, ultralytics YOLO's value, so a letterboxed YOLO export sees the
# pad it was trained with; 0 would read as black content at the image's edges.
LETTERBOX_PAD = 114
_PIL_MODES = {1: "L", 3: "RGB"}  # channels -> Pillow mode
_JPEG_SIGNATURE = b"\xff\xd8\xff"  # SOI and the first marker's 0xFF
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# libjpeg decodes at 1/2, 1/4 or 1/8 scale (the DCT is scaled, not resampled): worth it only
# when the source is at least twice the target on both axes, which is when draft() picks one.
_DRAFT_MIN_FACTOR = 2
# 16-bit grayscale PNG: Pillow's convert("L") clips at 255 instead of scaling; shift instead
# (Pillow's own PNG reader keeps the high byte of 16-bit RGB too).
_SIXTEEN_BIT_GREY = ("I;16", "I;16B", "I;16L")
_HIGH_BYTE_SHIFT = 8
# What Pillow's readers raise on a malformed or truncated file (its own Image.open catches
# the same, ImageFile turns most into SyntaxError).
_READ_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError, struct.error)


def decode_image(payload: bytes, height: int, width: int, channels: int, resize: str = STRETCH,
                 max_pixels: int = DEFAULT_MAX_PIXELS, request_id: Any = None, *,
                 draft: bool = True) -> tuple[np.ndarray, Geometry]:
    """JPEG or PNG bytes -> uint8 (height, width, channels) and where the image lies in it.

    The array may be read-only (a view of Pillow's buffer): copy it before writing to it.
    EXIF orientation is not applied, so `Geometry` speaks of the pixels as stored.
    `draft=False` decodes a large JPEG at full size (for comparison and benchmarks).
    Raises PayloadError: bad_payload for anything but a readable JPEG or PNG, too_large for
    more than `max_pixels` pixels (from the header, before decoding)."""
    mode = _check_target(height, width, channels, resize)
    with _open(payload, request_id) as img:
        _check_pixels(img, max_pixels, request_id)
        geometry = _geometry(img.width, img.height, width, height, resize)
        content = _content_size(geometry)
        box = _draft(img, mode, content) if draft and img.format == "JPEG" else None
        picture = _pixels(img, mode, request_id)
    return _place(_resized(picture, content, box), geometry, channels), geometry


def decode_full(payload: bytes, channels: int, max_pixels: int = DEFAULT_MAX_PIXELS):
    """A JPEG or PNG at its full resolution (never libjpeg's reduced scale: a crop's detail is the
    point), as a Pillow image in RGB or grayscale, for `fit` to take regions of.
    Raises PayloadError as `decode_image` does."""
    mode = _check_target(1, 1, channels, STRETCH)
    with _open(payload, None) as img:
        _check_pixels(img, max_pixels, None)
        return _pixels(img, mode, None)


def _check_pixels(img, max_pixels: int, request_id: Any) -> None:
    """too_large for more pixels than `max_pixels`, from the header, before anything is decoded."""
    sent_w, sent_h = img.size
    if sent_w * sent_h > max_pixels:
        raise PayloadError(TOO_LARGE, f"image is {sent_w}x{sent_h} = {sent_w * sent_h} pixels; "
                           f"the limit is {max_pixels}", request_id)


def fit(picture, height: int, width: int, channels: int, resize: str = STRETCH) -> np.ndarray:
    """A Pillow image (a region of `decode_full`'s) -> uint8 (height, width, channels), resized as
    `decode_image` resizes a sent picture (`resize`: stretch or letterbox)."""
    _check_target(height, width, channels, resize)
    geometry = _geometry(picture.width, picture.height, width, height, resize)
    return _place(_resized(picture, _content_size(geometry), None), geometry, channels)


def _check_target(height: int, width: int, channels: int, resize: str) -> str:
    """The route's side (config, not the request): a ValueError, never a PayloadError."""
    if channels not in _PIL_MODES:
        raise ValueError(f"channels must be 1 or 3, not {channels!r}")
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, not {resize!r}")
    if min(height, width) < 1:
        raise ValueError(f"the model's input must be at least 1x1, not {height}x{width}")
    return _PIL_MODES[channels]


def _open(payload: bytes, request_id: Any):
    """The header only (lazy), by the plugin class the signature names; see the docstring."""
    if payload.startswith(_JPEG_SIGNATURE):
        reader = JpegImagePlugin.JpegImageFile
    elif payload.startswith(_PNG_SIGNATURE):
        reader = PngImagePlugin.PngImageFile
    else:
        raise PayloadError(BAD_PAYLOAD, f"not a JPEG or PNG image (it starts with 0x{bytes(payload[:8]).hex()})",
                           request_id)
    try:
        return reader(io.BytesIO(payload))
    except _READ_ERRORS as exc:
        raise PayloadError(BAD_PAYLOAD, f"not a readable {reader.format} header: {exc}", request_id) from None


def _geometry(sent_w: int, sent_h: int, width: int, height: int, resize: str) -> Geometry:
    """Scales from the content's whole-pixel size, so `model = sent * scale + pad` is exact."""
    if resize == STRETCH:
        return Geometry(sent_w, sent_h, width, height, width / sent_w, height / sent_h)
    scale = min(width / sent_w, height / sent_h)
    content_w = min(width, max(1, round(sent_w * scale)))
    content_h = min(height, max(1, round(sent_h * scale)))
    # An odd leftover puts the extra pixel right and below (as ultralytics' letterbox does).
    return Geometry(sent_w, sent_h, width, height, content_w / sent_w, content_h / sent_h,
                    float((width - content_w) // 2), float((height - content_h) // 2))


def _content_size(geometry: Geometry) -> tuple[int, int]:
    """The resized image's size in model pixels: the whole input unless letterboxed."""
    return round(geometry.width * geometry.scale_x), round(geometry.height * geometry.scale_y)


def _draft(img, mode: str, content: tuple[int, int]):
    """Let libjpeg decode at the smallest DCT scale still at least `content` (must come before
    load). Returns the box of the reduced image that covers the original exactly (its last
    row and column may be partial), or None when decoding at full size."""
    if min(img.width // content[0], img.height // content[1]) < _DRAFT_MIN_FACTOR:
        return None
    drafted = img.draft(mode, content)
    return None if drafted is None else drafted[1]


def _pixels(img, mode: str, request_id: Any):
    """Decode (the first time pixels are read) and convert to `mode`; alpha is dropped."""
    sent_format = img.format  # the converted image has none
    try:
        img.load()
        if img.mode in _SIXTEEN_BIT_GREY:
            img = Image.fromarray((np.asarray(img) >> _HIGH_BYTE_SHIFT).astype(np.uint8))
        return img if img.mode == mode else img.convert(mode)
    except _READ_ERRORS as exc:
        raise PayloadError(BAD_PAYLOAD, f"{sent_format} image is truncated or corrupt: {exc}", request_id) from None


def _resized(picture, content: tuple[int, int], box):
    """BILINEAR: Pillow widens its support by the reduction ratio (it antialiases), so it is
    sound for large reductions too; 640x480 -> 300x300 costs 1.8 ms here, BICUBIC 2.9, LANCZOS 4.2."""
    if box is None and picture.size == content:
        return picture  # already the model's size: no resampling
    return picture.resize(content, Image.Resampling.BILINEAR, box=box)


def _place(picture, geometry: Geometry, channels: int) -> np.ndarray:
    pixels = np.asarray(picture).reshape(picture.height, picture.width, channels)
    if picture.size == (geometry.input_width, geometry.input_height):
        return pixels
    canvas = np.full((geometry.input_height, geometry.input_width, channels), LETTERBOX_PAD, dtype=np.uint8)
    left, top = int(geometry.pad_x), int(geometry.pad_y)
    canvas[top:top + picture.height, left:left + picture.width] = pixels
    return canvas
