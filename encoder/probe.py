"""Probe: which encoder backends really work on this machine, and why not.

Job: for each backend, check its options against what this FFmpeg build
declares, open it through the same ``VideoEncoder`` the streamer uses, encode
a few frames of the test pattern and verify the low-latency invariants:
one packet per frame (nothing held back), the first packet a keyframe, no
unrequested keyframes, a requested keyframe honoured, SPS/PPS in every H.264
keyframe with a constrained-baseline profile, and the output decodable by a
standard decoder. A failure records FFmpeg's own error line (e.g. "Cannot load
libcuda.so.1") as the reason.

Concurrency model: probing is blocking and CPU/driver-bound (tens of ms per
backend). ``probe_all`` runs in the caller's thread; ``probe_all_async`` runs
it in an executor so the event loop never blocks. Results are cached per
process in one ``ProbeCache`` object (keyed by backends and probe size); the
cache's lock makes concurrent first calls probe once (single flight).
While probing, PyAV's log level is raised to ERROR if it was off, so the
FFmpeg error text can be captured; it is restored afterwards.

Invariant: a ``ProbeResult`` with ``ok=True`` means that backend, with
exactly the options it will be opened with, produced a decodable low-latency
stream on this machine at probe time.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any, cast

import av
from av.video.codeccontext import VideoCodecContext

from encoder.backends import BACKENDS, WEBRTC_H264, Backend, ProbeResult, codec_options
from encoder.pattern import moving_pattern
from encoder.ratecontrol import open_rate_control
from encoder.video import (
    EncoderConfig,
    EncoderOpenError,
    VideoEncoder,
    capture_ffmpeg_errors,
    ffmpeg_error_text,
)

# Probe geometry and rate: small so a probe costs milliseconds, even and
# above every encoder's minimum size.
PROBE_WIDTH = 320
PROBE_HEIGHT = 240
PROBE_FPS = 30.0
PROBE_BITRATE_BPS = 1_000_000
PROBE_FRAMES = 4  # frame 0 must be a keyframe, 2 is requested as one, 1 and 3 must not be
PROBE_KEYFRAME_REQUEST_AT = 2

_NAL_SPS = 7
_NAL_PPS = 8
_PROFILE_BASELINE = 66
_CONSTRAINT_SET1 = 0x40

ProbeKey = tuple[tuple[Backend, ...], int, int, int | None]


class ProbeCache:
    """Per-process cache of probe results (one instance lives in this module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[ProbeKey, tuple[ProbeResult, ...]] = {}

    def get_or_probe(
        self, key: ProbeKey, probe: Callable[[], tuple[ProbeResult, ...]], refresh: bool = False
    ) -> tuple[ProbeResult, ...]:
        with self._lock:  # held while probing: concurrent first callers wait, then share
            if refresh:
                self._results.pop(key, None)
            if key not in self._results:
                self._results[key] = probe()
            return self._results[key]

    def clear(self) -> None:
        with self._lock:
            self._results.clear()


_CACHE = ProbeCache()


def clear_probe_cache() -> None:
    """Forget cached probe results (e.g. after a driver change, or in tests)."""
    _CACHE.clear()


def probe_all(
    backends: tuple[Backend, ...] = BACKENDS,
    *,
    width: int = PROBE_WIDTH,
    height: int = PROBE_HEIGHT,
    refresh: bool = False,
    gpu: int | None = None,
) -> tuple[ProbeResult, ...]:
    """Probe every backend (cached per process and GPU). Blocking: not on the event loop.

    ``gpu`` (CUDA ordinal) opens hardware backends on that GPU: NVENC working on GPU 0 says
    nothing about GPU 3 (another model, or its encoder sessions used up)."""
    return _CACHE.get_or_probe(
        (tuple(backends), width, height, gpu),
        lambda: tuple(probe_backend(b, width=width, height=height, gpu=gpu) for b in backends),
        refresh=refresh,
    )


async def probe_all_async(
    backends: tuple[Backend, ...] = BACKENDS,
    *,
    width: int = PROBE_WIDTH,
    height: int = PROBE_HEIGHT,
    refresh: bool = False,
    executor: Executor | None = None,
    gpu: int | None = None,
) -> tuple[ProbeResult, ...]:
    """``probe_all`` in an executor (default: the loop's thread pool)."""
    loop = asyncio.get_running_loop()
    call = functools.partial(probe_all, tuple(backends), width=width, height=height, refresh=refresh, gpu=gpu)
    return await loop.run_in_executor(executor, call)


def check_options(backend: Backend, width: int = PROBE_WIDTH, height: int = PROBE_HEIGHT) -> list[str]:
    """Options of ``backend`` this FFmpeg build does not know, or bad choices.

    Works without the hardware: it reads the codec's declared AVOptions.
    """
    if backend.codec not in av.codecs_available:
        return [f"FFmpeg build has no {backend.codec} encoder"]
    declared = av.CodecContext.create(backend.codec, "w").supported_options
    known = {o.name: o for o in (*declared.generic, *declared.private)}
    rate = open_rate_control(PROBE_BITRATE_BPS, PROBE_FPS, backend.headroom, backend.rate_factor)
    problems = []
    # gpu=0: a hardware backend's device option is checked too
    for name, value in codec_options(backend, rate, width, height, threads=1, gpu=0).items():
        option = known.get(name)
        if option is None:
            problems.append(f"unknown option {name!r}")
            continue
        choices = {c.name for c in option.choices}
        numeric = value.lstrip("-").replace(".", "", 1).isdigit()
        if choices and not numeric and value not in choices:
            problems.append(f"{name}={value!r} not in {sorted(choices)}")
    return problems


def h264_nal_units(data: bytes) -> Iterator[bytes]:
    """NAL units of an Annex-B H.264 byte stream (start codes removed)."""
    i = data.find(b"\x00\x00\x01")
    while i != -1:
        start = i + 3
        i = data.find(b"\x00\x00\x01", start)
        if i == -1:
            yield data[start:]
        else:
            # a 4-byte start code (00 00 00 01) lends its first zero to this NAL's end
            yield data[start : i - 1 if data[i - 1] == 0 else i]


def h264_nal_types(data: bytes) -> list[int]:
    """nal_unit_type of each NAL unit in an Annex-B H.264 packet."""
    return [nal[0] & 0x1F for nal in h264_nal_units(data) if nal]


def h264_profile_level_id(data: bytes) -> str | None:
    """profile-level-id (6 hex digits, as in SDP) of the first SPS, if any."""
    for nal in h264_nal_units(data):
        if nal and nal[0] & 0x1F == _NAL_SPS and len(nal) >= 4:
            return nal[1:4].hex()
    return None


def _check_stream(backend: Backend, per_frame: list[list[av.Packet[Any]]]) -> str | None:
    """The first violated invariant, or None."""
    for index, packets in enumerate(per_frame):
        if not packets:
            return f"no packet for frame {index}: encoder holds frames back (latency)"
    keys = [any(p.is_keyframe for p in packets) for packets in per_frame]
    if not keys[0]:
        return "first packet is not a keyframe"
    for index, key in enumerate(keys[1:], start=1):
        if key != (index == PROBE_KEYFRAME_REQUEST_AT):
            wanted = "requested keyframe missing" if not key else "unrequested keyframe"
            return f"{wanted} at frame {index}"
    if backend.webrtc_codec == WEBRTC_H264:
        for index, (packets, key) in enumerate(zip(per_frame, keys, strict=True)):
            if not key:
                continue
            types = h264_nal_types(b"".join(bytes(p) for p in packets))
            if _NAL_SPS not in types or _NAL_PPS not in types:
                return f"keyframe {index} lacks SPS/PPS (NAL types {types})"
        sps = h264_profile_level_id(bytes(per_frame[0][0]))
        if sps is None or int(sps[0:2], 16) != _PROFILE_BASELINE or not int(sps[2:4], 16) & _CONSTRAINT_SET1:
            return f"H.264 profile {sps} is not constrained baseline"
    return None


def _decoded_frames(backend: Backend, per_frame: list[list[av.Packet[Any]]], width: int, height: int) -> str | None:
    decoder = cast(VideoCodecContext, av.CodecContext.create(backend.decoder, "r"))
    frames = []
    for packets in per_frame:
        for packet in packets:
            frames.extend(decoder.decode(av.Packet(bytes(packet))))
    frames.extend(decoder.decode(None))
    if len(frames) != len(per_frame):
        return f"{backend.decoder} decoded {len(frames)} of {len(per_frame)} frames"
    bad = [f for f in frames if (f.width, f.height) != (width, height)]
    if bad:
        return f"decoded size {bad[0].width}x{bad[0].height}, expected {width}x{height}"
    return None


def probe_backend(
    backend: Backend, *, width: int = PROBE_WIDTH, height: int = PROBE_HEIGHT, gpu: int | None = None
) -> ProbeResult:
    """Open ``backend`` (on GPU ``gpu`` where it is a hardware encoder) and encode ``PROBE_FRAMES``
    frames. Blocking."""
    start = time.perf_counter()

    def result(ok: bool, reason: str, profile: str | None = None) -> ProbeResult:
        return ProbeResult(backend.name, ok, reason, (time.perf_counter() - start) * 1000.0, profile)

    problems = check_options(backend, width, height)
    if problems:
        return result(False, "; ".join(problems))
    config = EncoderConfig(width, height, PROBE_FPS, PROBE_BITRATE_BPS, threads=1, gpu=gpu)
    per_frame: list[list[av.Packet[Any]]] = []
    with capture_ffmpeg_errors() as logs:
        try:
            encoder = VideoEncoder(backend, config)
        except EncoderOpenError as exc:
            return result(False, exc.reason)
        try:
            for index in range(PROBE_FRAMES):
                if index == PROBE_KEYFRAME_REQUEST_AT:
                    encoder.request_keyframe()
                per_frame.append(encoder.encode(moving_pattern(width, height, index)))
        except (av.FFmpegError, ValueError, RuntimeError) as exc:
            return result(False, f"encode failed: {ffmpeg_error_text(logs, str(exc))}")
        finally:
            encoder.close()
        try:
            failure = _check_stream(backend, per_frame) or _decoded_frames(backend, per_frame, width, height)
        except (av.FFmpegError, ValueError) as exc:
            failure = f"decode failed: {ffmpeg_error_text(logs, str(exc))}"
    if failure:
        return result(False, failure)
    profile = h264_profile_level_id(bytes(per_frame[0][0])) if backend.webrtc_codec == WEBRTC_H264 else None
    key_bytes = sum(p.size for p in per_frame[0])
    summary = f"{PROBE_FRAMES} frames {width}x{height}, keyframe {key_bytes} B, decodes with {backend.decoder}"
    return result(True, summary + (f", profile {profile}" if profile else ""), profile)
