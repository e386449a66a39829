"""Per-viewer stream control: which encoder to use, and the bitrate/ladder state between decisions (pure).

Job: ``choose_backend`` picks the encoder backend for a viewer from the probe
results, the node's encoder preference, the session profile's codec
preference and the codecs the viewer's offer can receive.
``StreamController`` holds the state of the two pure policies,
``streamer.abr.bitrate.decide`` (target bitrate) and ``streamer.abr.ladder.decide``
(resolution/fps rung), and feeds the first's target into the second; the
session runtime applies the resulting ``ControlStep`` (decide, then apply).
It also calibrates the encoder: ``encoder_bps`` = target x a gain that makes
the measured send rate meet the target (``encoder_efficiency``, ``rate_match_gain``:
x264 steered through a one-frame VBV spends 72-100 % of its bitrate, about 82 %
on the lab's game, since a frame under its budget cannot lend the rest to the next).

Concurrency model: none.  No clock (time comes in as ``now_ms``), no I/O, no
asyncio, no aiortc or PyAV import; ``StreamController`` is a plain object
owned by one task.

Invariant: the chosen backend produces a codec aiortc can packetize and the
viewer offered; the ladder always sees the bitrate decision of the same step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from encoder.backends import AIORTC_VIDEO_CODECS, BACKENDS, Backend, ProbeResult
from encoder.select import Selection, select_backend
from streamer.abr import bitrate as bitrate_policy
from streamer.abr import ladder as ladder_policy
from streamer.abr.bitrate import BitrateDecision, BitrateProfile, Feedback
from streamer.abr.ladder import Ladder, LadderDecision, Rung

# Profile codec preference -> WebRTC codec name (None: whatever the viewer offers).
CODEC_PREFERENCES: Final[Mapping[str, str | None]] = {"auto": None, "h264": "H264", "vp8": "VP8"}
# Only what aiortc can packetize is worth probing (HEVC/AV1 would need payloaders aiortc lacks).
SENDABLE_BACKENDS: Final[tuple[Backend, ...]] = tuple(b for b in BACKENDS if b.webrtc_codec in AIORTC_VIDEO_CODECS)


def choose_backend(
    probes: tuple[ProbeResult, ...],
    *,
    encoder_preference: str,
    codec_preference: str,
    peer_codecs: frozenset[str],
) -> Selection:
    """Pick the encoder for a viewer: probe results x node preference x profile codec x offer.

    The profile's codec narrows the viewer's codecs when the viewer offers it;
    otherwise it is ignored, with a reason.  Raises ``NoEncoderError``.
    """
    sendable = frozenset(c.upper() for c in peer_codecs) & AIORTC_VIDEO_CODECS
    notes: list[str] = []
    wanted = CODEC_PREFERENCES[codec_preference.lower()]
    if wanted is not None:
        if wanted in sendable:
            sendable = frozenset({wanted})
        else:
            notes.append(f"profile codec {wanted} not receivable by the viewer ({', '.join(sorted(sendable))})")
    selection = select_backend(probes, encoder_preference, sendable)
    return Selection(selection.backend, (*notes, *selection.reasons))


@dataclass(frozen=True, slots=True)
class ControlStep:
    """One control period's decisions: apply ``ladder.rung`` if it changed, and ``encoder_bps``.

    ``encoder_bps`` is the bitrate to give the encoder: ``bitrate.target_bps`` x the rate-match gain.
    """

    bitrate: BitrateDecision
    ladder: LadderDecision
    encoder_bps: int
    frame_load: float | None = None  # the frame thread's time per frame over the interval (the ladder's CPU input)

    def record(self, now_ms: int) -> dict[str, Any]:
        """A JSON-ready telemetry record of this step: target, reasons, rung and the signals used.

        Units: ``*_bps`` bits per second, ``*_ms`` milliseconds, ``loss`` the reported
        fraction lost (0..1), ``now_ms`` the caller's clock.
        """
        b, s, rung = self.bitrate, self.bitrate.signals, self.ladder.rung
        return {
            "now_ms": now_ms,
            "target_bps": b.target_bps,
            "encoder_bps": self.encoder_bps,
            "changed": b.changed,
            "reason": b.reason.value,
            "ladder_reason": self.ladder.reason.value,
            "rung": f"{rung.width}x{rung.height}@{rung.fps}",
            "rung_changed": self.ladder.changed,
            "remb_bps": s.remb_bps,
            "remb_cap_bps": s.remb_cap_bps,
            "send_rate_bps": s.send_rate_bps,
            "rtt_ms": round2(s.rtt_ms),
            "rtt_baseline_ms": round2(s.rtt_baseline_ms),
            "jitter_ms": round2(s.jitter_ms),
            "jitter_baseline_ms": round2(s.jitter_baseline_ms),
            "loss": round(s.loss_ratio, 4),
            "lost_packets_delta": s.lost_packets_delta,
            "capacity_bps": s.capacity_bps,
            "app_limited": s.app_limited,
            "fast": s.fast,
            "probe_rtt_ms": round2(s.probe_rtt_ms),
            "probe_rtt_baseline_ms": round2(s.probe_rtt_baseline_ms),
            "probe_threshold_ms": round2(s.probe_threshold_ms),
            "probe_floor_ms": round2(s.probe_floor_ms),
            "standing": s.standing,
            "recv_rate_bps": s.recv_rate_bps,
            "sent_matched_bps": s.sent_matched_bps,
            "frame_load": round2(self.frame_load),
        }


def round2(value: float | None) -> float | None:
    """Two decimals for telemetry (None stays None)."""
    return round(value, 2) if value is not None else None


# Rate match: the encoder gets target x gain, gain = 1 / its measured efficiency (send rate /
# the bitrate it was given), in [1, RATE_MATCH_MAX_GAIN].  The send rate is an average over
# RATE_MATCH_WINDOW_MS, so it is divided by the given bitrate's average over the same span: the
# lag cancels out.  Compared with the latest target instead, the send rate looked too high for
# half a second after every cut and the gain was pulled down to 1 (ABR lab, 8 Mbps: the gain fell
# 1.2 -> 1.0 after each cut and took 2-4 s to climb back, sending 80-90 % of the target meanwhile).
RATE_MATCH_WINDOW_MS: Final = 500  # streamer.media.session measures the send rate over this window
RATE_MATCH_MAX_GAIN: Final = 1.3  # x264 in a one-frame VBV sent 72-100 % of its bitrate on the lab
RATE_MATCH_TAU_MS: Final = 500  # the efficiency estimate is a moving average with this time constant
# ... except upwards past this share of the target: an encoder that suddenly spends all its bits
# (a complex scene) overshoots the target, and the path, until the gain comes down: at once.
RATE_MATCH_OVERSHOOT: Final = 1.03
# A target that moved more than this (highest / lowest) within the window is no steady state: the
# estimate may then only rise (less gain), never fall.  After a capacity drop cut the target from
# 9.7 to 2.4 Mbps in 200 ms, x264 sent 1.4 Mbps of the 2.4 for half a second; learnt as its
# efficiency, that took the gain to its cap, and once x264 recovered it sent 2.2 Mbps on the 2 Mbps
# path: a second overflow and a 1.9 s settle (ABR lab).
RATE_MATCH_STEADY_RATIO: Final = 1.25


def encoder_efficiency(
    efficiency: float,
    send_rate_bps: int | None,
    given_bps: float | None,
    target_bps: float | None,
    app_limited: bool,
    elapsed_ms: int,
    steady: bool = True,
) -> float:
    """The next estimate of the share of its bitrate the encoder sends.

    ``given_bps`` and ``target_bps``: the encoder bitrate and the target in force over the send
    rate's window, averaged.  Unchanged while nothing can be learnt (no rate, no time, or an
    application-limited encoder, whose low rate says nothing about its rate control).  Not
    ``steady`` (the target moved much within the window): only a rise is learnt.
    """
    if send_rate_bps is None or not given_bps or not target_bps or app_limited or elapsed_ms <= 0:
        return efficiency
    sample = min(1.0, max(1 / RATE_MATCH_MAX_GAIN, send_rate_bps / given_bps))
    if send_rate_bps > target_bps * RATE_MATCH_OVERSHOOT and sample > efficiency:
        return sample
    if not steady and sample < efficiency:
        return efficiency
    return efficiency + (sample - efficiency) * (1 - math.exp(-elapsed_ms / RATE_MATCH_TAU_MS))


def rate_match_gain(efficiency: float) -> float:
    """The encoder gain that makes an encoder of this efficiency send its target."""
    return min(RATE_MATCH_MAX_GAIN, max(1.0, 1 / efficiency))


def mean_target(history: Sequence[tuple[int, int]], now_ms: int, window_ms: int = RATE_MATCH_WINDOW_MS) -> float:
    """The time-weighted mean of a stepwise value over [now_ms - window_ms, now_ms].

    ``history`` holds (since_ms, value) steps, oldest first, non-empty; the first step is
    taken to hold before its own time as well (nothing older is known).
    """
    start = now_ms - window_ms
    total = 0.0
    for i, (since, value) in enumerate(history):
        until = history[i + 1][0] if i + 1 < len(history) else now_ms
        lo, hi = (start if i == 0 else max(start, since)), min(until, now_ms)
        if hi > lo:
            total += value * (hi - lo)
    return total / window_ms if window_ms > 0 else float(history[-1][1])


class StreamController:
    """Bitrate controller + quality ladder for one viewer: holds their states between decisions."""

    def __init__(self, profile: BitrateProfile, ladder: Ladder) -> None:
        self._bitrate = bitrate_policy.initial_state(profile)
        self._ladder = ladder_policy.initial_state(ladder, profile.start_bps)
        self.efficiency = 1.0  # the share of its bitrate the encoder sends (see encoder_efficiency)
        self.gain = 1.0  # rate match: 1 / efficiency, bounded (see rate_match_gain)
        self.last: ControlStep | None = None
        # (since_ms, target_bps) and (since_ms, encoder_bps) steps over the rate-match window
        self._targets: deque[tuple[int, int]] = deque()
        self._given: deque[tuple[int, int]] = deque()
        self._last_ms = 0  # the previous update's now_ms

    @property
    def rung(self) -> Rung:
        """The rung to encode at now."""
        return self._ladder.rung

    def set_ladder(self, ladder: Ladder) -> Rung:
        """Follow a new ladder (the screen was resized): start on its best rung the current target meets.

        The bitrate state is kept (the path did not change); the ladder's sustain timers restart.
        """
        self._ladder = ladder_policy.initial_state(ladder, self._bitrate.target_bps)
        return self._ladder.rung

    def update(self, feedback: Feedback, now_ms: int, frame_load: float | None = None) -> ControlStep:
        """Fold one period's feedback in (``now_ms``: a monotonic clock, milliseconds).

        ``frame_load``: the node's frame thread, wall time per frame over the frame interval (None:
        unknown).  It reaches the ladder only (``streamer.abr.ladder``): CPU lateness never moves the bitrate.
        """
        in_force = mean_target(self._targets, now_ms) if self._targets else None
        given = mean_target(self._given, now_ms) if self._given else None
        bitrate = bitrate_policy.decide(self._bitrate, feedback, now_ms)
        ladder = ladder_policy.decide(
            self._ladder, bitrate.target_bps, now_ms, app_limited=bitrate.signals.app_limited, frame_load=frame_load
        )
        elapsed_ms = now_ms - self._last_ms if self.last is not None else 0
        values = [v for _, v in self._targets]
        steady = not values or max(values) <= min(values) * RATE_MATCH_STEADY_RATIO
        self.efficiency = encoder_efficiency(
            self.efficiency, feedback.send_rate_bps, given, in_force, bitrate.signals.app_limited, elapsed_ms, steady
        )
        self.gain = rate_match_gain(self.efficiency)
        self._last_ms = now_ms
        self._bitrate, self._ladder = bitrate.state, ladder.state
        encoder_bps = round(bitrate.target_bps * self.gain)
        for steps, value in ((self._targets, bitrate.target_bps), (self._given, encoder_bps)):
            if not steps or steps[-1][1] != value:
                steps.append((now_ms, value))
            while len(steps) > 1 and steps[1][0] <= now_ms - RATE_MATCH_WINDOW_MS:
                steps.popleft()
        self.last = ControlStep(bitrate, ladder, encoder_bps, frame_load)
        return self.last
