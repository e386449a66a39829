"""The remote screen size a viewer's window asks for, within what the session may use.

Job: the viewer sends its video area in device pixels (``{"t":"rs","w":..,"h":..}``); a desktop
session's screen follows it.  ``limits_for`` fixes the bounds once per session from its start
profile and the node's settings, ``fit`` turns each request into the size to set:

- never more pixels than ``max_pixels`` (the larger of the start profile's area and the node's
  ``resize_max_pixels``: a profile the broker accepted is always allowed), never a side over
  ``max_side`` (the framebuffer Xvfb is started with is ``max_side`` square, so portrait and
  landscape windows both fit); a request over either is scaled down whole, keeping its shape;
- both sides even (4:2:0 video) and at least ``MIN_SIDE_PX``.

The ladder (``streamer.abr.ladder``) is then rebuilt on the new size, so its rungs (and their
bitrate floors) follow the screen: a bigger screen is never encoded above the ladder's rules.

Concurrency model: none; pure functions of frozen values.

Invariants: ``fit`` returns even sides within ``MIN_SIDE_PX..max_side`` and an area of at most
``max_pixels`` (for any request of positive sides); equal requests give equal sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

MIN_SIDE_PX: Final = 64  # the smallest side "rs" accepts (streamer.desktop.inputs.RESIZE_MIN_PX)
ABS_MAX_SIDE_PX: Final = 7680  # the largest side any profile may have
# Node defaults: 2560x1440 (a 1280x720 window at devicePixelRatio 2) in pixels, 2560 per side.
DEFAULT_MAX_PIXELS: Final = 2560 * 1440
DEFAULT_MAX_SIDE_PX: Final = 2560


@dataclass(frozen=True, slots=True)
class ViewportLimits:
    """Bounds of one session's screen: area in pixels, longest side in pixels."""

    max_pixels: int
    max_side: int

    def __post_init__(self) -> None:
        if self.max_side < MIN_SIDE_PX or self.max_side > ABS_MAX_SIDE_PX:
            raise ValueError(f"max_side must be within {MIN_SIDE_PX}..{ABS_MAX_SIDE_PX}, got {self.max_side}")
        if self.max_pixels < MIN_SIDE_PX * MIN_SIDE_PX:
            raise ValueError(f"max_pixels must be >= {MIN_SIDE_PX * MIN_SIDE_PX}, got {self.max_pixels}")

    @property
    def framebuffer(self) -> tuple[int, int]:
        """The Xvfb framebuffer that holds every size ``fit`` can return."""
        return (self.max_side, self.max_side)


def limits_for(width: int, height: int, max_pixels: int = DEFAULT_MAX_PIXELS,
               max_side: int = DEFAULT_MAX_SIDE_PX) -> ViewportLimits:
    """Bounds for a session that starts at ``width x height`` on a node with these settings."""
    side = min(ABS_MAX_SIDE_PX, max(width, height, max_side))
    return ViewportLimits(max_pixels=max(width * height, max_pixels), max_side=side)


def _even_down(value: float) -> int:
    return max(MIN_SIDE_PX, int(value) // 2 * 2)


def fit(width: int, height: int, limits: ViewportLimits) -> tuple[int, int]:
    """The screen size for a ``width x height`` request (see the module docstring)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"a size needs positive sides, got {width}x{height}")
    scale = min(1.0, limits.max_side / max(width, height), math.sqrt(limits.max_pixels / (width * height)))
    w, h = _even_down(width * scale), _even_down(height * scale)
    w, h = min(w, limits.max_side // 2 * 2), min(h, limits.max_side // 2 * 2)
    while w * h > limits.max_pixels:  # rounding and the minimum side can overshoot by a row
        if w >= h and w > MIN_SIDE_PX:
            w -= 2
        elif h > MIN_SIDE_PX:
            h -= 2
        else:
            break
    return w, h
