"""Colour conversion and scaling of captured frames: once, and only if needed.

Job: take what capture delivers -- an ``av.VideoFrame`` in any pixel format
(bgr0/bgra from x11grab, yuv420p from a decoder) or a numpy array
(HxWx4 BGRA/BGR0 from mss, HxWx3 BGR24) -- and hand the encoder a frame in
a pixel format and size it accepts. Numpy arrays are wrapped without a copy
(``VideoFrame.from_numpy_buffer``); a frame already in an accepted format and
the right size passes through untouched, so NVENC gets bgr0/bgra straight
from capture and only software encoders pay for RGB->YUV.

Concurrency model: synchronous and CPU-bound; a ``FrameConverter`` is owned
by one encoder and used from the one thread that encodes (it reuses one
swscale context). Never call it on the event loop.

Invariants:
- at most one swscale pass per frame (format and size change together);
- RGB->YUV uses the backend's matrix (BT.709 or BT.601) with limited range,
  matching the colour description written into the bitstream;
- a numpy-backed frame borrows the caller's buffer: the caller must not
  overwrite the array until ``encode`` returns (it is synchronous).
"""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt
from av.video.reformatter import ColorRange, Colorspace, Interpolation, VideoReformatter

# What a numpy array's channel count means (BGR0 and BGRA share a memory layout;
# alpha/padding is ignored by RGB->YUV and by NVENC's ARGB input).
NUMPY_FORMATS: dict[int, str] = {4: "bgra", 3: "bgr24"}

# Pixel formats whose samples are RGB (conversion to YUV needs a matrix).
_RGB_FORMATS = frozenset({"bgr0", "bgra", "rgb0", "rgba", "0rgb", "argb", "bgr24", "rgb24"})

_MATRICES = {"bt709": Colorspace.ITU709, "bt601": Colorspace.ITU601}

InputFrame = av.VideoFrame | npt.NDArray[np.uint8]


def as_video_frame(src: InputFrame) -> av.VideoFrame:
    """Wrap ``src`` as an ``av.VideoFrame`` (no copy for C-contiguous rows)."""
    if isinstance(src, av.VideoFrame):
        return src
    if not isinstance(src, np.ndarray):
        raise TypeError(f"expected av.VideoFrame or numpy array, got {type(src).__name__}")
    if src.dtype != np.uint8 or src.ndim != 3 or src.shape[2] not in NUMPY_FORMATS:
        raise ValueError(f"numpy frames must be uint8 HxWx4 (BGRA/BGR0) or HxWx3 (BGR24), got {src.dtype} {src.shape}")
    channels = src.shape[2]
    if src.strides[1:] != (channels, 1) or src.strides[0] < src.shape[1] * channels:
        src = np.ascontiguousarray(src)
    return av.VideoFrame.from_numpy_buffer(src, format=NUMPY_FORMATS[channels])


class FrameConverter:
    """Converts frames to one target size and an accepted pixel format."""

    def __init__(
        self,
        width: int,
        height: int,
        accepted: tuple[str, ...],
        yuv_matrix: str = "bt709",
        threads: int = 1,
        fast: bool = False,
    ) -> None:
        if not accepted:
            raise ValueError("accepted pixel formats must not be empty")
        if yuv_matrix not in _MATRICES:
            raise ValueError(f"yuv_matrix must be one of {sorted(_MATRICES)}, got {yuv_matrix!r}")
        self.width = width
        self.height = height
        self.accepted = accepted
        self.target = accepted[0]
        self._matrix = _MATRICES[yuv_matrix]
        self._threads = threads
        # Same-size conversions: BILINEAR averages chroma when subsampling to 4:2:0; POINT
        # picks one sample -- measured ~25% faster at 1080p, ~0.4 dB worse on sharp colour edges.
        self._same_size = Interpolation.POINT if fast else Interpolation.BILINEAR
        self._reformatter = VideoReformatter()

    def needs_conversion(self, frame: av.VideoFrame) -> bool:
        """Whether ``frame`` must be converted or scaled for the encoder."""
        return frame.format.name not in self.accepted or frame.width != self.width or frame.height != self.height

    def convert(self, src: InputFrame) -> tuple[av.VideoFrame, bool]:
        """Return (frame the encoder accepts, whether a conversion ran)."""
        frame = as_video_frame(src)
        if not self.needs_conversion(frame):
            return frame, False
        src_format = frame.format.name
        dst_format = src_format if src_format in self.accepted else self.target
        to_yuv = src_format in _RGB_FORMATS and dst_format not in _RGB_FORMATS
        out = self._reformatter.reformat(
            frame,
            width=self.width,
            height=self.height,
            format=dst_format,
            dst_colorspace=self._matrix if to_yuv else None,
            dst_color_range=ColorRange.MPEG if to_yuv else None,
            interpolation=self._same_size
            if (frame.width, frame.height) == (self.width, self.height)
            else Interpolation.BILINEAR,
            threads=self._threads,
        )
        return out, True
