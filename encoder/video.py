"""The video encoder: one PyAV codec context behind a small synchronous API.

Job: open a backend (``encoder.backends``) at a size, frame rate and
bitrate; turn captured frames (``av.VideoFrame`` in any pixel format, or
numpy BGRA/BGR0/BGR24) into ``av.Packet``s that aiortc's ``RTCRtpSender``
can packetize as they are (Annex-B H.264 with SPS/PPS in every keyframe, or
raw VP8 frames; ``pts`` in the 90 kHz RTP clock, ``time_base`` 1/90000);
follow bitrate changes live where the backend can, else reopen it; force a
keyframe on request; measure every frame (``stats``).

Concurrency model: synchronous and CPU-bound -- ``encode`` blocks for
milliseconds, so callers run it in an executor or a dedicated thread, never
on the event loop, and from one thread at a time (a second concurrent call
raises ``RuntimeError``). ``set_bitrate`` and ``request_keyframe`` are
thread-safe and cheap: they record intent under a lock, and the next
``encode`` applies it on the encoding thread, between frames. ``close`` waits
for an in-flight ``encode``.

Invariants:
- one packet list per frame, no frames held back (no B-frames/lookahead);
- packet pts strictly increase; time_base is ``RTP_VIDEO_TIME_BASE``;
- the first packet of the stream and of every reopen is a keyframe; the
  frame after ``request_keyframe`` is a keyframe;
- a bitrate change that costs a keyframe is counted
  (``stats.snapshot().bitrate_keyframes``) and explained
  (``last_bitrate_decision.reason``);
- conversion runs only when the backend needs another format/size and is
  timed apart from encoding (``convert_ms`` vs ``encode_ms``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

import av
import av.logging
from av.video.codeccontext import VideoCodecContext
from av.video.frame import PictureType

from encoder.backends import Backend, auto_threads, codec_options
from encoder.convert import FrameConverter, InputFrame
from encoder.ratecontrol import (
    Action,
    BitrateDecision,
    RateControl,
    open_rate_control,
    plan_bitrate_change,
)
from encoder.sched import no_realtime
from encoder.stats import EncoderStats, FrameStats

log = logging.getLogger(__name__)

# Packet timestamps are in the RTP video clock: 90 kHz.
RTP_VIDEO_CLOCK_HZ = 90_000
RTP_VIDEO_TIME_BASE = Fraction(1, RTP_VIDEO_CLOCK_HZ)

DEFAULT_FPS = 30.0
DEFAULT_BITRATE_BPS = 4_000_000


class EncoderOpenError(RuntimeError):
    """The codec could not be opened as configured (missing hardware, bad option).

    ``reason`` is FFmpeg's own error line when it logged one (e.g. "Cannot
    load libcuda.so.1"), else the exception text.
    """

    code = "encoder_open_failed"

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"{backend}: {reason}")


@contextmanager
def capture_ffmpeg_errors() -> Iterator[list[tuple[int, str, str]]]:
    """Collect FFmpeg log lines emitted on this thread.

    PyAV drops FFmpeg's log by default, and with it the only useful text of
    many errors; while capturing, its level is raised to ERROR if it was off
    (process-wide, restored afterwards; a concurrent capture in another thread
    may then miss lines and fall back to the exception text).
    """
    previous = av.logging.get_level()
    if previous is None:
        av.logging.set_level(av.logging.ERROR)
    try:
        with av.logging.Capture(local=True) as logs:
            yield logs
    finally:
        if previous is None:
            av.logging.set_level(None)


def ffmpeg_error_text(logs: list[tuple[int, str, str]], fallback: str) -> str:
    """The distinct ERROR-or-worse lines of ``logs`` joined, or ``fallback``."""
    lines: list[str] = []
    for level, _name, message in logs:
        text = message.strip()
        if level <= av.logging.ERROR and text and text not in lines:
            lines.append(text)
    return "; ".join(lines) if lines else fallback


@dataclass(frozen=True)
class EncoderConfig:
    """How to open an encoder. Width and height are the encoded size; frames
    of another size are scaled in the (single) conversion step."""

    width: int
    height: int
    fps: float = DEFAULT_FPS
    bitrate_bps: int = DEFAULT_BITRATE_BPS  # target average bitrate, bits per second
    threads: int | None = None  # encoder threads; None -> 1 up to 720p, 2 above
    source_format: str = "bgra"  # pixel format capture delivers; NVENC takes it as is if it can
    fast_convert: bool = False  # point-sampled chroma in RGB->YUV: ~25% cheaper, slightly softer colour
    gpu: int | None = None  # GPU (CUDA ordinal) a hardware encoder opens on; software encoders ignore it

    def __post_init__(self) -> None:
        if self.width < 16 or self.height < 16 or self.width % 2 or self.height % 2:
            raise ValueError(f"size must be even and at least 16x16, got {self.width}x{self.height}")
        if self.fps <= 0:
            raise ValueError(f"fps must be positive, got {self.fps}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


class VideoEncoder:
    """A low-latency encoder for one video stream (see module docstring)."""

    def __init__(self, backend: Backend, config: EncoderConfig) -> None:
        self._backend = backend
        self._config = config
        self._threads = config.threads or auto_threads(config.width, config.height)
        self._pix_fmt = config.source_format if config.source_format in backend.pix_fmts else backend.pix_fmts[0]
        self._converter = FrameConverter(
            config.width, config.height, (self._pix_fmt,), backend.yuv_matrix, self._threads, config.fast_convert
        )
        self._rate = open_rate_control(config.bitrate_bps, config.fps, backend.headroom, backend.rate_factor)
        self._lock = threading.Lock()  # guards _pending_bitrate and _keyframe_requested
        self._encode_guard = threading.Lock()  # one encode/close at a time
        self._pending_bitrate: int | None = None
        self._keyframe_requested = False
        self._last_pts = -1
        self._frame_index = 0
        self.stats = EncoderStats()
        self.last_bitrate_decision: BitrateDecision | None = None
        self._ctx: VideoCodecContext | None = self._open(self._rate)

    # -- properties ---------------------------------------------------------

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def config(self) -> EncoderConfig:
        """The configuration the encoder was created with (bitrate: initial)."""
        return self._config

    @property
    def rate(self) -> RateControl:
        """The current rate-control window (current bitrate, open maxrate/bufsize)."""
        return self._rate

    @property
    def bitrate_bps(self) -> int:
        """The bitrate currently applied to the codec, bits per second."""
        return self._rate.bitrate_bps

    @property
    def keyframe_cap_bytes(self) -> int:
        """Keyframe size cap at the current bitrate, bytes (see ratecontrol)."""
        return self._rate.keyframe_cap_bytes

    @property
    def pix_fmt(self) -> str:
        """The pixel format the codec was opened with."""
        return self._pix_fmt

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __repr__(self) -> str:
        cfg = self._config
        return (
            f"VideoEncoder({self._backend.name}, {cfg.width}x{cfg.height}@{cfg.fps:g}, "
            f"{self._rate.bitrate_bps} bps, {self._pix_fmt}, threads={self._threads})"
        )

    # -- control (thread-safe, applied by the next encode) -------------------

    def set_bitrate(self, bitrate_bps: int) -> BitrateDecision:
        """Ask for a new target bitrate (bits per second).

        Applied by the next ``encode``, re-planned against the state at that
        moment. Returns the decision as it stands now, for logging; the
        applied one ends up in ``last_bitrate_decision``.
        """
        with self._lock:
            self._pending_bitrate = int(bitrate_bps)
            rate = self._rate
        return plan_bitrate_change(rate, int(bitrate_bps), self._backend.bitrate_change)

    def request_keyframe(self) -> None:
        """Make the next encoded frame a keyframe (e.g. on RTCP PLI/FIR)."""
        with self._lock:
            self._keyframe_requested = True

    # -- encoding (blocking: run in an executor) -------------------------------

    def encode(self, frame: InputFrame, pts: int | None = None) -> list[av.Packet[Any]]:
        """Encode one frame and return its packets (normally exactly one).

        ``frame``: ``av.VideoFrame`` (any pixel format) or numpy HxWx4
        BGRA/BGR0 / HxWx3 BGR24. ``pts``: presentation time in 90 kHz units;
        default: the frame's own pts/time_base, else frame index / fps.
        A frame passed through without conversion gets its ``pts``,
        ``time_base`` and ``pict_type`` overwritten.
        """
        if not self._encode_guard.acquire(blocking=False):
            raise RuntimeError("VideoEncoder.encode called concurrently; use one thread per encoder")
        try:
            if self._ctx is None:
                raise RuntimeError("encoder is closed")
            t0 = time.perf_counter()
            video, converted = self._converter.convert(frame)
            t1 = time.perf_counter()
            self._apply_pending_bitrate()
            with self._lock:
                force_key = self._keyframe_requested
                self._keyframe_requested = False
            video.pict_type = PictureType.I if force_key else PictureType.NONE
            video.pts = self._next_pts(frame, pts)
            video.time_base = RTP_VIDEO_TIME_BASE
            assert self._ctx is not None  # a reopen replaces it, never clears it
            packets = self._ctx.encode(video)
            t2 = time.perf_counter()
        finally:
            self._encode_guard.release()

        size = 0
        keyframe = False
        for packet in packets:
            packet.time_base = RTP_VIDEO_TIME_BASE
            size += packet.size
            keyframe = keyframe or packet.is_keyframe
        if force_key:
            self.stats.note_requested_keyframe()
        self.stats.record(
            FrameStats(
                encode_ms=(t2 - t1) * 1000.0,
                convert_ms=(t1 - t0) * 1000.0,
                bytes=size,
                keyframe=keyframe,
                converted=converted,
            )
        )
        return packets

    def close(self) -> None:
        """Flush and release the codec. Idempotent; waits for an in-flight encode."""
        with self._encode_guard:
            ctx, self._ctx = self._ctx, None
        if ctx is not None:
            self._flush(ctx)

    def __enter__(self) -> VideoEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------

    def _open(self, rate: RateControl) -> VideoCodecContext:
        cfg = self._config
        options = codec_options(self._backend, rate, cfg.width, cfg.height, self._threads, cfg.gpu)
        ctx = cast(VideoCodecContext, av.CodecContext.create(self._backend.codec, "w"))
        ctx.width = cfg.width
        ctx.height = cfg.height
        ctx.pix_fmt = self._pix_fmt
        ctx.time_base = RTP_VIDEO_TIME_BASE
        ctx.framerate = Fraction(cfg.fps).limit_denominator(1001)
        ctx.bit_rate = rate.open_bitrate_bps
        ctx.options = options
        with capture_ffmpeg_errors() as logs, no_realtime(self._backend.name):
            try:
                ctx.open()
            except av.FFmpegError as exc:
                raise EncoderOpenError(self._backend.name, ffmpeg_error_text(logs, str(exc))) from exc
        leftover = dict(ctx.options or {})
        if leftover:
            # FFmpeg returns the options no component consumed: a typo in our data.
            raise EncoderOpenError(self._backend.name, f"options not recognised: {sorted(leftover)}")
        # x264 is opened at its ceiling and steered down from the first frame on (ratecontrol).
        ctx.bit_rate = rate.codec_bitrate_bps
        return ctx

    def _apply_pending_bitrate(self) -> None:
        with self._lock:
            target, self._pending_bitrate = self._pending_bitrate, None
        if target is None:
            return
        decision = plan_bitrate_change(self._rate, target, self._backend.bitrate_change)
        self.last_bitrate_decision = decision
        if decision.action in (Action.NONE, Action.HOLD):
            log.debug("%s: %s", self._backend.name, decision.reason)
            return
        if decision.action is Action.REOPEN:
            new_ctx = self._open(decision.rate)
            old, self._ctx = self._ctx, new_ctx
            if old is not None:
                self._flush(old)
        else:
            assert self._ctx is not None
            self._ctx.bit_rate = decision.rate.codec_bitrate_bps
        with self._lock:
            self._rate = decision.rate
        self.stats.note_bitrate_change(
            reopened=decision.action is Action.REOPEN, costs_keyframe=decision.costs_keyframe
        )
        # a live change can come every control step (100 ms): debug; a reopen (new keyframe) is worth a line
        log.log(logging.INFO if decision.action is Action.REOPEN else logging.DEBUG, "%s: %s", self._backend.name,
                decision.reason)

    def _next_pts(self, src: InputFrame, pts: int | None) -> int:
        if pts is None and isinstance(src, av.VideoFrame) and src.pts is not None and src.time_base:
            pts = round(src.pts * src.time_base * RTP_VIDEO_CLOCK_HZ)
        if pts is None:
            pts = round(self._frame_index * RTP_VIDEO_CLOCK_HZ / self._config.fps)
        if pts <= self._last_pts:
            pts = self._last_pts + 1  # encoders and RTP need strictly increasing timestamps
        self._last_pts = pts
        self._frame_index += 1
        return pts

    def _flush(self, ctx: VideoCodecContext) -> None:
        """Send end-of-stream (SVT-AV1 and NVENC want it before teardown)."""
        try:
            ctx.encode(None)
        except (av.FFmpegError, ValueError) as exc:
            log.debug("%s: flush on close: %s", self._backend.name, exc)
