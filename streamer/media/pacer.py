"""Send pacing: which queued video packets may leave now, at a multiple of the target bitrate.

Job: ``PacingQueue`` holds one sender's RTP packets and releases them at ``PACING_FACTOR`` x the
video target (a leaky bucket, like libwebrtc's pacer), so a frame reaches the path's bottleneck
spread over part of a frame interval instead of as one burst.  aiortc sends each frame's packets
back to back: at 30 fps a frame at the full rate is 33 ms of the path, more than a 30 ms
bottleneck queue holds (docs/abr.md, Limits).  At 2 x the target, a frame leaves over half a
frame interval and the queue it builds at a bottleneck running at the target is half the frame.

Rules:
- the bucket's budget grows at the pacing rate; a packet may leave while the budget is positive,
  and takes its size off (so the budget may go negative, and the next packet waits for it);
- a quiet pacer keeps at most ``BURST_MS`` of budget (the first packets of a frame go at once, no
  more); a pacer with packets waiting keeps up to ``CATCHUP_MS`` (a late event loop catches up
  that far, beyond it the queue grows and the next rule applies);
- no packet should wait more than ``max_delay_ms`` (about one frame interval): when the queue
  would not have left by then at the pacing rate, the rate rises to what empties it by the oldest
  packet's deadline (a keyframe or a large frame is sent faster rather than delayed further);
- priority packets (retransmissions) leave before media packets.

``restamp_abs_send_time`` rewrites the abs-send-time header extension of a serialized packet to
the time it actually leaves (aiortc stamps it when the packet is made; the receiver's delay-based
estimate reads it as the send time).

Concurrency model: none.  Pure bookkeeping, no clock (``now_ms`` comes in), no I/O; the paced
transport (``streamer.media.pacedtransport``) owns one per video sender and drives it from the
event loop.

Invariants: packets leave in push order within each class (priority, media); over any span with
packets waiting, what leaves is at most the budget accrued at the (possibly raised) rate plus
``CATCHUP_MS`` of it plus one packet.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

T = TypeVar("T")

# Pacing rate over the video target.  libwebrtc paces at 2.5 x; lower spreads a frame further
# (less queue at a bottleneck running near the target) but delays its last packet more.  At 2 x a
# 30 fps frame at the target leaves over 17 ms, and builds at most half a frame (17 ms) of queue at
# a bottleneck carrying the target: a 30 ms drop-tail queue no longer overflows on single frames.
PACING_FACTOR: Final = 2.0
BURST_MS: Final = 5.0  # budget an idle pacer keeps: a frame's first packets leave at once
CATCHUP_MS: Final = 10.0  # budget a backlogged pacer may gather while the event loop is late
DEFAULT_MAX_DELAY_MS: Final = 1000.0 / 30  # queue bound at the pacing rate: one 30 fps frame interval
MIN_PACING_BPS: Final = 200_000.0  # never pace slower than this, whatever the target


@dataclass(slots=True)
class PacerCounters:
    """What went through a pacer: packets, their wait (ms) and how often it drained faster."""

    packets: int = 0
    priority_packets: int = 0
    wait_ms_total: float = 0.0
    max_wait_ms: float = 0.0
    drained_fast: int = 0  # releases at a rate raised over the pacing rate (queue over max_delay_ms)


class PacingQueue(Generic[T]):
    """Releases pushed items at ``factor`` x ``target_bps``, priority items first (see module docstring)."""

    def __init__(
        self,
        target_bps: float,
        *,
        factor: float = PACING_FACTOR,
        burst_ms: float = BURST_MS,
        catchup_ms: float = CATCHUP_MS,
        max_delay_ms: float = DEFAULT_MAX_DELAY_MS,
    ) -> None:
        if factor <= 0 or burst_ms <= 0 or catchup_ms < burst_ms or max_delay_ms <= 0:
            raise ValueError("factor, burst_ms and max_delay_ms must be positive, catchup_ms >= burst_ms")
        self.target_bps = float(target_bps)
        self.factor = factor
        self.burst_ms = burst_ms
        self.catchup_ms = catchup_ms
        self.max_delay_ms = max_delay_ms
        self._priority: deque[tuple[T, int, float]] = deque()  # (item, bytes, pushed at ms)
        self._media: deque[tuple[T, int, float]] = deque()
        self._queued_bytes = 0
        self._budget_bits = self.pacing_bps * burst_ms / 1000.0
        self._last_ms: float | None = None
        self.counters = PacerCounters()

    @property
    def pacing_bps(self) -> float:
        """The base pacing rate: ``factor`` x the target, at least ``MIN_PACING_BPS``."""
        return max(MIN_PACING_BPS, self.factor * self.target_bps)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def __len__(self) -> int:
        return len(self._priority) + len(self._media)

    def rate_bps(self, now_ms: float | None = None) -> float:
        """The rate in force at ``now_ms``: the pacing rate, or faster so that the queue has left
        ``max_delay_ms`` after its oldest packet came (at the latest ``now_ms`` + 1 ms)."""
        if not self._queued_bytes:
            return self.pacing_bps
        oldest = min(q[0][2] for q in (self._priority, self._media) if q)
        now = oldest if now_ms is None else now_ms
        left_ms = max(1.0, oldest + self.max_delay_ms - now)
        return max(self.pacing_bps, self._queued_bytes * 8 * 1000.0 / left_ms)

    def queue_ms(self) -> float:
        """How long the queued packets take to leave at the base pacing rate."""
        return self._queued_bytes * 8 * 1000.0 / self.pacing_bps

    def push(self, item: T, size: int, now_ms: float, *, priority: bool = False) -> None:
        """Queue ``item`` (``size`` bytes on the wire) at ``now_ms``."""
        self._advance(now_ms)
        (self._priority if priority else self._media).append((item, size, now_ms))
        self._queued_bytes += size

    def clear(self) -> int:
        """Drop every queued item; how many there were."""
        dropped = len(self)
        self._priority.clear()
        self._media.clear()
        self._queued_bytes = 0
        return dropped

    def pop_due(self, now_ms: float) -> list[T]:
        """The items that may leave at ``now_ms``, in the order to send them."""
        self._advance(now_ms)
        out: list[T] = []
        fast = self.rate_bps(now_ms) > self.pacing_bps
        while self._budget_bits > 0 and (self._priority or self._media):
            is_priority = bool(self._priority)
            item, size, pushed = (self._priority if is_priority else self._media).popleft()
            self._queued_bytes -= size
            self._budget_bits -= size * 8
            wait = now_ms - pushed
            c = self.counters
            c.packets += 1
            c.priority_packets += is_priority
            c.wait_ms_total += wait
            c.max_wait_ms = max(c.max_wait_ms, wait)
            c.drained_fast += fast
            out.append(item)
        return out

    def next_due_ms(self, now_ms: float) -> float | None:
        """When the next item may leave (``now_ms`` if now); None with nothing queued."""
        if not self._priority and not self._media:
            return None
        self._advance(now_ms)
        if self._budget_bits > 0:
            return now_ms
        return now_ms + -self._budget_bits * 1000.0 / self.rate_bps(now_ms)

    def _advance(self, now_ms: float) -> None:
        last, self._last_ms = self._last_ms, now_ms
        if last is None or now_ms <= last:
            return
        rate = self.rate_bps(now_ms)
        cap_ms = self.catchup_ms if (self._priority or self._media) else self.burst_ms
        self._budget_bits = min(self._budget_bits + rate * (now_ms - last) / 1000.0, rate * cap_ms / 1000.0)


def abs_send_time(ntp_time: int) -> int:
    """The 24-bit abs-send-time (6.18 fixed-point seconds) of a 64-bit NTP time."""
    return (ntp_time >> 14) & 0xFFFFFF


def restamp_abs_send_time(data: bytes, ext_id: int, value: int) -> bytes:
    """``data`` (a serialized RTP packet) with its abs-send-time element (id ``ext_id``) set to ``value``.

    Only the RFC 8285 one-byte header form carries it here (aiortc writes that form); a packet
    without the element, or not parseable, comes back unchanged.
    """
    if len(data) < 12 or not data[0] & 0x10:
        return data
    pos = 12 + 4 * (data[0] & 0x0F)
    if len(data) < pos + 4 or data[pos : pos + 2] != b"\xbe\xde":
        return data
    end = pos + 4 + 4 * int.from_bytes(data[pos + 2 : pos + 4], "big")
    if len(data) < end:
        return data
    i = pos + 4
    while i < end:
        head = data[i]
        if head == 0:  # padding
            i += 1
            continue
        element_id, length = head >> 4, (head & 0x0F) + 1
        if element_id == 15:
            return data
        if element_id == ext_id:
            if length != 3 or i + 4 > end:
                return data
            return data[: i + 1] + (value & 0xFFFFFF).to_bytes(3, "big") + data[i + 4 :]
        i += 1 + length
    return data
