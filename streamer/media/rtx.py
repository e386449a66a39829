"""Which NACKed packets to retransmit: once per round trip each, within a budget.

Job: ``RetransmitLimiter.allow(seq, now_ms)`` says whether the sender should answer
one NACKed sequence number now.  aiortc's sender retransmits every sequence number
of every NACK it receives, and aiortc's receiver NACKs *all* its missing packets
each time it notices a new gap; after a capacity drop that turns into the same
packets sent again and again, faster than the path drains (measured on the ABR
lab: the probes' queue stayed full for 1.8 s after the target was cut under the
new capacity, and the viewer froze 4 s).  Like libwebrtc's packet history, a packet
is retransmitted at most once per round trip (an answer to a NACK cannot have
arrived sooner), and retransmissions get a budget: ``RTX_BUDGET_PERCENT`` of the
video target, as a token bucket holding ``RTX_BURST_MS`` of it.  While ``duplicate``
is set (the session sets it when the probes show no queue: the loss is random),
``copies`` answers 2 where the budget allows, so a retransmission lost as well does
not cost the viewer another round trip (ABR lab, 2 % random loss: the freezes left
after settling were such double losses).

Concurrency model: none.  Pure bookkeeping, no clock (``now_ms`` comes in), no I/O;
the peer (``streamer.media.peer.FeedbackSender``) owns one per connection and the session
sets ``target_bps`` and ``rtt_ms`` as they change.

Invariants: ``allow`` is True at most once per sequence number per
max(``MIN_RETRANSMIT_INTERVAL_MS``, ``RETRANSMIT_RTT_FACTOR`` x ``rtt_ms``); the
packets allowed in any span never exceed the budget accrued in it plus one burst.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

# Retransmissions may use this share of the video target, from a bucket holding RTX_BURST_MS of
# it.  Random loss needs little (2 % loss: 2 %); what the budget bounds is a queue overflow's
# burst of NACKs.  Measured on the ABR lab's 8 -> 2 Mbps drop: with 100 % and a 500 ms bucket
# (416 packets saved up at 8 Mbps) the retransmissions of the first overflow kept the offered
# load near 10 Mbps for half a second after the target was cut to 2.3 Mbps, and the queue
# overflowed for 1.1 s.  25 % and 200 ms still cover a 40-packet overflow at 8 Mbps at once.
RTX_BUDGET_PERCENT: Final = 25
RTX_BURST_MS: Final = 200
RTX_PACKET_BITS: Final = 1_200 * 8  # budget unit: a full-size RTP packet
MIN_RETRANSMIT_INTERVAL_MS: Final = 20.0
RETRANSMIT_RTT_FACTOR: Final = 1.25  # a NACK repeated sooner than this after our answer is ignored
REMEMBERED: Final = 2_048  # sequence numbers remembered (RTP history is 128 in aiortc)
DEFAULT_RTT_MS: Final = 100.0


@dataclass(slots=True)
class RetransmitCounters:
    """NACKed sequence numbers: retransmitted, or skipped (repeated within an RTT, over budget)."""

    sent: int = 0  # retransmitted packets, second copies included
    repeated: int = 0
    over_budget: int = 0
    duplicated: int = 0  # second copies sent (``RetransmitLimiter.duplicate``)


class RetransmitLimiter:
    """Allows each NACKed packet once per round trip, within a share of the target bitrate."""

    def __init__(self, target_bps: int, rtt_ms: float = DEFAULT_RTT_MS) -> None:
        self.target_bps = target_bps
        self.rtt_ms = rtt_ms
        # Send each allowed retransmission twice (budget permitting): set while the loss is random
        # (no queue), so a retransmission lost too does not cost the viewer another round trip.
        self.duplicate = False
        self.counters = RetransmitCounters()
        self._sent_at: OrderedDict[int, float] = OrderedDict()  # sequence number -> when retransmitted
        self._tokens = self._capacity()  # in packets
        self._refilled_ms: float | None = None

    def _refill(self, now_ms: float) -> None:
        if self._refilled_ms is not None:
            elapsed = max(0.0, now_ms - self._refilled_ms)
            self._tokens = min(self._capacity(), self._tokens + elapsed * self._rate_per_ms())
        self._refilled_ms = now_ms

    def _capacity(self) -> float:
        return self._rate_per_ms() * RTX_BURST_MS

    def _rate_per_ms(self) -> float:
        return self.target_bps * RTX_BUDGET_PERCENT / 100 / RTX_PACKET_BITS / 1000

    def copies(self, seq: int, now_ms: float) -> int:
        """How many copies of ``seq`` to send now: 0, 1, or 2 while ``duplicate`` is set and the
        budget holds a second packet (each copy is counted against it)."""
        if not self.allow(seq, now_ms):
            return 0
        if not self.duplicate or self._tokens < 1.0:
            return 1
        self._tokens -= 1.0
        self.counters.sent += 1
        self.counters.duplicated += 1
        return 2

    def allow(self, seq: int, now_ms: float) -> bool:
        """True: retransmit ``seq`` now (and it is counted against the budget)."""
        self._refill(now_ms)
        last = self._sent_at.get(seq)
        if last is not None and now_ms - last < max(MIN_RETRANSMIT_INTERVAL_MS, RETRANSMIT_RTT_FACTOR * self.rtt_ms):
            self.counters.repeated += 1
            return False
        if self._tokens < 1.0:
            self.counters.over_budget += 1
            return False
        self._tokens -= 1.0
        self._sent_at[seq] = now_ms
        self._sent_at.move_to_end(seq)
        while len(self._sent_at) > REMEMBERED:
            self._sent_at.popitem(last=False)
        self.counters.sent += 1
        return True
