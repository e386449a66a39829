"""Delay probes on the viewer's probe channel: round-trip times and the viewer's receive rate.

Job: ``ProbeTracker`` numbers the node's ``probe`` messages, matches the viewer's
``pa`` answers to them, and sums up each control period: the lowest round-trip time
among the probes answered in it, and the rate at which the viewer received video RTP
packets (from the packet counts the answers carry, on the viewer's own clock).  RTCP
receiver reports arrive about once a second; a probe every ``PROBE_INTERVAL_MS``
travels the same downlink queue as the video, so a queue building up shows in its
round trip within one probe interval, and the receive rate says what the path carries
now (the level to cut to).  Where the viewer reports the frames it decoded, the tracker
also sees a picture frozen while packets keep arriving (a frame that can never complete:
its lost packet was not repaired), so the node can send a keyframe at once instead of
waiting for the viewer's own keyframe request (Chromium's comes after 3 s without a
decodable frame, measured on the ABR lab).

The round trip is the path's, not the node's: it runs from when the probe actually left (the
peer reports it with ``sent``: aiortc's SCTP transport queues a message and sends it when the
event loop gets to it) to when the answer reached the node, less how late the node's event loop
was when it handled the answer (``answer(..., late_ms)``).  On a loaded 2-core node (720p60 game,
three busy processes) the time from a probe's creation to its sending reached p95 41 / max 76 ms
and the loop ran up to 110 ms late, against 0.6 ms of path: read as a queue, it cut the bitrate of
an idle loopback link from 25 to 4 Mbps.

Concurrency model: none.  Pure bookkeeping: no clock (every call takes ``now_ms``, the
node's monotonic milliseconds), no I/O; the peer (``streamer.media.peer.ViewerPeer``) sends
and receives the messages and owns one tracker per connection.

Invariants:
  - an answer counts once, and only for a probe this tracker sent and has not forgotten
    (``PROBE_FORGET_MS``); unknown, repeated or late answers are ignored;
  - receive-rate samples keep the viewer's clock strictly increasing and its packet count
    non-decreasing (a count that goes back -- a new stream -- starts the samples over);
  - ``take`` reports a receive rate only over at least ``RECV_RATE_MIN_SPAN_MS`` of the
    viewer's clock, from a sample that arrived within ``RECV_RATE_WINDOW_MS``;
  - ``take`` reports a stall only while at least ``STALL_MIN_PACKETS`` packets arrived after
    the viewer's last decoded frame (an idle stream is no stall);
  - ``freezes`` counts the viewer's freezes (``streamer.media.freezes``): its decoded-frame count
    standing still for ``freeze_threshold_ms`` of its own clock, from its first decoded frame on
    (the wait for the first frame is ``first_decoded_ms``, not a freeze).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from broker.protocol import NodeEventType
from streamer.desktop.inputs import PING_MAX_ID, ProbeAck
from streamer.media.freezes import FREEZE_MIN_MS, FreezeCounter

# One probe each 25 ms: four per 100 ms control period, whose lowest round trip is the sample
# (streamer.abr.bitrate calibrates its noise threshold on the lowest of 4 on a jittery path).
PROBE_INTERVAL_MS: Final = 25
PROBE_FORGET_MS: Final = 2_000  # an unanswered probe is forgotten after this (lost: unreliable channel)
# Receive rate over the newest 300 ms of the viewer's clock (short: after a capacity drop the
# rate to cut to is the new one, not an average reaching back before it), and over no less
# than 150 ms of it (a few frames).
RECV_RATE_WINDOW_MS: Final = 300
RECV_RATE_MIN_SPAN_MS: Final = 150
# The event loop's lateness: a timer ticks every LOOP_TICK_MS and notes how late it woke; an answer
# handled at t is taken to have waited as long as the latest tick within LOOP_LATE_WINDOW_MS of t was
# late (a loop that was blocked, or got no CPU, delayed both alike).
LOOP_TICK_MS: Final = 10
LOOP_LATE_WINDOW_MS: Final = 2 * LOOP_TICK_MS
# A tick up to this late is the timer's own slack (epoll waits in whole ms), not lateness: an idle
# loop's ticks ran 0.1-1 ms late, and taking that off the round trip read a 0.6 ms path as 0.
LOOP_SLACK_MS: Final = 2.0
# A stall: this many packets arrived since the viewer's frame count last moved (a frame is
# 3-40 packets at 0.3-8 Mbps, 30 fps; a keyframe up to ~60, so it takes the time as well).
STALL_MIN_PACKETS: Final = 20


@dataclass(frozen=True, slots=True)
class RecvWindow:
    """The packets behind a receive rate: how many the viewer got over ``span_ms`` of its clock, and when
    (node ms) the answers carrying the window's first and last count arrived."""

    packets: int
    span_ms: float
    first_arrived_ms: float
    last_arrived_ms: float


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One control period's probe figures (None: nothing to say).

    rtt_ms: the lowest round-trip time among the probes answered since the previous
    ``take`` (the lowest, so that one probe delayed by jitter does not read as a queue).
    answered: how many were answered.  recv_pps: video RTP packets per second the viewer
    received over its newest ``RECV_RATE_WINDOW_MS``.  stalled_ms: how long (viewer's clock)
    its decoded-frame count has not moved while packets kept arriving (None: it is moving,
    no packets came, or the viewer does not report frames).
    """

    rtt_ms: float | None
    answered: int
    recv_pps: float | None
    stalled_ms: float | None = None
    window: RecvWindow | None = None  # the receive rate's packets and span (with recv_pps)


class ProbeTracker:
    """Numbers probes, matches answers, and reports each period's RTT and receive rate."""

    def __init__(self) -> None:
        self._next_id = 1
        self._pending: dict[int, float] = {}  # probe id -> node time sent (made, until ``sent`` says when it left)
        self._rtts: list[float] = []  # answered since the previous take
        self._rx: deque[tuple[float, int, float]] = deque()  # (viewer ms, packets received, node ms arrived)
        self._rx_arrived_ms: float | None = None  # node time the newest rx sample arrived
        # (viewer ms, packets received) when the decoded-frame count last moved, and that count
        self._decoded_at: tuple[float, int] | None = None
        self._decoded: int | None = None
        self._newest: tuple[float, int] | None = None  # newest (viewer ms, packets) with a frame count
        self._viewer_freezes = FreezeCounter()  # on the viewer's clock, from its first decoded frame
        self.freeze_threshold_ms = FREEZE_MIN_MS  # the peer sets it from the frame rate
        self.first_decoded_ms: float | None = None  # node ms of the first answer with a decoded frame

    def probe(self, now_ms: float) -> dict[str, Any]:
        """The next probe message to send at ``now_ms``; forgets probes too old to count."""
        for probe_id in [i for i, sent in self._pending.items() if sent < now_ms - PROBE_FORGET_MS]:
            del self._pending[probe_id]
        probe_id = self._next_id
        self._next_id = self._next_id % PING_MAX_ID + 1
        self._pending[probe_id] = now_ms
        return {"t": NodeEventType.PROBE.value, "id": probe_id}

    def sent(self, probe_id: int, now_ms: float) -> None:
        """The probe actually left at ``now_ms`` (its round trip starts here); unknown ids are ignored."""
        if probe_id in self._pending:
            self._pending[probe_id] = max(self._pending[probe_id], now_ms)

    def answer(self, ack: ProbeAck, now_ms: float, late_ms: float = 0.0) -> bool:
        """Record the viewer's answer, handled at ``now_ms`` by a loop running ``late_ms`` late.

        The round trip is ``now_ms - late_ms`` less the probe's send time (never negative).
        False when the answer matches no pending probe.
        """
        sent = self._pending.pop(ack.id, None)
        if sent is None:
            return False
        self._rtts.append(max(0.0, now_ms - max(0.0, late_ms) - sent))
        went_back = bool(self._rx) and ack.rx_packets < self._rx[-1][1]
        if went_back:
            self._rx.clear()  # the count went back: a new stream
        if not self._rx or ack.rx_ms > self._rx[-1][0]:
            self._rx.append((ack.rx_ms, ack.rx_packets, now_ms))
            self._rx_arrived_ms = now_ms
            while self._rx[0][0] < ack.rx_ms - RECV_RATE_WINDOW_MS:
                self._rx.popleft()
            self._count_frames(ack, went_back, now_ms)
        return True

    @property
    def freezes(self) -> int:
        """Freezes the viewer's decoded-frame count showed so far (0 without ``fd`` in its answers)."""
        return self._viewer_freezes.freezes

    def _count_frames(self, ack: ProbeAck, went_back: bool, now_ms: float) -> None:
        if ack.frames_decoded is None:
            return
        moved = self._decoded is None or went_back or ack.frames_decoded != self._decoded
        if moved:
            self._decoded = ack.frames_decoded
            self._decoded_at = (ack.rx_ms, ack.rx_packets)
        self._newest = (ack.rx_ms, ack.rx_packets)
        if ack.frames_decoded <= 0:
            return  # nothing decoded yet: waiting for the first frame is no freeze
        if self.first_decoded_ms is None:
            self.first_decoded_ms = now_ms
        if went_back:
            self._viewer_freezes.reset()
        if moved:
            self._viewer_freezes.frame(ack.rx_ms, self.freeze_threshold_ms)
        else:
            self._viewer_freezes.idle(ack.rx_ms, self.freeze_threshold_ms)

    def take(self, now_ms: float) -> ProbeSample:
        """This period's figures; starts the next period."""
        rtts, self._rtts = self._rtts, []
        recv_pps: float | None = None
        fresh = self._rx_arrived_ms is not None and now_ms - self._rx_arrived_ms <= RECV_RATE_WINDOW_MS
        window: RecvWindow | None = None
        if fresh and len(self._rx) >= 2:
            (t0, n0, a0), (t1, n1, a1) = self._rx[0], self._rx[-1]
            if t1 - t0 >= RECV_RATE_MIN_SPAN_MS:
                recv_pps = (n1 - n0) * 1000.0 / (t1 - t0)
                window = RecvWindow(n1 - n0, t1 - t0, a0, a1)
        stalled_ms: float | None = None
        if fresh and self._decoded_at is not None and self._newest is not None:
            (t0, n0), (t1, n1) = self._decoded_at, self._newest
            if n1 - n0 >= STALL_MIN_PACKETS:
                stalled_ms = t1 - t0
        return ProbeSample(min(rtts) if rtts else None, len(rtts), recv_pps, stalled_ms, window)


class LoopLateness:
    """How late the node's event loop runs: ticks' wake-up delays, for ``ProbeTracker.answer``'s ``late_ms``."""

    def __init__(self) -> None:
        self._ticks: deque[tuple[float, float]] = deque()  # (woke at, ms late), oldest first

    def tick(self, due_ms: float, woke_ms: float) -> None:
        """A timer due at ``due_ms`` ran at ``woke_ms`` (lateness beyond ``LOOP_SLACK_MS`` counts)."""
        self._ticks.append((woke_ms, max(0.0, woke_ms - due_ms - LOOP_SLACK_MS)))
        while self._ticks and self._ticks[0][0] < woke_ms - LOOP_LATE_WINDOW_MS:
            self._ticks.popleft()

    def late_ms(self, now_ms: float) -> float:
        """The largest delay of the ticks that woke within ``LOOP_LATE_WINDOW_MS`` before ``now_ms`` (0: none)."""
        return max((late for woke, late in self._ticks if woke >= now_ms - LOOP_LATE_WINDOW_MS), default=0.0)


class SendLog:
    """Cumulative packets sent, sampled at node times: how many went out between two times (interpolated).

    The receive rate's counterpart: the packets a viewer counted over its window left the node one
    round trip (plus the wait for the next probe) before the answers carrying the counts arrived.
    """

    def __init__(self, keep_ms: float = 2_000.0) -> None:
        self._keep_ms = keep_ms
        self._samples: deque[tuple[float, int]] = deque()  # (node ms, cumulative packets), oldest first

    def add(self, now_ms: float, packets: int) -> None:
        """The cumulative count at ``now_ms`` (times increase; a count that goes back starts over)."""
        if self._samples and (now_ms <= self._samples[-1][0] or packets < self._samples[-1][1]):
            if packets < self._samples[-1][1]:
                self._samples.clear()
            else:
                return
        self._samples.append((now_ms, packets))
        while len(self._samples) > 2 and self._samples[1][0] < now_ms - self._keep_ms:
            self._samples.popleft()

    def at(self, t_ms: float) -> float | None:
        """The count at ``t_ms``, linearly between samples; None outside the samples."""
        samples = self._samples
        if not samples or t_ms < samples[0][0] or t_ms > samples[-1][0]:
            return None
        for (ta, na), (tb, nb) in zip(samples, list(samples)[1:], strict=False):
            if ta <= t_ms <= tb:
                return na + (nb - na) * (t_ms - ta) / (tb - ta)
        return float(samples[-1][1])

    def between(self, start_ms: float, end_ms: float) -> float | None:
        """Packets sent in [start_ms, end_ms]; None when the log does not cover it."""
        a, b = self.at(start_ms), self.at(end_ms)
        return None if a is None or b is None else b - a
