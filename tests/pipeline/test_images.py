"""Camera images: formats, sizes refused before decoding, colour, stretch/letterbox and their Geometry."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from daemon.errors import PayloadError
from daemon.pipeline.geometry import Geometry
from daemon.config.schema import LETTERBOX, RESIZE_MODES, STRETCH
from daemon.pipeline.images import LETTERBOX_PAD, decode_image
from tests.fakes import png_claiming

RED, BLUE = (255, 0, 0), (0, 0, 255)
BOMB_SIDE = 60_000  # 3.6 gigapixels: ~11 GB as RGB


def _encode(array: np.ndarray, fmt: str = "PNG", **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **options)
    return buf.getvalue()


def _halves(width: int = 640, height: int = 480) -> bytes:
    """Left half red, right half blue."""
    array = np.zeros((height, width, 3), np.uint8)
    array[:, : width // 2], array[:, width // 2:] = RED, BLUE
    return _encode(array)


def _smooth(width: int, height: int) -> np.ndarray:
    """Gradients on all three channels: what a DCT-scaled decode should reproduce closely."""
    yy, xx = np.mgrid[0:height, 0:width]
    return np.stack([xx * 255 / (width - 1), yy * 255 / (height - 1), (xx + yy) * 127 / (width + height)],
                    axis=-1).astype(np.uint8)


def _jpeg_claiming(width: int, height: int) -> bytes:
    """A small real JPEG with its SOF0 frame header patched to claim width x height."""
    payload = bytearray(_encode(np.zeros((8, 8, 3), np.uint8), "JPEG"))
    sof = payload.index(b"\xff\xc0")
    payload[sof + 5:sof + 9] = struct.pack(">HH", height, width)  # marker, length, precision, then H, W
    return bytes(payload)


def _error(payload: bytes, **kwargs) -> PayloadError:
    with pytest.raises(PayloadError) as err:
        decode_image(payload, 32, 32, 3, request_id="req-1", **kwargs)
    assert err.value.request_id == "req-1"
    return err.value


def test_stretch_scales_each_axis_to_the_input():
    pixels, geometry = decode_image(_halves(), 300, 300, 3)
    assert pixels.shape == (300, 300, 3) and pixels.dtype == np.uint8
    assert geometry == Geometry(640, 480, 300, 300, 300 / 640, 300 / 480, 0.0, 0.0)
    assert (pixels[:, :149] == RED).all() and (pixels[:, 151:] == BLUE).all()


def test_letterbox_keeps_the_aspect_and_pads_top_and_bottom():
    pixels, geometry = decode_image(_halves(), 320, 320, 3, resize=LETTERBOX)
    assert geometry == Geometry(640, 480, 320, 320, 0.5, 0.5, 0.0, 40.0)
    assert pixels.shape == (320, 320, 3)
    assert LETTERBOX_PAD == 114 and (pixels[:40] == 114).all() and (pixels[280:] == 114).all()  # YOLO's grey
    assert (pixels[40:280, :159] == RED).all() and (pixels[40:280, 161:] == BLUE).all()


def test_letterbox_of_a_tall_image_pads_left_and_right():
    pixels, geometry = decode_image(_encode(np.full((640, 480, 3), 7, np.uint8)), 320, 320, 3, resize=LETTERBOX)
    assert (geometry.scale_x, geometry.scale_y, geometry.pad_x, geometry.pad_y) == (0.5, 0.5, 40.0, 0.0)
    assert (pixels[:, :40] == LETTERBOX_PAD).all() and (pixels[:, 40:280] == 7).all()
    assert (pixels[:, 280:] == LETTERBOX_PAD).all()


@pytest.mark.parametrize("resize", RESIZE_MODES)
@pytest.mark.parametrize("size", [(640, 480), (1001, 667), (333, 999)])
def test_content_corners_map_back_to_the_sent_corners(resize, size):
    width, height = size
    pixels, geometry = decode_image(_encode(np.full((height, width, 3), 200, np.uint8)), 320, 320, 3, resize=resize)
    rows, cols = np.nonzero((pixels != LETTERBOX_PAD).all(axis=2))  # the content, not the pad
    top, left, bottom, right = rows.min(), cols.min(), rows.max() + 1, cols.max() + 1
    assert (left, top) == (geometry.pad_x, geometry.pad_y)
    assert geometry.to_sent(left, top) == (0.0, 0.0)
    assert geometry.to_sent(right, bottom) == pytest.approx((width, height), abs=1e-9)


@pytest.mark.parametrize("resize", RESIZE_MODES)
@pytest.mark.parametrize("fmt,size", [("PNG", (1001, 667)), ("JPEG", (1925, 1083))])  # JPEG: the draft path
def test_a_box_in_model_pixels_maps_back_to_where_it_was_sent(resize, fmt, size):
    width, height = size
    sent = np.zeros((height, width, 3), np.uint8)
    sent[200:500, 300:700] = 255  # the object: x 300..700, y 200..500
    pixels, geometry = decode_image(_encode(sent, fmt, **({"quality": 95} if fmt == "JPEG" else {})),
                                    320, 320, 3, resize=resize)
    rows, cols = np.nonzero(pixels[..., 0] > 127)
    x0, y0 = geometry.to_sent(cols.min(), rows.min())
    x1, y1 = geometry.to_sent(cols.max() + 1, rows.max() + 1)
    tolerance = 1.0 / min(geometry.scale_x, geometry.scale_y)  # one model pixel, in sent pixels
    assert (x0, y0, x1, y1) == pytest.approx((300, 200, 700, 500), abs=tolerance)


def test_an_image_at_the_input_size_is_returned_without_resampling(monkeypatch):
    noise = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    monkeypatch.setattr(Image.Image, "resize", lambda *args, **kwargs: pytest.fail("resampled"))
    for resize in RESIZE_MODES:
        pixels, geometry = decode_image(_encode(noise), 48, 64, 3, resize=resize)
        assert np.array_equal(pixels, noise) and geometry == Geometry.identity(64, 48)


def test_a_small_image_is_scaled_up():
    pixels, geometry = decode_image(_halves(64, 48), 320, 320, 3, resize=LETTERBOX)
    assert (geometry.scale_x, geometry.pad_y) == (5.0, 40.0)
    assert (pixels[40:280, :150] == RED).all() and (pixels[40:280, 170:] == BLUE).all()


def test_a_sliver_keeps_at_least_one_row():
    pixels, geometry = decode_image(_encode(np.full((1, 1000, 3), 9, np.uint8)), 320, 320, 3, resize=LETTERBOX)
    assert geometry.pad_y == 159.0 and (pixels[159] == 9).all() and (pixels[160] == LETTERBOX_PAD).all()


def test_one_channel_is_grayscale_with_its_axis_kept():
    pixels, _ = decode_image(_halves(), 300, 300, 1)
    assert pixels.shape == (300, 300, 1)
    assert pixels[0, 0, 0] == 76 and pixels[0, 299, 0] == 29  # ITU-R 601 luma of red, blue


def test_a_grayscale_source_becomes_rgb_for_three_channels():
    pixels, _ = decode_image(_encode(np.full((10, 10), 90, np.uint8)), 10, 10, 3)
    assert pixels.shape == (10, 10, 3) and (pixels == 90).all()


def test_png_alpha_and_palette_convert_to_rgb():
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[...] = (10, 20, 30, 0)  # fully transparent: the colour is kept, the alpha dropped
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 40, 50, 60] + [0] * 762)
    buf = io.BytesIO()
    palette.save(buf, "PNG", transparency=0)
    assert (decode_image(_encode(rgba), 8, 8, 3)[0] == (10, 20, 30)).all()
    assert (decode_image(buf.getvalue(), 8, 8, 3)[0] == (40, 50, 60)).all()
    assert decode_image(_encode(rgba[..., [0, 3]]), 8, 8, 1)[0].shape == (8, 8, 1)  # LA


def test_sixteen_bit_grayscale_keeps_the_high_byte_instead_of_clipping():
    deep = np.array([[0, 0x1234, 0x8000, 0xFFFF]], dtype=np.uint16)
    pixels, _ = decode_image(_encode(deep), 1, 4, 1)
    assert pixels[0, :, 0].tolist() == [0x00, 0x12, 0x80, 0xFF]


@pytest.mark.parametrize("bomb", [png_claiming, _jpeg_claiming])
def test_a_bomb_is_too_large_from_its_header_alone(bomb):
    # Decoding the one-byte IDAT (or 8x8 scan) at 60000x60000 would fail as bad_payload.
    error = _error(bomb(BOMB_SIDE, BOMB_SIDE))
    assert error.code == "too_large"
    assert "60000x60000" in error.message and "40000000" in error.message


def test_the_limit_is_inclusive():
    payload = _encode(np.zeros((10, 20, 3), np.uint8))
    assert decode_image(payload, 10, 20, 3, max_pixels=200)[0].shape == (10, 20, 3)
    assert _error(payload, max_pixels=199).code == "too_large"


@pytest.mark.filterwarnings("error")  # no DecompressionBombWarning either
def test_pillows_global_limit_neither_refuses_what_we_allow_nor_is_needed(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # Pillow alone would refuse 64x64 as a bomb
    assert decode_image(_halves(64, 64), 32, 32, 3)[0].shape == (32, 32, 3)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # Pillow's check turned off elsewhere
    assert _error(png_claiming(BOMB_SIDE, BOMB_SIDE)).code == "too_large"


def test_truncated_files_are_bad_payload():
    jpeg = _encode(_smooth(640, 480), "JPEG", quality=85)
    png = _halves()
    for payload in (jpeg[: len(jpeg) // 2], png[: len(png) // 2], jpeg[:30], png[:20]):
        error = _error(payload)
        assert error.code == "bad_payload" and ("truncated" in error.message or "header" in error.message)


def test_a_corrupt_png_header_is_bad_payload():
    png = bytearray(_halves())
    png[29] ^= 0xFF  # IHDR's CRC
    assert _error(bytes(png)).code == "bad_payload"


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF", "WEBP"])
def test_other_formats_are_bad_payload(fmt):
    if fmt == "WEBP" and "WEBP" not in Image.SAVE:
        pytest.skip("Pillow built without WebP")
    error = _error(_encode(np.zeros((8, 8, 3), np.uint8), fmt))
    assert error.code == "bad_payload" and "not a JPEG or PNG" in error.message


@pytest.mark.parametrize("payload", [b"", b"\x00", np.random.default_rng(1).bytes(4096), b"\xff\xd8\xff" + bytes(64)])
def test_random_bytes_are_bad_payload(payload):
    assert _error(payload).code == "bad_payload"


@pytest.mark.parametrize("resize,size", [(STRETCH, (300, 300)), (LETTERBOX, (320, 320)), (STRETCH, (224, 224))])
def test_the_jpeg_draft_matches_a_full_decode(monkeypatch, resize, size):
    payload = _encode(_smooth(1925, 1083), "JPEG", quality=90)  # odd sizes: partial DCT blocks at the edges
    full, full_geometry = decode_image(payload, *size, 3, resize=resize, draft=False)
    scales = []
    original = JpegImagePlugin.JpegImageFile.draft

    def spy(img, mode, requested):
        drafted = original(img, mode, requested)
        scales.append(img.decoderconfig[0])
        return drafted
    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    drafted, geometry = decode_image(payload, *size, 3, resize=resize)
    assert scales and scales[0] >= 2 and geometry == full_geometry  # reduced, geometry from the original
    difference = np.abs(drafted.astype(int) - full.astype(int))
    assert difference.mean() < 0.5 and difference.max() <= 4


@pytest.mark.parametrize("resize,size", [(STRETCH, (300, 300)), (LETTERBOX, (320, 320))])
def test_the_draft_keeps_an_edge_where_the_full_size_puts_it(resize, size):
    # 2409 = 8 * 301 + 1: at 1/8 scale the last DCT column holds one sent column, not eight;
    # resizing the reduced image as if it were whole would move this edge by ~0.4-0.8 model px.
    side, edge = 2409, 2300
    sent = np.zeros((side, side), np.uint8)
    sent[:, edge:] = 255
    pixels, geometry = decode_image(_encode(sent, "JPEG", quality=95), *size, 1, resize=resize)
    left, top = int(geometry.pad_x), int(geometry.pad_y)
    right = left + round(side * geometry.scale_x)
    white_width = pixels[top + 10:top + 50, left:right, 0].astype(float).sum(axis=1).mean() / 255
    assert right - white_width == pytest.approx(edge * geometry.scale_x + geometry.pad_x, abs=0.1)


@pytest.mark.parametrize("kwargs", [{"channels": 4}, {"channels": 2}, {"resize": "crop"}, {"height": 0}])
def test_a_bad_target_is_the_callers_error(kwargs):
    args = {"height": 32, "width": 32, "channels": 3, **kwargs}
    with pytest.raises(ValueError):
        decode_image(_halves(), **args)
