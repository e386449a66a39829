"""Read the built-in game's frame stamp from a decoded ``av.VideoFrame``.

Job: the stamp strip (docs/protocol.md, "Frame stamps": 40 x 3 square cells of width / 40
pixels at the top of the picture, white = 1, row-major MSB first: sync 8 bits, frame number 32,
render time in epoch ms 48, CRC 16, tail 16) read straight from the frame's luma plane, so a
client needs no colour conversion to measure render-to-decode latency and frame gaps.  The
same format as ``web/stamp.js`` and the node's writer (``streamer.desktop.game``); a test draws
stamps with the node's writer and reads them here.

Pure (numpy only).  Each cell is judged by the mean luma of its central half, robust to the
blur and ringing of a lossy codec.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

import av
import numpy as np
import numpy.typing as npt

STAMP_COLUMNS: Final = 40
STAMP_ROWS: Final = 3
STAMP_SYNC: Final = 0b1011_0001
STAMP_TAIL: Final = 0x5AC3
_BITS: Final = STAMP_COLUMNS * STAMP_ROWS  # 120
_WHITE_LUMA: Final = 128  # threshold between black (16 in limited range) and white (235)


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a stamped frame says about itself."""

    frame_no: int  # counts up by one per rendered frame
    ts_ms: int  # render time, ms since the epoch (the node's clock)


def stamp_height(width: int) -> int:
    """Height in pixels of the stamp strip of a picture ``width`` pixels wide."""
    return round(STAMP_ROWS * width / STAMP_COLUMNS)


def parse_word(word: int) -> Stamp | None:
    """The stamp in a 120-bit word (cell (0, 0) the MSB), or None when sync, tail or CRC do not match."""
    tail = word & 0xFFFF
    crc = (word >> 16) & 0xFFFF
    ts_ms = (word >> 32) & ((1 << 48) - 1)
    frame_no = (word >> 80) & 0xFFFF_FFFF
    if word >> 112 != STAMP_SYNC or tail != STAMP_TAIL:
        return None
    if zlib.crc32(frame_no.to_bytes(4, "big") + ts_ms.to_bytes(6, "big")) & 0xFFFF != crc:
        return None
    return Stamp(frame_no, ts_ms)


def read_luma(luma: npt.NDArray[np.uint8]) -> Stamp | None:
    """The stamp in a greyscale picture (``H x W``, at least the strip's rows), or None."""
    if luma.ndim != 2 or luma.shape[1] < STAMP_COLUMNS:
        return None
    width = int(luma.shape[1])
    if luma.shape[0] < stamp_height(width):
        return None
    edges = np.round(np.arange(STAMP_COLUMNS + 1) * (width / STAMP_COLUMNS)).astype(np.int64)
    quarter = (edges[1:] - edges[:-1]) // 4
    lo, hi = edges[:-1] + quarter, edges[1:] - quarter  # each cell's central half, columns
    word = 0
    for row in range(STAMP_ROWS):
        y0, y1 = int(edges[row]), int(edges[row + 1])
        qy = (y1 - y0) // 4
        column_means = luma[y0 + qy : y1 - qy].mean(axis=0)
        sums = np.concatenate(([0.0], np.cumsum(column_means)))
        cells = (sums[hi] - sums[lo]) / np.maximum(hi - lo, 1)
        for bit in cells >= _WHITE_LUMA:
            word = (word << 1) | int(bit)
    return parse_word(word)


def read_frame(frame: av.VideoFrame) -> Stamp | None:
    """The stamp of a decoded frame, read from its luma plane (yuv420p, nv12, ...), or None."""
    if frame.format.name not in ("yuv420p", "yuvj420p", "nv12", "yuv444p", "gray"):
        frame = frame.reformat(format="yuv420p")
    plane = frame.planes[0]
    rows = min(frame.height, stamp_height(frame.width) + 1)
    data = np.frombuffer(memoryview(plane), dtype=np.uint8, count=plane.line_size * rows)
    return read_luma(data.reshape(rows, plane.line_size)[:, : frame.width])
