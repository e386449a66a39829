"""Adaptive bitrate policy for one video sender: viewer feedback in, target bitrate out.

Job: turn what a WebRTC sender can observe -- the viewer's REMB estimate, RTCP receiver
reports (fraction lost, cumulative loss, interarrival jitter, round-trip time) and the
sender's own measured send rate -- into the encoder's target bitrate, with a stable
reason for every decision (decide, then apply: the session runtime sets the encoder's
bit rate and logs the reason; this module does neither).

Concurrency model: none. `decide(state, feedback, now_ms)` is a pure function of its
arguments: no clock (time is the caller's `now_ms`), no I/O, no asyncio, no aiortc
import. States and decisions are frozen values, so decisions can be logged, asserted on
and replayed. aiortc's `rate.py` (AIMD rate control, every method takes `now_ms`) is the
model; the constants below follow Google Congestion Control (GCC).

The algorithm, per update:
  1. Delay signal: each fresh jitter/RTT sample is compared with its windowed minimum
     over the last `BASELINE_WINDOW_MS`; a sample above baseline + threshold is "high".
     `DELAY_OVERUSE_SAMPLES` consecutive high samples mean queues are building: cut to
     85 % of the rate the path carried, before any loss shows up. One high sample only
     pauses the ramp (a single noisy sample never cuts).
  2. Loss signal (GCC): a fresh report with loss > 10 % cuts rate *= (1 - 0.5 * loss);
     loss 2-10 % holds; loss < 2 % lets the rate grow.  In fast mode (below) a loss cut
     needs the probes to have shown a queue within the report's span (`LOSS_REPORT_SPAN_MS`).
  3. After a cut, hold (no increase, no further cut) for max(`MIN_HOLD_MS`, RTT)
     (`FAST_HOLD_MS` in fast mode, below).
  4. Otherwise ramp: multiplicative (+8 %/s) far from the last congested rate, additive
     (about one packet per response time, RTT + 100 ms) within +-20 % of it.
  5. Cap by the REMB, then clamp to the profile's [min_bps, max_bps].  For
     `REMB_TRUST_MS` after the REMB falls (a fresh REMB under `REMB_FALL_PERCENT` of the
     highest one since the previous fall, or a first REMB under that share of the send
     rate: the viewer saw overuse) the cap is `REMB_HEADROOM_PERCENT` of it (headroom for
     audio and the input data channel).  Otherwise the REMB is only a ceiling for probing,
     `REMB_PROBE_PERCENT` of it: a receiver's REMB follows the rate it receives (aiortc's
     grows additively near its last maximum, is capped at 1.5x the incoming rate and stands
     still while its detector reports under-use), so a sender that never exceeds it cannot
     show the viewer that the path carries more; the loss and delay signals and the next
     REMB fall stop the probe.

Fast mode (the viewer answers delay probes, `streamer.media.probe`) keeps the bottleneck queue near
empty (issue #22): cuts go under the viewer's receive rate (the rate the path delivered while its queue
stood, remembered as the capacity); the ramp stops at the cruise, `CRUISE_PERCENT` of that capacity, not
at the path's edge; a standing queue while cruising (the last `STANDING_SAMPLES` probe RTTs all over the
baseline) goes under what the viewer receives at once; and the path's growth is found by short
bandwidth probes (`BW_PROBE_*`: a few hundred ms over the capacity, ended by the first sign of a queue,
bigger and sooner after each probe that found more) instead of by ramping into the queue.

Invariants:
  - `profile.min_bps <= target_bps <= profile.max_bps` in every decision.
  - `target_bps <= remb_bps * REMB_HEADROOM_PERCENT // 100` within `REMB_TRUST_MS` of a
    REMB fall, and `<= remb_bps * REMB_PROBE_PERCENT // 100` always, whenever a REMB is
    known and that cap is at least `profile.min_bps` (the minimum wins: the encoder cannot
    usefully go lower; the quality ladder steps resolution/fps down instead).
    `signals.remb_cap_bps` is the cap in force.
  - At most one cut per hold period; no increase during a hold, while the latest loss
    is >= 2 %, or while the latest delay sample is high.
  - Time never goes backwards: `now_ms` lower than the previous update's raises.

Units: `*_bps` bits per second, `*_ms` milliseconds, `fraction_lost` in RTCP's 8-bit
fixed point (lost / expected * 256, 0-255), jitter in milliseconds (convert RTCP's RTP
timestamp units with `jitter_ms_from_rtp`).

Size: about 920 lines on purpose: most of it is the constants, each with its measured reason, and the
stages of `decide`, one pure function whose stages share its local values; the table tests read it as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

# --- profiles (bits per second) ---------------------------------------------------------
DESKTOP_MIN_BPS = 300_000
DESKTOP_MAX_BPS = 8_000_000
DESKTOP_START_BPS = 2_000_000
GAME_MIN_BPS = 1_000_000
GAME_MAX_BPS = 25_000_000
GAME_START_BPS = 5_000_000

# --- REMB cap ---------------------------------------------------------------------------
# Target <= 85 % of the viewer's REMB: leaves room for audio and the input data channel,
# which otherwise queues behind video under congestion (measured: 729 ms input RTT).
REMB_HEADROOM_PERCENT = 85
# A fresh REMB under 90 % of the highest since the previous fall (or a first REMB under 90 %
# of the send rate) is a fall: the viewer's detector saw overuse.  The headroom cap holds for
# REMB_TRUST_MS after it; then the target may probe up to REMB_PROBE_PERCENT of the REMB.
# Measured on the network lab (bench/bench_abr.py): with the headroom cap always in force,
# aiortc's REMB stood at 4.3 Mbps for 16 s on an 8 Mbps path with 2 % loss, and took 15 s to
# climb from 1.6 to 2.3 Mbps after capacity returned to 8 Mbps.  A 150 % ceiling let the
# ramp overrun the path further than the delay signal (receiver reports, about one a
# second) catches before loss: freezes.  With 120 % the lab's figures moved within their
# run-to-run spread (utilization 45-73 % either way); the stall itself is gone.
REMB_FALL_PERCENT = 90
REMB_TRUST_MS = 5_000
REMB_PROBE_PERCENT = 120

# --- loss signal (GCC thresholds, as ratios of lost / expected packets) -----------------
LOSS_INCREASE_MAX_RATIO = 0.02  # below: the rate may grow
LOSS_DECREASE_MIN_RATIO = 0.10  # above: cut rate *= (1 - 0.5 * loss)
FRACTION_LOST_SCALE = 256  # RTCP fraction lost is lost / expected * 256

# --- delay signal -----------------------------------------------------------------------
BASELINE_WINDOW_MS = 10_000  # jitter and RTT baselines are minima over this window
JITTER_RISE_THRESHOLD_MS = 10.0  # jitter above baseline + this is "high"
RTT_RISE_MIN_MS = 25.0  # RTT above baseline + max(this, fraction * baseline) is "high"
RTT_RISE_FRACTION = 0.25
DELAY_OVERUSE_SAMPLES = 2  # consecutive high samples before a delay backoff
DELAY_BACKOFF_PERCENT = 85  # GCC: cut to 85 % of the rate the path carried
# A send rate under half the target means the encoder is application-limited (a static
# desktop): it says nothing about the path, so the delay backoff starts from the target,
# and the decision says so (`BitrateSignals.app_limited`) so the quality ladder does not
# step down on a target that a REMB computed from our own low traffic pulled down.
APP_LIMITED_PERCENT = 50

# --- fast feedback: the viewer's answers to delay probes (streamer.media.probe) ------------------
# A probe round trip each period (the lowest of the period's probes) and the viewer's receive
# rate.  While they arrive ("fast mode": a probe RTT within FAST_FEEDBACK_STALE_MS) the
# controller reads queues from them instead of waiting for RTCP's one report a second, so it
# can ramp faster; cuts go to 95 % of what the viewer receives (less for a big queue).
FAST_FEEDBACK_STALE_MS = 1_000
# ... and the viewer's REMB is left out: aiortc's lagged the probes by 2-5 s after a capacity
# drop (measured, bench/bench_abr.py), holding the target under 75 % of the path meanwhile.
PROBE_RISE_MIN_MS = 20.0  # probe RTT above baseline + max(this, RTT_RISE_FRACTION * baseline,
PROBE_NOISE_FACTOR = 4.0  # this * the probe RTT's noise) is "high"
# noise: moving average of |RTT - previous RTT| per 100 ms sample (RFC 3550's jitter gain is 1/16);
# 1/8 forgot a jittery path's noise within a second between its excursions, the threshold fell to
# its 20 ms floor, and the next excursion cut (ABR lab, 30 +- 15 ms: a cut every 2-3 s)
PROBE_NOISE_GAIN = 1 / 16
# Factor 4, not 2: on a 30 +- 15 ms path (the period's lowest of 4 probes, simulated) factor 2
# cut falsely 3.7 times in 20 s, factor 4 0.2 times; a queue growing 10 ms a period is still
# caught on its 4th period either way (the 20 ms floor binds on a clean path).
# A high sample that fell this much below the previous one is a queue draining (after a cut),
# not building: it holds the ramp but does not count towards another cut.
PROBE_DRAIN_FALL_MS = 5.0
# The viewer receives under this share of the send rate: the path carries less than we send.
RECV_SHORTFALL_PERCENT = 80
RECV_SEVERE_PERCENT = 50  # under this share, one sample is enough to cut (a capacity drop)
# Under this share the path is saturated (what we send beyond it queues): no cut, but no ramp.
# Measured on the lab's 8 Mbps link: the viewer's rate sat at 7.5 Mbps while the ramp took the
# send rate to 8.2 Mbps and the probes' queue over the threshold and into an overflow.
RECV_SATURATION_PERCENT = 95
# Past the congested rate, a probe RTT over baseline + this share of the threshold holds the
# ramp: a queue is forming where the path filled last time (ABR lab, 8 Mbps with 2 % loss: the
# near ramp went on to 5 % over the capacity with the probes at +15-50 ms, the queue stood at
# 50-110 ms for a second, and the frames waiting on a retransmission behind it froze).
PROBE_FORMING_FRACTION = 0.5
# A probe RTT above baseline + this many thresholds cuts at once (a queue that high is no noise).
PROBE_SEVERE_THRESHOLDS = 2
FAST_MULTIPLICATIVE_INCREASE_PER_S = 1.5  # fast mode, far from the known capacity
# fast mode, near it (replaces the additive increase): x1.15/s overflowed the lab's 100 ms queue
# 8-11 times per 45 s (a) run with a freeze or two after; x1.08/s 8, 1 and 0 times in (a)/(b)/(c)
FAST_NEAR_INCREASE_PER_S = 1.08
# A receiver report covers the last 0.5-1.5 s: in fast mode the loss it reports within this
# long after a cut is the loss that cut already answered, not a reason for another.
LOSS_REPORT_SPAN_MS = 1_500
# Fast mode: report loss over LOSS_DECREASE_MIN_RATIO cuts only where the probes showed a queue
# (forming, standing or high) within LOSS_REPORT_SPAN_MS, the span the report covers: an overflowing
# queue rises in the probes first, and loss without a queue is the path's own (bursty or random
# loss), which a lower rate does not cure.  Measured on the matrix's burst cell (150 ms of 50 % loss
# every 2.5 s, 2026-12-04): cutting on each burst's report gave 7 loss backoffs in 24 s and 33 %
# utilization.  A policer (loss without a queue that a lower rate does cure) shows as the viewer
# receiving less than was sent: the receive-shortfall cut.
# Fast mode: the ramp never takes the target past this share of what the viewer receives
# (the encoder and the send rate lag the target; a target far ahead of them overshoots the
# path by the time they catch up).
FAST_RAMP_RECV_PERCENT = 120
# ... and past the congested rate (the path's, last time it filled) only this share: the target
# there may outgrow the viewer's rate only as fast as that rate follows (ABR lab, 8 Mbps: with
# 120 % the target reached 8.4 Mbps with the viewer at 7.3, the encoder caught up with it, and
# the queue went from 5 to 40 ms in one 200 ms period, into an overflow).
FAST_ABOVE_CAPACITY_RECV_PERCENT = 105
# The viewer receiving more than this much over the congested rate, with no queue in the probes,
# means the path grew (a capacity that returned): the congested rate is forgotten and the fast
# ramp resumes (ABR lab, 2 -> 8 Mbps: without this the 105 % cap and the near ramp took 6 s to
# carry the target past the old rate's near band).
CAPACITY_OUTGROWN_PERCENT = 10
# A fast-mode cut goes under FAST_BACKOFF_PERCENT of the carried rate when the queue the probes
# show would take longer than this to drain at it (a full 100 ms queue: 80 %), never under 50 %.
DRAIN_TARGET_MS = 500
# The queue a cut drains is the probe's rise less this many times the probe noise (the jitter's
# share of the rise).  ABR lab, 30 +- 15 ms jitter: with the whole rise taken for queue, cuts went
# to 85-88 % of the path where the queue alone called for 90 (utilization 83-85 %).
DRAIN_NOISE_FACTOR = 2.0
MIN_DRAIN_PERCENT = 50
# ... and to 95 %, not 85 or 90, when the queue is small: the probes catch it early, and a
# shallower cut keeps more of the path in use (ABR lab, 8 Mbps: 85 % cuts every few seconds held
# the goodput at 82-84 % of the capacity; 30 +- 15 ms jitter at 5 Mbps: 90 % cuts every 2-3 s,
# each followed by the x1.08/s climb back, held it at 82-89 % over 11 runs, 95 % at 85-90 %
# over 11).  A 25 ms queue (the threshold) drains within the 500 ms hold at 95 %.
FAST_BACKOFF_PERCENT = 95

# --- fast mode: cruise under the capacity, probe it briefly (issue #22) -----------------------------
# Ramping into the path until its queue showed (x1.08/s near the capacity, cuts at 20+ ms of queue)
# kept the bottleneck queue partly full: frame delay p95 136 ms against 86-107 for stock aiortc on
# the lab's 100 ms queue, and a 60 ms queue overflowed in steady state (freezes).  Now, once a cut
# has measured the capacity (what the viewer received while the queue stood), the target cruises at
# CRUISE_PERCENT of it, with no queue, and finds out whether the path grew by a short probe
# every BW_PROBE_INTERVAL_MS: BW_PROBE_GAINS[rounds] % of the capacity for BW_PROBE_MS + the path's
# round trip (the viewer's 300 ms receive window must see it), ended at once by a forming queue.
# What the viewer received during the probe is the capacity (it carried all of it, or the path
# was full at it); a probe that found more is followed by a bigger one BW_PROBE_AGAIN_MS later.
# Values set from quick single runs on the ABR lab (2026-12-04), not swept; the full-matrix figures are
# in docs/abr.md (the 90 % cruise holds goodput at 61-78 % of the link there, under the 80 % goal).
CRUISE_PERCENT = 90
BW_PROBE_GAINS = (104, 110, 120, 140, 150)  # percent of the capacity, by clean rounds in a row
BW_PROBE_MS = 300
BW_PROBE_INTERVAL_MS = 3_000
BW_PROBE_AGAIN_MS = 500
# A probe round counts as clean (the next one bigger) when the viewer received at least this share
# of the capacity it started from: less means the encoder did not fill the probe, not that the path is full.
BW_PROBE_FOUND_PERCENT = 102
# A probe ended by a full path sets the capacity to what the viewer received, but never under this
# share of the previous one: one noisy sample must not walk the cruise down (real drops cut instead).
FULL_PROBE_FLOOR_PERCENT = 95
# The standing-queue signal (cruise and bandwidth probes): the lowest of the last STANDING_SAMPLES probe
# RTTs (each already a period's lowest) over the baseline by max(STANDING_QUEUE_MIN_MS,
# STANDING_NOISE_FACTOR x the probe noise).  A queue that stands for 300 ms raises all three; a jitter
# spike raises one.  Half a threshold over the baseline, one sample, could not serve: on the lab's 60 ms
# path (a user-space delay emulator) the period's lowest of four probes spread over 62-69 ms with no
# queue, and it cut the cruise ten times in 10 s, down to the profile minimum.  A moving average (gain
# 1/4) could not either: it stayed over the bar for five periods after a single 120 ms sample.
STANDING_SAMPLES = 3
STANDING_QUEUE_MIN_MS = 8.0
STANDING_NOISE_FACTOR = 2.0
# A queue backoff at most this often; a standing queue within it, while the viewer receives what we
# send, re-bases the probe baseline instead.  ABR lab, full matrix (load average about 3): without it,
# an RTT level the user-space delay emulator raised under load read as a standing queue after every
# cut, each cut set the capacity to 90 % of the last, and an 8 Mbps path ended at the profile minimum.
QUEUE_BACKOFF_SPACING_MS = 2_000

# --- hold after a cut -------------------------------------------------------------------
MIN_HOLD_MS = 300  # hold for max(MIN_HOLD_MS, RTT) after a cut before increasing again
# In a fast-mode hold a cut is taken again when the probes show the queue high and not draining
# and the viewer receives under this share of the target: the first cut did not reach under the path.
# ABR lab, 8 -> 2 Mbps: the viewer's rate at the first cut still held 0.1 s of the 8 Mbps path
# (2.35 Mbps), the cut went to 2.07 on a path carrying 1.75, and a second overflow followed the
# hold (settle 1.9 s).  After a cut that did reach under it the viewer gets over the target.
HOLD_RECUT_RECV_PERCENT = 95
# fast mode: max(this, RTT) -- the time a cut gives the queue to drain (DRAIN_TARGET_MS).  With
# 300 ms, on the lab's 30 +- 15 ms jitter path, a probe 300 ms after a cut still showed the queue
# (jitter hid the fall), and a second cut took the target to about 60 % of the path.
FAST_HOLD_MS = DRAIN_TARGET_MS

# --- ramp-up ----------------------------------------------------------------------------
MULTIPLICATIVE_INCREASE_PER_S = 1.08  # +8 % per second far from the known capacity
MIN_MULTIPLICATIVE_INCREASE_BPS = 1_000
MAX_RAMP_INTERVAL_MS = 1_000  # a feedback gap never counts for more than this
NEAR_CAPACITY_PERCENT = 20  # within +-20 % of the last congested rate: additive increase
# Fast mode: the near band starts 10 % under the congested rate (the viewer's rate while the queue
# stood: the path's own); under it the fast ramp runs, up to the band.  With 20 % (and a second
# cut's target remembered as the congested rate) the ramp after a cut crept at x1.08/s all the
# way back (ABR lab, 8 Mbps path: 5.4 -> 7.5 Mbps took 4 s).
FAST_NEAR_CAPACITY_PERCENT = 10
PACKET_SIZE_BITS = 1_200 * 8  # additive increase: about one packet per response time
RESPONSE_TIME_EXTRA_MS = 100  # response time = RTT + this (GCC)
DEFAULT_RTT_MS = 200  # used for the additive rate until the first RTT is known
MIN_ADDITIVE_INCREASE_BPS_PER_S = 4_000

RTP_VIDEO_CLOCK_RATE_HZ = 90_000


class BitrateReason(StrEnum):
    """Why a decision's target is what it is. Values are stable strings for logs/metrics."""

    START = "start"  # first decision: the profile's start bitrate
    HOLD = "hold"  # unchanged: in a post-cut hold, loss 2-10 %, or a delay sample is high
    RAMP_MULTIPLICATIVE = "ramp_multiplicative"  # +8 %/s (fast mode +50 %/s), far from the known capacity
    RAMP_ADDITIVE = "ramp_additive"  # ~one packet per response time, near the capacity
    RAMP_NEAR = "ramp_near"  # fast mode, near the capacity: +8 %/s (probes catch an overshoot at once)
    DELAY_BACKOFF = "delay_backoff"  # jitter/RTT rose above baseline for several samples
    LOSS_BACKOFF = "loss_backoff"  # loss > 10 %: rate *= (1 - 0.5 * loss)
    RECV_SHORTFALL = "recv_shortfall"  # the viewer receives well under the send rate: cut to 95 % of it
    REMB_CAP = "remb_cap"  # limited by the viewer's REMB (headroom after a fall, else the probe ceiling)
    CRUISE = "cruise"  # fast mode: at CRUISE_PERCENT of the capacity, between bandwidth probes
    PROBE_UP = "probe_up"  # fast mode: a short bandwidth probe over the capacity
    PROBE_DOWN = "probe_down"  # fast mode: a bandwidth probe ended (its timer or a full path): back to cruise
    QUEUE_BACKOFF = "queue_backoff"  # fast mode: a standing queue while cruising: under what the viewer receives
    MIN_CLAMP = "min_clamp"  # raised to the profile minimum
    MAX_CLAMP = "max_clamp"  # limited to the profile maximum


@dataclass(frozen=True, slots=True)
class BitrateProfile:
    """Bitrate bounds for a kind of session; build one directly for a custom profile."""

    name: str
    min_bps: int
    max_bps: int
    start_bps: int

    def __post_init__(self) -> None:
        if not 0 < self.min_bps <= self.start_bps <= self.max_bps:
            raise ValueError(f"profile {self.name!r} needs 0 < min_bps <= start_bps <= max_bps")


DESKTOP_PROFILE = BitrateProfile("desktop", DESKTOP_MIN_BPS, DESKTOP_MAX_BPS, DESKTOP_START_BPS)
GAME_PROFILE = BitrateProfile("game", GAME_MIN_BPS, GAME_MAX_BPS, GAME_START_BPS)


@dataclass(frozen=True, slots=True)
class Feedback:
    """What arrived since the previous update; None means "not in this update".

    remb_bps: the viewer's REMB estimate. fraction_lost: from an RTCP receiver report,
    RTCP's 8-bit fixed point (lost / expected * 256, 0-255), loss over that report's
    interval. cumulative_lost: the report's cumulative packets lost (may go negative with
    duplicates; reported as a delta in the signals, not used for control). jitter_ms: the
    report's interarrival jitter in milliseconds. rtt_ms: round-trip time in
    milliseconds. send_rate_bps: the sender's own measured send rate. probe_rtt_ms: the
    lowest round trip of the period's delay probes; recv_rate_bps: the rate the viewer
    received video at, from its probe answers (both from ``streamer.media.probe``).
    """

    remb_bps: int | None = None
    fraction_lost: int | None = None
    cumulative_lost: int | None = None
    jitter_ms: float | None = None
    rtt_ms: float | None = None
    send_rate_bps: int | None = None
    probe_rtt_ms: float | None = None
    recv_rate_bps: int | None = None
    # what we sent over the same span as the viewer's receive rate (the packets that rate counts,
    # as sent): the viewer receiving less than this is the path's doing; None: compare with the
    # send rate (an average over a longer, later window)
    sent_matched_bps: int | None = None

    def __post_init__(self) -> None:
        if self.fraction_lost is not None and not 0 <= self.fraction_lost <= 255:
            raise ValueError("fraction_lost is RTCP's 0-255 fixed point")
        for name in ("remb_bps", "send_rate_bps", "jitter_ms", "rtt_ms", "probe_rtt_ms", "recv_rate_bps",
                     "sent_matched_bps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")


@dataclass(frozen=True, slots=True)
class BitrateSignals:
    """The signals a decision used (latest known values and derived baselines)."""

    remb_bps: int | None
    remb_cap_bps: int | None
    send_rate_bps: int | None
    fraction_lost: int
    loss_ratio: float
    lost_packets_delta: int | None
    jitter_ms: float | None
    jitter_baseline_ms: float | None
    rtt_ms: float | None
    rtt_baseline_ms: float | None
    delay_high_samples: int
    capacity_bps: int | None
    probe_rtt_ms: float | None = None
    probe_rtt_baseline_ms: float | None = None
    probe_threshold_ms: float | None = None  # above baseline + this, a probe RTT is "high"
    probe_high_samples: int = 0
    recv_rate_bps: int | None = None
    sent_matched_bps: int | None = None  # what we sent over the viewer's receive window (this update's)
    fast: bool = False  # probe answers arrive: fast mode
    probe_floor_ms: float | None = None  # the lowest of the last STANDING_SAMPLES probe RTTs (standing queue)
    standing: bool = False  # a standing queue: probe_floor_ms over the baseline by the standing bar
    # The fresh send rate was under APP_LIMITED_PERCENT of the target in force while it was
    # measured: the encoder does not use the bits it has (simple content), so a low REMB
    # reflects our low traffic rather than the path.
    app_limited: bool = False


@dataclass(frozen=True, slots=True)
class BitrateState:
    """Everything the controller remembers between updates. Create with `initial_state`.

    `jitter_minima`/`rtt_minima` are monotonic windowed-minimum queues of (time_ms,
    value_ms): values strictly increase front to back, the front is the baseline.
    `capacity_bps` is the rate at which congestion was last seen (None: unknown).
    `remb_peak_bps` is the highest REMB since the last fall (`remb_fall_ms`).
    """

    profile: BitrateProfile
    target_bps: int
    started: bool = False
    last_update_ms: int | None = None
    hold_until_ms: int | None = None
    capacity_bps: int | None = None
    remb_bps: int | None = None
    send_rate_bps: int | None = None
    fraction_lost: int = 0
    cumulative_lost: int | None = None
    jitter_ms: float | None = None
    rtt_ms: float | None = None
    jitter_minima: tuple[tuple[int, float], ...] = ()
    rtt_minima: tuple[tuple[int, float], ...] = ()
    delay_high_samples: int = 0
    remb_peak_bps: int | None = None
    remb_fall_ms: int | None = None
    probe_rtt_ms: float | None = None
    probe_minima: tuple[tuple[int, float], ...] = ()
    probe_noise_ms: float = 0.0
    probe_high_samples: int = 0
    probe_seen_ms: int | None = None
    probe_recent_ms: tuple[float, ...] = ()  # the last STANDING_SAMPLES probe RTTs, oldest first
    recv_rate_bps: int | None = None
    shortfall_samples: int = 0
    last_cut_ms: int | None = None
    queue_seen_ms: int | None = None  # fast mode: the last probe sample that showed a queue
    # bandwidth probes (fast mode, capacity known): the current one's end (None: cruising), the
    # earliest start of the next, the most the viewer received during the current one, clean rounds
    bw_probe_until_ms: int | None = None
    bw_next_ms: int | None = None
    bw_peak_bps: int = 0
    bw_rounds: int = 0
    bw_tail: bool = False  # the probe's up phase is over; bw_probe_until_ms ends its tail


@dataclass(frozen=True, slots=True)
class BitrateDecision:
    """One decision: the target to apply, why, the signals used, and the next state.

    `changed` is True when target_bps differs from the previous target. `state` is the
    state to pass to the next `decide` call (left out of repr and equality).
    """

    target_bps: int
    reason: BitrateReason
    changed: bool
    signals: BitrateSignals
    state: BitrateState = field(repr=False, compare=False)


def initial_state(profile: BitrateProfile) -> BitrateState:
    """A fresh controller state for `profile`; the first `decide` returns its start rate."""
    return BitrateState(profile=profile, target_bps=profile.start_bps)


def jitter_ms_from_rtp(jitter_rtp_units: float, clock_rate_hz: int = RTP_VIDEO_CLOCK_RATE_HZ) -> float:
    """Convert RTCP interarrival jitter from RTP timestamp units to milliseconds."""
    return jitter_rtp_units * 1000.0 / clock_rate_hz


def queue_free(signals: BitrateSignals) -> bool:
    """Fast mode, and the probe RTT within half its threshold of the baseline: no queue stands on
    the path, so loss the viewer sees now is the path's own (random), not an overflow's."""
    if not signals.fast or signals.probe_rtt_ms is None or signals.probe_rtt_baseline_ms is None:
        return False
    threshold = signals.probe_threshold_ms or PROBE_RISE_MIN_MS
    return not _forming(signals.probe_rtt_ms, signals.probe_rtt_baseline_ms, threshold)


def remb_cap_bps(remb_bps: int, trusted: bool = True) -> int:
    """The highest target allowed under a REMB: minus headroom after a fall, else the probe ceiling."""
    return remb_bps * (REMB_HEADROOM_PERCENT if trusted else REMB_PROBE_PERCENT) // 100


def decide(state: BitrateState, feedback: Feedback, now_ms: int) -> BitrateDecision:
    """Fold `feedback` (arrived at `now_ms`) into `state` and decide the target bitrate.

    Call it on every RTCP feedback (receiver report and/or REMB), with the send rate
    when known; calling it on a timer with an empty `Feedback()` is allowed (it ramps or
    holds on the latest known signals). Cuts happen only on fresh samples.
    """
    if state.last_update_ms is not None and now_ms < state.last_update_ms:
        raise ValueError(f"now_ms {now_ms} is before the previous update {state.last_update_ms}")
    profile = state.profile

    # -- absorb the inputs ----------------------------------------------------------------
    remb = feedback.remb_bps if feedback.remb_bps is not None else state.remb_bps
    send_rate = feedback.send_rate_bps if feedback.send_rate_bps is not None else state.send_rate_bps
    rtt = feedback.rtt_ms if feedback.rtt_ms is not None else state.rtt_ms
    jitter = feedback.jitter_ms if feedback.jitter_ms is not None else state.jitter_ms
    fresh_loss = feedback.fraction_lost is not None
    fraction_lost = feedback.fraction_lost if feedback.fraction_lost is not None else state.fraction_lost
    loss_ratio = fraction_lost / FRACTION_LOST_SCALE
    lost_delta: int | None = None
    cumulative_lost = state.cumulative_lost
    if feedback.cumulative_lost is not None:
        if cumulative_lost is not None:
            lost_delta = feedback.cumulative_lost - cumulative_lost
        cumulative_lost = feedback.cumulative_lost

    # -- REMB fall: the viewer saw overuse -------------------------------------------------
    remb_peak, remb_fall_ms = state.remb_peak_bps, state.remb_fall_ms
    fell = False
    if feedback.remb_bps is not None:
        if remb_peak is not None:
            fell = feedback.remb_bps * 100 < remb_peak * REMB_FALL_PERCENT
        else:  # a first REMB: a fall when under the send rate (or when that is unknown)
            fell = send_rate is None or feedback.remb_bps * 100 < send_rate * REMB_FALL_PERCENT
        if fell:
            remb_peak, remb_fall_ms = feedback.remb_bps, now_ms
        else:
            remb_peak = max(remb_peak or 0, feedback.remb_bps)

    # -- delay signal: fresh samples against their windowed minima --------------------------
    jitter_minima = state.jitter_minima
    rtt_minima = state.rtt_minima
    high = False
    if feedback.jitter_ms is not None:
        jitter_minima = _push_minimum(jitter_minima, now_ms, feedback.jitter_ms)
        high = feedback.jitter_ms > jitter_minima[0][1] + JITTER_RISE_THRESHOLD_MS
    if feedback.rtt_ms is not None:
        rtt_minima = _push_minimum(rtt_minima, now_ms, feedback.rtt_ms)
        rtt_base = rtt_minima[0][1]
        high = high or feedback.rtt_ms > rtt_base + max(RTT_RISE_MIN_MS, RTT_RISE_FRACTION * rtt_base)
    fresh_delay = feedback.jitter_ms is not None or feedback.rtt_ms is not None
    delay_high_samples = state.delay_high_samples
    if fresh_delay:
        delay_high_samples = delay_high_samples + 1 if high else 0

    # -- fast feedback: probe round trips and the viewer's receive rate ---------------------
    probe = _probe_signal(state, feedback.probe_rtt_ms, now_ms)
    recent = state.probe_recent_ms
    if feedback.probe_rtt_ms is not None:
        recent = (*recent, feedback.probe_rtt_ms)[-STANDING_SAMPLES:]
    floor_ms = min(recent) if len(recent) == STANDING_SAMPLES else None
    # ... and not draining: a queue falling PROBE_DRAIN_FALL_MS a sample is a cut at work
    draining = (
        feedback.probe_rtt_ms is not None
        and state.probe_rtt_ms is not None
        and feedback.probe_rtt_ms <= state.probe_rtt_ms - PROBE_DRAIN_FALL_MS
    )
    standing = (
        probe.fresh
        and not draining
        and floor_ms is not None
        and bool(probe.minima)
        and _standing(floor_ms, probe.minima[0][1], probe.prior_noise_ms)
    )
    fast = probe.seen_ms is not None and now_ms - probe.seen_ms <= FAST_FEEDBACK_STALE_MS
    queue_seen_ms = state.queue_seen_ms
    if probe.fresh and (probe.high or standing or _queue_shows(probe)):
        queue_seen_ms = now_ms
    recv_rate = feedback.recv_rate_bps if feedback.recv_rate_bps is not None else state.recv_rate_bps
    # the send rate is a path's measure only while the encoder uses its bits (not app-limited)
    path_limited = send_rate is not None and send_rate * 100 >= state.target_bps * APP_LIMITED_PERCENT
    shortfall_samples = state.shortfall_samples
    severe = saturated = False
    if feedback.recv_rate_bps is not None and send_rate is not None and send_rate > 0 and path_limited:
        # against the lower of the send rate and the target: the send rate is a second's average,
        # still high for a second after a cut that the viewer's rate already shows.  Where the caller
        # knows what it sent over the viewer's own window (sent_matched_bps), that is the reference: an
        # encoder that slows down (a loaded CPU) shows in the viewer's short, earlier window before it
        # shows in the send rate's average, and read as a shortfall it cut an idle loopback link.
        basis = feedback.sent_matched_bps if feedback.sent_matched_bps is not None else send_rate
        sent = min(basis, state.target_bps)
        short = feedback.recv_rate_bps * 100 < sent * RECV_SHORTFALL_PERCENT
        severe = feedback.recv_rate_bps * 100 < sent * RECV_SEVERE_PERCENT
        saturated = feedback.recv_rate_bps * 100 < sent * RECV_SATURATION_PERCENT
        shortfall_samples = shortfall_samples + 1 if short else 0

    # -- candidate target -------------------------------------------------------------------
    target = state.target_bps
    capacity = state.capacity_bps
    if (
        fast
        and capacity is not None
        and feedback.recv_rate_bps is not None
        and feedback.recv_rate_bps * 100 > capacity * (100 + CAPACITY_OUTGROWN_PERCENT)
        and not probe.high
        and not (state.hold_until_ms is not None and now_ms < state.hold_until_ms)
    ):
        capacity = None  # the viewer gets more than the path carried when it last filled: it grew
    hold_until = state.hold_until_ms
    last_cut_ms = state.last_cut_ms
    in_hold = hold_until is not None and now_ms < hold_until
    bw_until, bw_next = state.bw_probe_until_ms, state.bw_next_ms
    bw_peak, bw_rounds, bw_tail = state.bw_peak_bps, state.bw_rounds, state.bw_tail
    if not fast or capacity is None:  # probes are for a known capacity, in fast mode
        bw_until, bw_peak, bw_tail = None, 0, False
    reason: BitrateReason
    if not state.started:
        candidate, reason = profile.start_bps, BitrateReason.START
    else:
        cuts: list[tuple[int, BitrateReason, int]] = []  # (new target, reason, congested rate)
        # fast mode: a report's loss from before the last cut was answered by that cut
        answered = fast and state.last_cut_ms is not None and now_ms - state.last_cut_ms < LOSS_REPORT_SPAN_MS
        # fast mode: loss with no queue in the probes over the report's span is the path's own
        queueless = fast and (queue_seen_ms is None or now_ms - queue_seen_ms > LOSS_REPORT_SPAN_MS)
        if fresh_loss and loss_ratio > LOSS_DECREASE_MIN_RATIO and not in_hold and not answered and not queueless:
            # rate *= (1 - 0.5 * loss), with loss = fraction_lost / 256, in exact integers
            cut = target * (2 * FRACTION_LOST_SCALE - fraction_lost) // (2 * FRACTION_LOST_SCALE)
            cuts.append((cut, BitrateReason.LOSS_BACKOFF, target))
        # what the path carried: the viewer's receive rate where known, else our send rate
        carried = target
        if path_limited and send_rate is not None:
            carried = min(target, recv_rate if fast and recv_rate is not None else send_rate)
        # the probes' overuse: DELAY_OVERUSE_SAMPLES high samples in a row, none of them draining
        probe_overuse = probe.fresh and probe.high_samples >= DELAY_OVERUSE_SAMPLES
        # fast mode: the probes are the delay signal; the receiver reports' RTT and jitter are
        # a second old (after a cut they still show the queue the cut is draining)
        if fast:
            delay_cut = probe_overuse or (probe.fresh and probe.severe)
            percent = _drain_percent(probe)
        else:
            delay_cut = fresh_delay and delay_high_samples >= DELAY_OVERUSE_SAMPLES
            percent = DELAY_BACKOFF_PERCENT
        # the congested rate remembered: in fast mode what the viewer received while the queue
        # stood (the path's rate), not the target -- a second cut while the first drains would
        # otherwise remember the first cut's target and ramp slowly from far under the path
        congested = carried
        if fast and recv_rate is not None and path_limited:
            congested = recv_rate
        # in a fast-mode hold: the queue high and not draining (DELAY_OVERUSE_SAMPLES samples since
        # the cut; one severe sample is not enough: a cut shows in the probes a period later) while
        # the viewer receives under the target -- the cut did not reach under the path
        recut = (
            fast and probe_overuse and recv_rate is not None and recv_rate * 100 < target * HOLD_RECUT_RECV_PERCENT
        )
        if (delay_cut and not in_hold) or (recut and in_hold):
            cuts.append((carried * percent // 100, BitrateReason.DELAY_BACKOFF, congested))
        # no hold for this one: it compares the viewer's rate with the target in force, so after
        # a cut it fires again only if the viewer gets less still (a cut that was not deep enough)
        if (severe or shortfall_samples >= DELAY_OVERUSE_SAMPLES) and recv_rate is not None:
            received = min(target, recv_rate)
            cuts.append((received * _drain_percent(probe) // 100, BitrateReason.RECV_SHORTFALL, recv_rate))
        # fast mode, outside a bandwidth probe and a hold: a standing queue means the path is full at what
        # the viewer receives; go under it before the queue reaches the cut threshold (a 30 ms bottleneck
        # queue overflows before 2 x 20 ms).  Within QUEUE_BACKOFF_SPACING_MS of the last cut a queue that
        # still stands although the viewer gets what we send is no queue of ours (it did not drain when we
        # sent less): its level is the path's RTT now, the new baseline, and no reason for another cut
        if fast and standing and bw_until is None and not in_hold and recv_rate is not None and path_limited:
            recent_cut = last_cut_ms is not None and now_ms - last_cut_ms < QUEUE_BACKOFF_SPACING_MS
            if not recent_cut:
                cuts.append((min(target, recv_rate) * CRUISE_PERCENT // 100, BitrateReason.QUEUE_BACKOFF, recv_rate))
            elif not saturated and floor_ms is not None:
                probe = replace(probe, minima=((now_ms, floor_ms),))
                standing = False
        # fast mode: loss without a queue (the probes see none) is the path's, not congestion
        loss_holds = loss_ratio >= LOSS_INCREASE_MAX_RATIO and not fast
        if fast:
            delay_high_samples = 0
        if cuts:
            candidate, reason, capacity = min(cuts, key=lambda c: c[0])
            last_cut_ms = now_ms
            hold_until = now_ms + max(FAST_HOLD_MS if fast else MIN_HOLD_MS, int(rtt or 0))
            # this congestion event is answered; a new one must persist
            delay_high_samples = shortfall_samples = 0
            probe = replace(probe, high_samples=0)
            # a bandwidth probe ends; the next one waits a full interval, from the first size
            bw_until, bw_next, bw_peak, bw_rounds, bw_tail = None, now_ms + BW_PROBE_INTERVAL_MS, 0, 0, False
        elif bw_until is not None and capacity is not None:
            # in a bandwidth probe: up (over the capacity) until its timer or a full path, then a tail
            # at the cruise while the viewer's rate, which lags the target by the encoder, the path and
            # its 300 ms window, shows what the probe carried
            if feedback.recv_rate_bps is not None:
                bw_peak = max(bw_peak, feedback.recv_rate_bps)
            cruise = capacity * CRUISE_PERCENT // 100
            full = (probe.fresh and (probe.high or standing)) or saturated
            if not bw_tail and full:  # the path is full at what the viewer gets (a false alarm costs <= 5 %)
                capacity = max(bw_peak, capacity * FULL_PROBE_FLOOR_PERCENT // 100)
                bw_until, bw_peak, bw_rounds, bw_next = None, 0, 0, now_ms + BW_PROBE_INTERVAL_MS
                candidate, reason = capacity * CRUISE_PERCENT // 100, BitrateReason.PROBE_DOWN
                # the probe's own queue drains meanwhile: it is no reason for a queue backoff
                hold_until = now_ms + max(FAST_HOLD_MS, int(rtt or 0))
            elif not bw_tail and now_ms >= bw_until:
                bw_tail, bw_until = True, now_ms + max(FAST_HOLD_MS, int(rtt or 0))
                candidate, reason, hold_until = cruise, BitrateReason.PROBE_DOWN, bw_until
            elif bw_tail and now_ms >= bw_until:
                if bw_peak * 100 >= capacity * BW_PROBE_FOUND_PERCENT:  # it carried more: probe bigger soon
                    capacity, bw_rounds, bw_next = bw_peak, bw_rounds + 1, now_ms + BW_PROBE_AGAIN_MS
                else:  # the path was full, or the encoder did not fill the probe
                    bw_rounds, bw_next = 0, now_ms + BW_PROBE_INTERVAL_MS
                bw_until, bw_peak, bw_tail = None, 0, False
                candidate, reason = target, BitrateReason.HOLD
            else:
                candidate, reason = target, BitrateReason.HOLD if bw_tail else BitrateReason.PROBE_UP
        elif (
            in_hold
            or loss_holds
            or delay_high_samples > 0
            or (fast and (probe.high or shortfall_samples > 0 or saturated))
            or (fast and capacity is not None and target >= capacity and _queue_forming(probe))
        ):
            candidate, reason = target, BitrateReason.HOLD
        else:
            candidate, reason, capacity = _ramp(state, capacity, rtt, now_ms, fast)
            ceiling = capacity * CRUISE_PERCENT // 100 if fast and capacity is not None else None
            if ceiling is not None and capacity is not None and target >= ceiling:
                if bw_next is None or now_ms >= bw_next:  # time for a bandwidth probe
                    gain = BW_PROBE_GAINS[min(bw_rounds, len(BW_PROBE_GAINS) - 1)]
                    candidate, reason = capacity * gain // 100, BitrateReason.PROBE_UP
                    base_ms = int(probe.minima[0][1]) if probe.minima else 0
                    bw_until, bw_peak = now_ms + BW_PROBE_MS + base_ms, 0
                else:
                    candidate, reason = ceiling, BitrateReason.CRUISE
            elif fast and recv_rate is not None and path_limited:
                if ceiling is not None:  # the fast ramp stops at the cruise
                    candidate = min(candidate, ceiling)
                # above the rate the path last carried, the viewer's rate leads the ramp closely
                above = capacity is not None and target >= capacity
                percent = FAST_ABOVE_CAPACITY_RECV_PERCENT if above else FAST_RAMP_RECV_PERCENT
                candidate = max(target, min(candidate, recv_rate * percent // 100))
                if candidate == target:  # the viewer's rate caps the ramp where it is
                    reason = BitrateReason.HOLD

    # -- caps: REMB (headroom after a fall, else the probe ceiling; not in fast mode: the
    # probes show the path's queue directly and sooner), then the profile's bounds
    trusted = remb_fall_ms is not None and now_ms - remb_fall_ms < REMB_TRUST_MS
    remb_cap = remb_cap_bps(remb, trusted) if remb is not None and not fast else None
    if remb_cap is not None and candidate > remb_cap:
        candidate, reason = remb_cap, BitrateReason.REMB_CAP
    if candidate < profile.min_bps:
        candidate, reason = profile.min_bps, BitrateReason.MIN_CLAMP
    elif candidate > profile.max_bps:
        candidate, reason = profile.max_bps, BitrateReason.MAX_CLAMP

    new_state = replace(
        state,
        target_bps=candidate,
        started=True,
        last_update_ms=now_ms,
        hold_until_ms=hold_until,
        capacity_bps=capacity,
        remb_bps=remb,
        send_rate_bps=send_rate,
        fraction_lost=fraction_lost,
        cumulative_lost=cumulative_lost,
        jitter_ms=jitter,
        rtt_ms=rtt,
        jitter_minima=jitter_minima,
        rtt_minima=rtt_minima,
        delay_high_samples=delay_high_samples,
        remb_peak_bps=remb_peak,
        remb_fall_ms=remb_fall_ms,
        probe_rtt_ms=probe.rtt_ms,
        probe_minima=probe.minima,
        probe_noise_ms=probe.noise_ms,
        probe_high_samples=probe.high_samples,
        probe_seen_ms=probe.seen_ms,
        probe_recent_ms=recent,
        recv_rate_bps=recv_rate,
        shortfall_samples=shortfall_samples,
        last_cut_ms=last_cut_ms,
        queue_seen_ms=queue_seen_ms,
        bw_probe_until_ms=bw_until,
        bw_next_ms=bw_next,
        bw_peak_bps=bw_peak,
        bw_rounds=bw_rounds,
        bw_tail=bw_tail,
    )
    signals = BitrateSignals(
        remb_bps=remb,
        remb_cap_bps=remb_cap,
        send_rate_bps=send_rate,
        fraction_lost=fraction_lost,
        loss_ratio=loss_ratio,
        lost_packets_delta=lost_delta,
        jitter_ms=jitter,
        jitter_baseline_ms=jitter_minima[0][1] if jitter_minima else None,
        rtt_ms=rtt,
        rtt_baseline_ms=rtt_minima[0][1] if rtt_minima else None,
        delay_high_samples=delay_high_samples,
        capacity_bps=capacity,
        probe_rtt_ms=probe.rtt_ms,
        probe_rtt_baseline_ms=probe.minima[0][1] if probe.minima else None,
        probe_threshold_ms=probe.threshold_ms,
        probe_high_samples=probe.high_samples,
        recv_rate_bps=recv_rate,
        sent_matched_bps=feedback.sent_matched_bps,
        fast=fast,
        probe_floor_ms=floor_ms,
        standing=standing,
        app_limited=(
            state.started
            and feedback.send_rate_bps is not None
            and feedback.send_rate_bps * 100 < state.target_bps * APP_LIMITED_PERCENT
        ),
    )
    return BitrateDecision(
        target_bps=candidate,
        reason=reason,
        changed=not state.started or candidate != state.target_bps,
        signals=signals,
        state=new_state,
    )


@dataclass(frozen=True, slots=True)
class _ProbeSignal:
    """The probe RTT signal after one update (see `_probe_signal`)."""

    rtt_ms: float | None
    minima: tuple[tuple[int, float], ...]
    noise_ms: float
    threshold_ms: float | None
    high: bool  # the latest sample is above baseline + threshold
    severe: bool  # ... above baseline + PROBE_SEVERE_THRESHOLDS thresholds, and not draining
    high_samples: int  # consecutive high samples that were not a queue draining
    seen_ms: int | None
    fresh: bool  # a sample arrived in this update
    prior_noise_ms: float = 0.0  # the noise the latest sample was judged against (before it)


def _probe_signal(state: BitrateState, rtt_ms: float | None, now_ms: int) -> _ProbeSignal:
    """Fold a probe RTT sample in: baseline (windowed minimum), noise, threshold, high count.

    The threshold follows the path's own noise: on a jittery path the lowest of a period's
    probes still moves by tens of milliseconds without any queue, so a fixed threshold would
    cut on jitter.  A sample is judged against the noise before it, and adds its change to the
    noise clipped at the threshold (a queue's jump must not raise the bar for the next ones
    much).  A high sample that fell by PROBE_DRAIN_FALL_MS or more since the previous
    one is a queue draining: it does not count towards a cut (the previous cut works).
    """
    if rtt_ms is None:  # no sample: the latest one still says whether the queue is up
        latest, minima, noise = state.probe_rtt_ms, state.probe_minima, state.probe_noise_ms
        if latest is None or not minima:
            return _ProbeSignal(None, minima, noise, None, False, False, 0, state.probe_seen_ms, False)
        threshold = _probe_threshold(minima[0][1], noise)
        high = latest > minima[0][1] + threshold
        high_samples, seen_ms = state.probe_high_samples, state.probe_seen_ms
        return _ProbeSignal(latest, minima, noise, threshold, high, False, high_samples, seen_ms, False, noise)
    # the baseline takes the higher of this sample and the previous one: one sample far under the path's
    # RTT (ABR lab: 30.8 ms on a 60 ms path, once) set the baseline alone and every later sample read high
    previous_rtt = state.probe_rtt_ms
    minima = _push_minimum(state.probe_minima, now_ms, rtt_ms if previous_rtt is None else max(rtt_ms, previous_rtt))
    base = minima[0][1]
    threshold = _probe_threshold(base, state.probe_noise_ms)
    high = rtt_ms > base + threshold
    noise = state.probe_noise_ms
    previous = state.probe_rtt_ms
    if previous is not None:
        noise += (min(abs(rtt_ms - previous), threshold) - noise) * PROBE_NOISE_GAIN
    draining = previous is not None and rtt_ms <= previous - PROBE_DRAIN_FALL_MS
    if not high:
        high_samples = 0
    elif draining:
        high_samples = state.probe_high_samples
    else:
        high_samples = state.probe_high_samples + 1
    severe = rtt_ms > base + PROBE_SEVERE_THRESHOLDS * threshold and not draining
    return _ProbeSignal(
        rtt_ms, minima, noise, threshold, high, severe, high_samples, now_ms, True, state.probe_noise_ms
    )


def _queue_forming(probe: _ProbeSignal) -> bool:
    """The latest probe RTT is over baseline + PROBE_FORMING_FRACTION x threshold, on a quiet path.

    Only where the probe noise leaves the threshold at its floor: on a jittery path half the
    threshold is jitter's ordinary reach (ABR lab, 30 +- 15 ms: the hold stood for seconds under
    a congested rate a false cut had set low, and utilization fell to 74 %).
    """
    if probe.rtt_ms is None or not probe.minima or probe.threshold_ms is None:
        return False
    if PROBE_NOISE_FACTOR * probe.prior_noise_ms > PROBE_RISE_MIN_MS:
        return False
    return _forming(probe.rtt_ms, probe.minima[0][1], probe.threshold_ms)


def _queue_shows(probe: _ProbeSignal) -> bool:
    """The latest probe RTT over baseline + PROBE_FORMING_FRACTION x threshold (on any path)."""
    if probe.rtt_ms is None or not probe.minima or probe.threshold_ms is None:
        return False
    return _forming(probe.rtt_ms, probe.minima[0][1], probe.threshold_ms)


def _standing(floor_ms: float, baseline_ms: float, noise_ms: float) -> bool:
    """The recent probes' floor over the baseline by max(STANDING_QUEUE_MIN_MS, STANDING_NOISE_FACTOR x noise)."""
    return floor_ms > baseline_ms + max(STANDING_QUEUE_MIN_MS, STANDING_NOISE_FACTOR * noise_ms)


def _forming(rtt_ms: float, baseline_ms: float, threshold_ms: float) -> bool:
    """A probe RTT over baseline + PROBE_FORMING_FRACTION x threshold: a queue is forming."""
    return rtt_ms > baseline_ms + PROBE_FORMING_FRACTION * threshold_ms


def _drain_percent(probe: _ProbeSignal) -> int:
    """How far under the carried rate a fast-mode cut goes: 95 %, or lower to drain a bigger queue.

    Sending at r x capacity drains a queue of q ms in q / (1 - r) ms; the cut takes r so that
    the queue the latest probe shows drains within `DRAIN_TARGET_MS` (never under 50 %).  The
    queue is the probe RTT over its baseline less `DRAIN_NOISE_FACTOR` x the probe noise before
    that sample: on a jittery path part of that rise is jitter, which no cut drains.
    """
    if probe.rtt_ms is None or not probe.minima:
        return DELAY_BACKOFF_PERCENT
    queue_ms = max(0.0, probe.rtt_ms - probe.minima[0][1] - DRAIN_NOISE_FACTOR * probe.prior_noise_ms)
    drain = int(100 - 100 * queue_ms / DRAIN_TARGET_MS)
    return max(MIN_DRAIN_PERCENT, min(FAST_BACKOFF_PERCENT, drain))


def _probe_threshold(base_ms: float, noise_ms: float) -> float:
    """A queue's rise over the probe baseline: the floor or 4 x the noise, whatever the path's own RTT.

    ``base_ms`` is unused since issue #22: with 25 % of it (RTCP mode's rule) a 120 ms path's threshold was
    30 ms, and a 30 ms bottleneck queue overflowed before the probes called it a queue.
    """
    del base_ms
    return max(PROBE_RISE_MIN_MS, PROBE_NOISE_FACTOR * noise_ms)


def _ramp(
    state: BitrateState, capacity: int | None, rtt_ms: float | None, now_ms: int, fast: bool = False
) -> tuple[int, BitrateReason, int | None]:
    """Increase for the time since the previous update (post-hold time only, <= 1 s).

    In fast mode (probe answers arrive) the increase is multiplicative everywhere:
    FAST_MULTIPLICATIVE_INCREASE_PER_S far from the known capacity, FAST_NEAR_INCREASE_PER_S
    near it -- an overshoot shows in the next probes, not a second later.

    Returns (candidate, reason, capacity): the capacity is forgotten once the target has
    grown past its near band (the path evidently carries more now).
    """
    target = state.target_bps
    since_ms = state.last_update_ms if state.last_update_ms is not None else now_ms
    if state.hold_until_ms is not None:
        since_ms = max(since_ms, state.hold_until_ms)
    elapsed_ms = min(now_ms - since_ms, MAX_RAMP_INTERVAL_MS)
    if elapsed_ms <= 0:
        return target, BitrateReason.HOLD, capacity
    near_percent = FAST_NEAR_CAPACITY_PERCENT if fast else NEAR_CAPACITY_PERCENT
    band_bps = capacity * (100 - near_percent) // 100 if capacity is not None else None  # the near band's lower edge
    near = band_bps is not None and target >= band_bps
    if fast:
        per_s = FAST_NEAR_INCREASE_PER_S if near else FAST_MULTIPLICATIVE_INCREASE_PER_S
        new_target = target + max(int((per_s ** (elapsed_ms / 1000) - 1) * target), MIN_MULTIPLICATIVE_INCREASE_BPS)
        reason = BitrateReason.RAMP_NEAR if near else BitrateReason.RAMP_MULTIPLICATIVE
        if band_bps is not None and not near:  # the fast ramp stops where the near band starts
            new_target = min(new_target, band_bps)
    elif near:
        response_time_ms = int(rtt_ms if rtt_ms is not None else DEFAULT_RTT_MS) + RESPONSE_TIME_EXTRA_MS
        rate_bps_per_s = max(MIN_ADDITIVE_INCREASE_BPS_PER_S, PACKET_SIZE_BITS * 1000 // response_time_ms)
        new_target = target + elapsed_ms * rate_bps_per_s // 1000
        reason = BitrateReason.RAMP_ADDITIVE
    else:
        alpha = MULTIPLICATIVE_INCREASE_PER_S ** (elapsed_ms / 1000)
        new_target = target + max(int((alpha - 1) * target), MIN_MULTIPLICATIVE_INCREASE_BPS)
        reason = BitrateReason.RAMP_MULTIPLICATIVE
    if capacity is not None and new_target * 100 > capacity * (100 + NEAR_CAPACITY_PERCENT):
        capacity = None
    return new_target, reason, capacity


def _push_minimum(minima: tuple[tuple[int, float], ...], now_ms: int, value: float) -> tuple[tuple[int, float], ...]:
    """Add a sample to a monotonic windowed-minimum queue; the front is the minimum.

    Drops entries older than BASELINE_WINDOW_MS and entries not below the new value
    (they can never be the minimum again), so the queue stays short.
    """
    kept = tuple((t_ms, v) for t_ms, v in minima if t_ms > now_ms - BASELINE_WINDOW_MS and v < value)
    return (*kept, (now_ms, value))
