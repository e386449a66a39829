"""Per-frame encoder statistics: rolling percentiles and counters (pure).

Job: keep what an encoder did per frame (encode ms, colour-conversion ms,
output bytes, keyframe flag) in a bounded rolling window, keep lifetime
counters (frames, keyframes, bytes, reopens, live bitrate changes), and hand
out immutable snapshots with p50/p95.

Concurrency model: one writer (the thread that encodes) and any number of
readers (e.g. the event loop building a stats report). A ``threading.Lock``
guards the window and counters; a snapshot is a frozen copy, so readers never
see a half-updated state. Recording is O(1); a snapshot sorts the window
(at most ``WINDOW_FRAMES`` values, well under a millisecond).

Invariants: counters only grow; the window holds the most recent
``WINDOW_FRAMES`` frames; times are milliseconds, sizes bytes.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# Rolling window length in frames (5 s at 60 fps).
WINDOW_FRAMES = 300


@dataclass(frozen=True)
class FrameStats:
    """What encoding one frame cost and produced."""

    encode_ms: float  # encoder call, including a reopen it triggered
    convert_ms: float  # colour conversion / scaling; 0.0 when none was needed
    bytes: int  # output bytes for this frame (all packets)
    keyframe: bool
    converted: bool = False  # whether a conversion ran at all

    @property
    def total_ms(self) -> float:
        return self.encode_ms + self.convert_ms


@dataclass(frozen=True)
class StatsSnapshot:
    """Immutable view of an encoder's statistics at one moment."""

    frames: int
    keyframes: int
    bytes: int
    requested_keyframes: int
    reopens: int
    live_bitrate_changes: int
    bitrate_keyframes: int  # keyframes caused by bitrate changes (reopen or forced IDR)
    window_frames: int
    encode_ms_p50: float
    encode_ms_p95: float
    convert_ms_p50: float
    convert_ms_p95: float
    total_ms_p50: float
    total_ms_p95: float
    max_keyframe_bytes: int  # largest keyframe in the window (0 if none)
    max_frame_bytes: int  # largest frame of any kind in the window


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; 0.0 if empty."""
    if not values:
        return 0.0
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


class EncoderStats:
    """Rolling per-frame statistics and lifetime counters of one encoder."""

    def __init__(self, window: int = WINDOW_FRAMES) -> None:
        if window < 1:
            raise ValueError("window must be at least one frame")
        self._lock = threading.Lock()
        self._window: deque[FrameStats] = deque(maxlen=window)
        self._frames = 0
        self._keyframes = 0
        self._bytes = 0
        self._requested_keyframes = 0
        self._reopens = 0
        self._live_changes = 0
        self._bitrate_keyframes = 0
        self._last: FrameStats | None = None

    def record(self, frame: FrameStats) -> None:
        """Account one encoded frame."""
        with self._lock:
            self._window.append(frame)
            self._frames += 1
            self._bytes += frame.bytes
            if frame.keyframe:
                self._keyframes += 1
            self._last = frame

    def note_requested_keyframe(self) -> None:
        """A keyframe request was applied to a frame."""
        with self._lock:
            self._requested_keyframes += 1

    def note_bitrate_change(self, *, reopened: bool, costs_keyframe: bool) -> None:
        """A bitrate change was applied (live, or by reopening the codec)."""
        with self._lock:
            if reopened:
                self._reopens += 1
            else:
                self._live_changes += 1
            if costs_keyframe:
                self._bitrate_keyframes += 1

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def keyframes(self) -> int:
        return self._keyframes

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def last(self) -> FrameStats | None:
        """The most recent frame's statistics."""
        return self._last

    def window(self) -> tuple[FrameStats, ...]:
        """The frames currently in the rolling window, oldest first."""
        with self._lock:
            return tuple(self._window)

    def snapshot(self) -> StatsSnapshot:
        """A consistent, immutable copy with p50/p95 over the rolling window."""
        with self._lock:
            window = tuple(self._window)
            counters = (
                self._frames,
                self._keyframes,
                self._bytes,
                self._requested_keyframes,
                self._reopens,
                self._live_changes,
                self._bitrate_keyframes,
            )
        encode = [f.encode_ms for f in window]
        convert = [f.convert_ms for f in window]
        total = [f.total_ms for f in window]
        key_sizes = [f.bytes for f in window if f.keyframe]
        return StatsSnapshot(
            frames=counters[0],
            keyframes=counters[1],
            bytes=counters[2],
            requested_keyframes=counters[3],
            reopens=counters[4],
            live_bitrate_changes=counters[5],
            bitrate_keyframes=counters[6],
            window_frames=len(window),
            encode_ms_p50=percentile(encode, 50),
            encode_ms_p95=percentile(encode, 95),
            convert_ms_p50=percentile(convert, 50),
            convert_ms_p95=percentile(convert, 95),
            total_ms_p50=percentile(total, 50),
            total_ms_p95=percentile(total, 95),
            max_keyframe_bytes=max(key_sizes, default=0),
            max_frame_bytes=max((f.bytes for f in window), default=0),
        )
