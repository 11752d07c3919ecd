"""Where a sent image lies in the model's input, so boxes can be mapped back to its pixels.

The image decoder (images.py) resizes a sent image of `width` x `height` pixels to the
model's `input_width` x `input_height`: stretched (each axis scaled on its own, no padding)
or letterboxed (one scale for both axes, centred, the rest padded). Either way a point of the
sent image lands at `model = sent * scale + pad` on each axis, in model-input pixels.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    width: int
    """The image as sent, in pixels."""
    height: int
    input_width: int
    """The model's input, in pixels."""
    input_height: int
    scale_x: float
    scale_y: float
    pad_x: float = 0.0
    pad_y: float = 0.0

    @classmethod
    def identity(cls, width: int, height: int) -> "Geometry":
        """An image sent at exactly the model's size (or input that is not an image)."""
        return cls(width, height, width, height, 1.0, 1.0)

    def to_sent(self, x: float, y: float) -> tuple[float, float]:
        """A point in model-input pixels -> the sent image's pixels, clamped to the image."""
        sx = (x - self.pad_x) / self.scale_x
        sy = (y - self.pad_y) / self.scale_y
        return min(max(sx, 0.0), float(self.width)), min(max(sy, 0.0), float(self.height))

    def normalized_to_sent(self, x: float, y: float) -> tuple[float, float]:
        """A point in [0, 1] coordinates of the model's input -> the sent image's pixels, clamped."""
        return self.to_sent(x * self.input_width, y * self.input_height)
