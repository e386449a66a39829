"""Viewer-side stream statistics: what the web overlay shows, from what a client sees.

Job: ``ViewerStats`` is fed each decoded frame (with its stamp when the stream has one), each
received RTP packet, each ``pong`` and each node ``stats`` message, and answers a
``StatsSnapshot`` for an overlay (rates over the last second) or a whole-run ``StatsSummary``
for a load generator.  Definitions:

- fps: frames decoded in the last ``RATE_WINDOW_MS``;
- freeze: a gap over ``FREEZE_MS`` (200 ms) between consecutive decoded frames (as in
  ``bench/bench_abr.py``); ``freeze_ms`` sums those gaps;
- bitrate: RTP bytes (payload + 12-byte header) received in the last second, in bits/s;
- input RTT: ``now - ts`` of each ``pong`` (the data channel's round trip);
- render-to-decode: the decoding machine's wall clock minus the stamp's render time (ms);
  glass-to-glass when the client also shows the frame at once and both clocks agree (same
  machine, or NTP);
- stamp gaps: frame numbers the stamps skipped (frames rendered that this viewer never decoded).

Pure: every method takes the time as an argument (``now_ms`` on a monotonic clock, ``wall_ms``
epoch ms); no I/O, no clock reads.  Not thread-safe: feed it from one event loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from rbclient.stamp import Stamp

FREEZE_MS: Final = 200.0  # a gap between decoded frames longer than this is a freeze
RATE_WINDOW_MS: Final = 1000.0  # fps and bitrate are counted over this much recent time
LATENCY_WINDOW: Final = 30  # the snapshot's render-to-decode figure is the median of this many samples
PLAUSIBLE_LATENCY_MS: Final = (-1000.0, 60_000.0)  # clocks of two machines may disagree: keep these only
RTP_HEADER_BYTES: Final = 12


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """The overlay's figures now (None = not known yet)."""

    width: int | None
    height: int | None
    fps: float | None
    bitrate_bps: float | None
    frames: int
    freezes: int
    freeze_ms: float
    stamp_gaps: int
    input_rtt_ms: float | None
    render_to_decode_ms: float | None  # median of the last LATENCY_WINDOW stamped frames
    node: dict[str, Any]  # the node's latest ``stats`` message (codec, encoder, rtt_ms, target_bps, ...)

    def lines(self) -> list[str]:
        """Text rows for an overlay, the web overlay's wording."""
        n = self.node

        def num(value: Any, digits: int, unit: str) -> str:
            return f"{value:.{digits}f}{unit}" if isinstance(value, int | float) else "-"

        def rate(bps: Any) -> str:
            return f"{bps / 1e6:.2f} Mbit/s" if isinstance(bps, int | float) else "-"

        size = f"{self.width}x{self.height}" if self.width else "-"
        loss = n.get("loss")
        loss_pct = loss * 100 if isinstance(loss, int | float) else None
        return [
            f"Resolution      {size}",
            f"Frame rate      {num(self.fps, 0, ' fps')}",
            f"Bitrate         {rate(self.bitrate_bps)}",
            f"Codec           {n.get('codec') or '-'}",
            f"RTT (node)      {num(n.get('rtt_ms'), 1, ' ms')}",
            f"Input RTT       {num(self.input_rtt_ms, 1, ' ms')}",
            f"Probe RTT       {num(n.get('probe_rtt_ms'), 1, ' ms')}",
            f"Jitter (node)   {num(n.get('jitter_ms'), 1, ' ms')}",
            f"Packet loss     {num(loss_pct, 2, ' %')}",
            f"Freezes >200ms  {self.freezes} ({self.freeze_ms / 1000:.1f} s)",
            f"Frames skipped  {self.stamp_gaps}",
            f"Encoder         {n.get('encoder') or '-'}",
            f"Encode time     {num(n.get('encode_ms'), 2, ' ms')}",
            f"Target bitrate  {rate(n.get('target_bps'))}",
            "Glass to glass  " + ("n/a (no frame stamp)" if self.render_to_decode_ms is None
                                  else num(self.render_to_decode_ms, 0, " ms")),
        ]


@dataclass(frozen=True, slots=True)
class StatsSummary:
    """A whole run's figures, for load generators."""

    duration_s: float  # first to last decoded frame
    frames: int
    fps: float  # frames / duration
    freezes: int
    freeze_ms: float
    longest_gap_ms: float
    stamp_gaps: int
    render_to_decode_p50_ms: float | None
    render_to_decode_p95_ms: float | None
    bitrate_bps: float  # RTP bytes over the run
    input_rtt_p50_ms: float | None


@dataclass
class ViewerStats:
    """Accumulates what a viewer sees; see the module docstring for each figure's definition."""

    frames: int = 0
    freezes: int = 0
    freeze_ms: float = 0.0
    longest_gap_ms: float = 0.0
    stamp_gaps: int = 0
    width: int | None = None
    height: int | None = None
    node: dict[str, Any] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)  # every render-to-decode sample of the run
    input_rtts_ms: list[float] = field(default_factory=list)
    rtp_bytes: int = 0
    _first_ms: float | None = None
    _last_ms: float | None = None
    _last_frame_no: int | None = None
    _recent_frames: deque[float] = field(default_factory=deque)
    _recent_bytes: deque[tuple[float, int]] = field(default_factory=deque)
    _first_packet_ms: float | None = None
    _last_packet_ms: float | None = None

    def on_frame(self, now_ms: float, wall_ms: float, width: int, height: int, stamp: Stamp | None) -> None:
        """A frame was decoded at ``now_ms`` (monotonic) = ``wall_ms`` (epoch)."""
        if self._last_ms is not None:
            gap = now_ms - self._last_ms
            self.longest_gap_ms = max(self.longest_gap_ms, gap)
            if gap > FREEZE_MS:
                self.freezes += 1
                self.freeze_ms += gap
        else:
            self._first_ms = now_ms
        self._last_ms = now_ms
        self.frames += 1
        self.width, self.height = width, height
        self._recent_frames.append(now_ms)
        self._trim(now_ms)
        if stamp is not None:
            if self._last_frame_no is not None and stamp.frame_no > self._last_frame_no + 1:
                self.stamp_gaps += stamp.frame_no - self._last_frame_no - 1
            if self._last_frame_no is None or stamp.frame_no > self._last_frame_no:
                self._last_frame_no = stamp.frame_no
            latency = wall_ms - stamp.ts_ms
            if PLAUSIBLE_LATENCY_MS[0] < latency < PLAUSIBLE_LATENCY_MS[1]:
                self.latencies_ms.append(latency)

    def on_packet(self, now_ms: float, payload_bytes: int) -> None:
        """A video RTP packet arrived."""
        size = payload_bytes + RTP_HEADER_BYTES
        self.rtp_bytes += size
        if self._first_packet_ms is None:
            self._first_packet_ms = now_ms
        self._last_packet_ms = now_ms
        self._recent_bytes.append((now_ms, size))
        self._trim(now_ms)

    def on_pong(self, now_ms: float, ts_ms: float) -> None:
        """A ``pong`` for a ``ping`` sent with ``ts`` = ``ts_ms`` (the same monotonic clock) arrived."""
        if now_ms >= ts_ms:
            self.input_rtts_ms.append(now_ms - ts_ms)

    def on_node_stats(self, message: dict[str, Any]) -> None:
        """The node's ``stats`` message (once a second)."""
        self.node = {k: v for k, v in message.items() if k != "t"}

    def _trim(self, now_ms: float) -> None:
        while self._recent_frames and self._recent_frames[0] <= now_ms - RATE_WINDOW_MS:
            self._recent_frames.popleft()
        while self._recent_bytes and self._recent_bytes[0][0] <= now_ms - RATE_WINDOW_MS:
            self._recent_bytes.popleft()

    def snapshot(self, now_ms: float) -> StatsSnapshot:
        """The figures at ``now_ms`` (rates over the last second)."""
        self._trim(now_ms)
        started = self._first_ms is not None and now_ms - self._first_ms >= RATE_WINDOW_MS
        fps = len(self._recent_frames) * 1000.0 / RATE_WINDOW_MS if started else None
        packets_started = self._first_packet_ms is not None and now_ms - self._first_packet_ms >= RATE_WINDOW_MS
        bitrate = sum(b for _, b in self._recent_bytes) * 8 * 1000.0 / RATE_WINDOW_MS if packets_started else None
        recent = self.latencies_ms[-LATENCY_WINDOW:]
        return StatsSnapshot(
            width=self.width, height=self.height, fps=fps, bitrate_bps=bitrate, frames=self.frames,
            freezes=self.freezes, freeze_ms=self.freeze_ms, stamp_gaps=self.stamp_gaps,
            input_rtt_ms=self.input_rtts_ms[-1] if self.input_rtts_ms else None,
            render_to_decode_ms=percentile(recent, 50), node=dict(self.node))

    def summary(self) -> StatsSummary:
        """The whole run's figures (a warm-up is cut by starting a fresh ``ViewerStats``)."""
        duration_ms = (self._last_ms - self._first_ms) if self._first_ms is not None and self._last_ms else 0.0
        packet_ms = ((self._last_packet_ms or 0.0) - (self._first_packet_ms or 0.0))
        return StatsSummary(
            duration_s=duration_ms / 1000, frames=self.frames,
            fps=(self.frames - 1) * 1000 / duration_ms if duration_ms > 0 else 0.0,
            freezes=self.freezes, freeze_ms=self.freeze_ms, longest_gap_ms=self.longest_gap_ms,
            stamp_gaps=self.stamp_gaps, render_to_decode_p50_ms=percentile(self.latencies_ms, 50),
            render_to_decode_p95_ms=percentile(self.latencies_ms, 95),
            bitrate_bps=self.rtp_bytes * 8 * 1000 / packet_ms if packet_ms > 0 else 0.0,
            input_rtt_p50_ms=percentile(self.input_rtts_ms, 50))
