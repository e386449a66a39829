"""Shared fixtures for the encoder tests: probe results (probed once per
session) and helpers to encode the test pattern and decode the output."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import av
import numpy as np
import pytest

from encoder.backends import Backend, ProbeResult
from encoder.pattern import moving_pattern, psnr
from encoder.probe import probe_all
from encoder.video import EncoderConfig, VideoEncoder

# SVT-AV1 prints an info banner on stderr for every encoder it opens.
os.environ.setdefault("SVT_LOG", "1")

Packets = list[Any]  # list[av.Packet]


@pytest.fixture(scope="session")
def probes() -> dict[str, ProbeResult]:
    """Probe results on this machine, by backend name (cached per process)."""
    return {r.name: r for r in probe_all()}


def decode_frames(backend: Backend, per_frame: Sequence[Packets]) -> list[av.VideoFrame]:
    """Decode encoded packets with the backend's standard decoder (flushes at the end)."""
    decoder = av.CodecContext.create(backend.decoder, "r")
    frames: list[av.VideoFrame] = []
    for packets in per_frame:
        for packet in packets:
            frames.extend(decoder.decode(av.Packet(bytes(packet))))
    frames.extend(decoder.decode(None))
    return frames


def encode_pattern(
    encoder: VideoEncoder,
    count: int,
    *,
    detail: bool = False,
    before: Callable[[int, VideoEncoder], None] | None = None,
) -> tuple[list[np.ndarray], list[Packets]]:
    """Encode ``count`` frames of the moving pattern; ``before(i, enc)`` runs before frame i."""
    cfg = encoder.config
    sources = [moving_pattern(cfg.width, cfg.height, i, detail=detail) for i in range(count)]
    per_frame: list[Packets] = []
    for index, source in enumerate(sources):
        if before is not None:
            before(index, encoder)
        per_frame.append(encoder.encode(source))
    return sources, per_frame


def y_psnr(decoded: av.VideoFrame, source_bgra: np.ndarray, matrix: str) -> float:
    """PSNR of the luma plane against the source converted with the same matrix."""
    src = av.VideoFrame.from_ndarray(np.ascontiguousarray(source_bgra), format="bgra")
    ref = src.reformat(
        format="yuv420p", dst_colorspace="ITU709" if matrix == "bt709" else "ITU601", dst_color_range="MPEG"
    )
    h = decoded.height
    return psnr(decoded.to_ndarray()[:h], ref.to_ndarray()[:h])


def rgb_psnr(decoded: av.VideoFrame, source_bgra: np.ndarray) -> float:
    """PSNR in BGR against the source (checks the colour matrix round trip too)."""
    return psnr(decoded.to_ndarray(format="bgr24"), np.ascontiguousarray(source_bgra[..., :3]))


def keyframes(per_frame: Sequence[Packets]) -> list[int]:
    """Indices of frames whose packets include a keyframe."""
    return [i for i, packets in enumerate(per_frame) if any(p.is_keyframe for p in packets)]


def frame_bytes(per_frame: Sequence[Packets]) -> list[int]:
    return [sum(p.size for p in packets) for packets in per_frame]


def open_encoder(backend: Backend, width: int = 320, height: int = 240, **kw: Any) -> VideoEncoder:
    return VideoEncoder(backend, EncoderConfig(width, height, **kw))


@pytest.fixture
def helpers() -> Any:
    """Helper functions as attributes (tests import nothing from conftest)."""

    class _Helpers:
        decode = staticmethod(decode_frames)
        encode_pattern = staticmethod(encode_pattern)
        y_psnr = staticmethod(y_psnr)
        rgb_psnr = staticmethod(rgb_psnr)
        keyframes = staticmethod(keyframes)
        frame_bytes = staticmethod(frame_bytes)
        open_encoder = staticmethod(open_encoder)

    return _Helpers
