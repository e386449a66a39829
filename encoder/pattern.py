"""Deterministic synthetic frames for the probe, the tests and the benchmark.

Job: produce a moving, desktop-like test picture (gradients, a moving
checkerboard window, a band of fine "text" stripes) as an HxWx4 BGRA uint8
array -- the layout x11grab (bgr0) and mss (bgra) deliver -- so encoders see
motion, flat areas and sharp edges, and decoded output can be compared with
its source by PSNR.

Concurrency model: pure functions over numpy; safe from any thread.
Invariants: same (width, height, index) -> same pixels; alpha is 255.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Frame = npt.NDArray[np.uint8]


def moving_pattern(width: int, height: int, index: int, *, detail: bool = False) -> Frame:
    """Frame ``index`` of the moving test pattern, HxWx4 BGRA (alpha 255).

    ``detail=True`` overlays scrolling bands of fine random texture (foliage,
    film grain, a busy game scene) over a third of the rows; no encoder
    compresses it well, so rate control -- not the content -- decides the
    output size.
    """
    if width < 16 or height < 16:
        raise ValueError("pattern needs at least 16x16 pixels")
    x = np.arange(width, dtype=np.int32)[None, :]
    y = np.arange(height, dtype=np.int32)[:, None]
    out = np.empty((height, width, 4), dtype=np.uint8)
    out[..., 0] = (x * 255 // width + index * 2) % 256  # blue: gradient scrolling right
    out[..., 1] = y * 255 // height  # green: static vertical gradient
    out[..., 2] = ((x + y + index * 6) // 3) % 256  # red: diagonal bands moving
    out[..., 3] = 255

    # A checkerboard "window" sliding across the screen.
    cell = max(4, width // 40)
    side = cell * 8
    if side < width and side < height // 2:
        bx = (index * 7) % (width - side)
        by = height // 4 + (index * 3) % (height // 2 - side + 1)
        yy, xx = np.mgrid[0:side, 0:side]
        board = (((xx // cell + yy // cell) % 2) * 255).astype(np.uint8)
        out[by : by + side, bx : bx + side, :3] = board[..., None]

    # A band of fine stripes, like rows of small text.
    top = height * 3 // 4
    rows = max(2, height // 10)
    stripes = (((x // 2) % 2) * ((y[:rows] // 3) % 2) * 200).astype(np.uint8)
    out[top : top + rows, :, :3] = stripes[..., None]

    if detail:
        # Every third 16-row band, spread over the whole height so sliced
        # encoder threads share the load as they would on a busy game frame.
        rows_mask = (np.arange(height) // 16) % 3 == 0
        texture = _texture(width, int(rows_mask.sum()))
        out[rows_mask, :, :3] = np.roll(texture, (index * 5) % width, axis=1)
    return out


def _texture(width: int, height: int) -> Frame:
    """A fixed random BGR texture (seeded: deterministic)."""
    rng = np.random.default_rng(seed=width * 7919 + height)
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def psnr(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> float:
    """Peak signal-to-noise ratio in dB between two same-shaped uint8 arrays."""
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    if mse == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(255.0**2 / mse))
