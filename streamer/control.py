"""Per-viewer stream control: which encoder to use, and the bitrate/ladder state between decisions (pure).

Job: ``choose_backend`` picks the encoder backend for a viewer from the probe
results, the node's encoder preference, the session profile's codec
preference and the codecs the viewer's offer can receive.
``StreamController`` holds the state of the two pure policies,
``streamer.bitrate.decide`` (target bitrate) and ``streamer.ladder.decide``
(resolution/fps rung), and feeds the first's target into the second; the
session runtime applies the resulting ``ControlStep`` (decide, then apply).
It also calibrates the encoder: ``encoder_bps`` = target x a gain that makes
the measured send rate meet the target (``rate_match_gain``: x264 steered
through a one-frame VBV spends about 82-86 % of its bitrate, since a frame under
its budget cannot lend the rest to the next).

Concurrency model: none.  No clock (time comes in as ``now_ms``), no I/O, no
asyncio, no aiortc or PyAV import; ``StreamController`` is a plain object
owned by one task.

Invariant: the chosen backend produces a codec aiortc can packetize and the
viewer offered; the ladder always sees the bitrate decision of the same step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from encoder.backends import AIORTC_VIDEO_CODECS, BACKENDS, Backend, ProbeResult
from encoder.select import Selection, select_backend
from streamer import bitrate as bitrate_policy
from streamer import ladder as ladder_policy
from streamer.bitrate import BitrateDecision, BitrateProfile, Feedback
from streamer.ladder import Ladder, LadderDecision, Rung

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
            "recv_rate_bps": s.recv_rate_bps,
        }


def round2(value: float | None) -> float | None:
    """Two decimals for telemetry (None stays None)."""
    return round(value, 2) if value is not None else None


# Rate match: the encoder gets target x gain, gain in [1, RATE_MATCH_MAX_GAIN], nudged each period
# while the encoder uses its bits (not application-limited) so the send rate meets the target.
# The send rate is an average over RATE_MATCH_WINDOW_MS, so it is compared with the target's
# average over the same span: against the latest target alone, the send rate looks too high for
# half a second after every cut and the gain was pulled down to 1 (ABR lab, 8 Mbps: the gain
# fell 1.2 -> 1.0 after each cut and took 4 s to climb back, sending 80 % of the target meanwhile).
RATE_MATCH_WINDOW_MS: Final = 500  # = streamer.session.SEND_RATE_WINDOW_S
RATE_MATCH_MAX_GAIN: Final = 1.3  # x264 in a one-frame VBV sent 82-84 % of its bitrate on the lab
RATE_MATCH_LOW: Final = 0.95  # send rate under 95 % of the target: raise the gain
RATE_MATCH_HIGH: Final = 1.0  # send rate over the target: lower it
RATE_MATCH_UP_PER_S: Final = 1.1  # the send rate lags by its window: rise slowly
RATE_MATCH_DOWN_PER_S: Final = 1.16  # at least; a bigger overshoot is undone in one step


def rate_match_gain(
    gain: float, target_bps: float | None, send_rate_bps: int | None, app_limited: bool, elapsed_ms: int
) -> float:
    """The next encoder gain, from the send rate measured under ``target_bps`` (the target in force
    over the send rate's window, averaged), ``elapsed_ms`` after the previous one.  Over the
    target, the gain falls by the overshoot (at least RATE_MATCH_DOWN_PER_S for the time
    elapsed), so an encoder that suddenly spends all its bits is reined in at once."""
    if target_bps is None or send_rate_bps is None or app_limited or target_bps <= 0 or elapsed_ms <= 0:
        return gain
    seconds = min(elapsed_ms, 1_000) / 1000
    ratio = send_rate_bps / target_bps
    if ratio < RATE_MATCH_LOW:
        return min(RATE_MATCH_MAX_GAIN, gain * RATE_MATCH_UP_PER_S**seconds)
    if ratio > RATE_MATCH_HIGH:
        return max(1.0, gain / max(RATE_MATCH_DOWN_PER_S**seconds, ratio))
    return gain


def mean_target(history: Sequence[tuple[int, int]], now_ms: int, window_ms: int = RATE_MATCH_WINDOW_MS) -> float:
    """The time-weighted mean of a stepwise target over [now_ms - window_ms, now_ms].

    ``history`` holds (since_ms, target_bps) steps, oldest first, non-empty; the first step is
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
        self.gain = 1.0  # rate match (see rate_match_gain)
        self.last: ControlStep | None = None
        self._targets: deque[tuple[int, int]] = deque()  # (since_ms, target_bps) over the rate-match window
        self._last_ms = 0  # the previous update's now_ms

    @property
    def rung(self) -> Rung:
        """The rung to encode at now."""
        return self._ladder.rung

    def update(self, feedback: Feedback, now_ms: int) -> ControlStep:
        """Fold one period's feedback in (``now_ms``: a monotonic clock, milliseconds)."""
        in_force = mean_target(self._targets, now_ms) if self._targets else None
        bitrate = bitrate_policy.decide(self._bitrate, feedback, now_ms)
        ladder = ladder_policy.decide(
            self._ladder, bitrate.target_bps, now_ms, app_limited=bitrate.signals.app_limited
        )
        elapsed_ms = now_ms - self._last_ms if self.last is not None else 0
        self.gain = rate_match_gain(
            self.gain, in_force, feedback.send_rate_bps, bitrate.signals.app_limited, elapsed_ms
        )
        self._last_ms = now_ms
        self._bitrate, self._ladder = bitrate.state, ladder.state
        if not self._targets or self._targets[-1][1] != bitrate.target_bps:
            self._targets.append((now_ms, bitrate.target_bps))
        while len(self._targets) > 1 and self._targets[1][0] <= now_ms - RATE_MATCH_WINDOW_MS:
            self._targets.popleft()
        self.last = ControlStep(bitrate, ladder, round(bitrate.target_bps * self.gain))
        return self.last
