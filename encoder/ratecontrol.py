"""Rate-control sizing and the live-bitrate-change policy (pure).

Job: turn a target bitrate and frame rate into the window a codec is opened
with (average bitrate, VBV maxrate and buffer, the highest target it can
follow live), state the keyframe size cap, and decide -- as a pure function
-- how a new target bitrate reaches an open encoder: live, live with a forced
IDR, by reopening the codec, or not at all (a change too small to be worth a
keyframe).

Concurrency model: none. Every function is a pure function of its
arguments; values are frozen dataclasses. No clock, no I/O, no PyAV import.

How x264 follows live changes (measured with x264 in PyAV 18 / FFmpeg 8.1,
and read from x264's ratecontrol.c): x264 cannot change its ABR target on an
open encoder, but when opened "CBR-like" (maxrate == bitrate) every new
``ctx.bit_rate`` becomes the new VBV maxrate, and a VBV buffer given smaller
than one frame is clamped to exactly one frame of the *current* maxrate. So
we open x264 at a ceiling (``headroom`` x target, maxrate == bitrate, a tiny
bufsize) and steer it live through the VBV: one frame of buffer at every
rate, both directions, no keyframe. Its single-frame VBV undershoots, so the
VBV rate is the target times ``rate_factor`` (1.25 for x264, measured: output
0.7-1.0 x target, keyframes <= 1.2 frames).

Invariants:
- the VBV buffer is about one frame (``VBV_FRAMES``), so no frame -- a
  keyframe included -- bursts much beyond one frame's share; aiortc has no
  send pacer, so this is what keeps keyframes from leaving as a burst;
- a live change never leaves the buffer larger than ``LIVE_MAX_VBV_FRAMES``
  frames of the new target (below the ``KEYFRAME_CAP_FRAMES`` cap);
  outside the live window the codec is reopened, which costs one keyframe
  and says so in the decision.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

# Bounds for any target bitrate we accept (bits per second).
MIN_BITRATE_BPS = 100_000
MAX_BITRATE_BPS = 100_000_000

# A keyframe may use at most this many frames' share of the target bitrate:
# cap_bytes = KEYFRAME_CAP_FRAMES * bitrate_bps / fps / 8.
KEYFRAME_CAP_FRAMES = 4.0

# VBV buffer size in frames of the target bitrate (bufsize_bits = VBV_FRAMES * bitrate / fps).
VBV_FRAMES = 1.0

# x264 is opened with this bufsize (bits): below one frame at any rate we use,
# so x264 clamps it to exactly one frame of the current VBV maxrate.
X264_CLAMPED_BUFSIZE_BITS = 1_000

# Live changes (BitrateChange.LIVE) are followed down to ceiling * LIVE_MIN_FRACTION
# (x264 measured following 10x below its open ceiling); below that, reopen.
LIVE_MIN_FRACTION = 0.1

# For a fixed-size VBV buffer (NVENC): a live decrease is allowed while the buffer
# stays at most this many frames of the new bitrate (below KEYFRAME_CAP_FRAMES).
LIVE_MAX_VBV_FRAMES = 3.0

# For backends where any change costs a keyframe, ignore changes smaller than
# this fraction of the current bitrate (REMB jitters by a few percent).
KEYFRAME_CHANGE_DEADBAND = 0.15


class BitrateChange(enum.Enum):
    """How a backend follows a new target bitrate on an open context."""

    LIVE = "live"  # ctx.bit_rate change followed from the next frame, no keyframe
    LIVE_IDR = "live_idr"  # followed from the next frame, but the encoder emits an IDR
    REOPEN = "reopen"  # live changes are ignored: reopen the codec (first frame is a keyframe)


class Action(enum.Enum):
    """What the encoder does with a new target bitrate."""

    NONE = "none"  # same bitrate as now
    LIVE = "live"
    LIVE_IDR = "live_idr"
    REOPEN = "reopen"
    HOLD = "hold"  # change too small to be worth a keyframe: keep the current rate


@dataclass(frozen=True)
class RateControl:
    """The rate-control window of an open encoder.

    ``bitrate_bps`` is the current target. ``ceiling_bps`` (highest target
    followed live), ``headroom`` and ``rate_factor`` were fixed when the codec
    was opened. The codec itself is given ``codec_bitrate_bps``.
    """

    bitrate_bps: int  # target average bitrate, bits per second
    ceiling_bps: int  # highest target the open codec can follow live
    bufsize_bits: int  # VBV buffer the codec is opened with: VBV_FRAMES frames of the target at open
    fps: float
    headroom: float = 1.0  # ceiling / target at open; reused when reopening
    rate_factor: float = 1.0  # codec (VBV) rate = target * rate_factor

    @property
    def codec_bitrate_bps(self) -> int:
        """The value written to ``ctx.bit_rate`` for the current target."""
        return int(self.bitrate_bps * self.rate_factor)

    @property
    def open_bitrate_bps(self) -> int:
        """Bitrate (and maxrate) the codec is opened with: the ceiling's codec rate."""
        return int(self.ceiling_bps * self.rate_factor)

    @property
    def frame_budget_bytes(self) -> float:
        """One frame's share of the target bitrate, in bytes."""
        return frame_budget_bytes(self.bitrate_bps, self.fps)

    @property
    def keyframe_cap_bytes(self) -> int:
        """Largest keyframe we accept at the current target, in bytes."""
        return keyframe_cap_bytes(self.bitrate_bps, self.fps)


@dataclass(frozen=True)
class BitrateDecision:
    """A decided bitrate change: what to do, the resulting window, and why."""

    action: Action
    rate: RateControl
    costs_keyframe: bool
    reason: str


def clamp_bitrate(bitrate_bps: int) -> int:
    """Clamp a requested bitrate to [MIN_BITRATE_BPS, MAX_BITRATE_BPS]."""
    return max(MIN_BITRATE_BPS, min(MAX_BITRATE_BPS, int(bitrate_bps)))


def frame_budget_bytes(bitrate_bps: int, fps: float) -> float:
    """Bytes per frame at ``bitrate_bps`` and ``fps``."""
    return bitrate_bps / fps / 8.0


def keyframe_cap_bytes(bitrate_bps: int, fps: float) -> int:
    """Keyframe size cap in bytes: KEYFRAME_CAP_FRAMES frames' share of the bitrate."""
    return int(KEYFRAME_CAP_FRAMES * frame_budget_bytes(bitrate_bps, fps))


def open_rate_control(bitrate_bps: int, fps: float, headroom: float = 1.0, rate_factor: float = 1.0) -> RateControl:
    """The window a codec is opened with for target ``bitrate_bps`` at ``fps``."""
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if headroom < 1.0 or rate_factor <= 0.0:
        raise ValueError(f"need headroom >= 1 and rate_factor > 0, got {headroom}, {rate_factor}")
    target = clamp_bitrate(bitrate_bps)
    ceiling = min(MAX_BITRATE_BPS, int(target * headroom))
    bufsize = max(1, int(VBV_FRAMES * target / fps))
    return RateControl(target, ceiling, bufsize, fps, headroom, rate_factor)


def _reopen(current: RateControl, target: int, why: str) -> BitrateDecision:
    rate = open_rate_control(target, current.fps, current.headroom, current.rate_factor)
    return BitrateDecision(Action.REOPEN, rate, True, f"reopen at {target} bps: {why} (costs a keyframe)")


def plan_bitrate_change(current: RateControl, new_bps: int, mode: BitrateChange) -> BitrateDecision:
    """Decide how an open encoder with window ``current`` follows ``new_bps``.

    Pure: the caller applies the decision (write ``decision.rate``'s codec
    bitrate to ``ctx.bit_rate``, or reopen with ``decision.rate``) and logs
    ``decision.reason``.
    """
    target = clamp_bitrate(new_bps)
    clamped = "" if target == new_bps else f" (clamped from {new_bps})"
    if target == current.bitrate_bps:
        return BitrateDecision(Action.NONE, current, False, f"bitrate already {target} bps{clamped}")

    change = abs(target - current.bitrate_bps) / current.bitrate_bps
    if mode is not BitrateChange.LIVE and change < KEYFRAME_CHANGE_DEADBAND:
        return BitrateDecision(
            Action.HOLD,
            current,
            False,
            f"hold {current.bitrate_bps} bps: change to {target}{clamped} is {change:.0%}, under the "
            f"{KEYFRAME_CHANGE_DEADBAND:.0%} deadband for a backend where a change costs a keyframe",
        )
    if mode is BitrateChange.REOPEN:
        return _reopen(current, target, f"backend ignores live bitrate changes{clamped}")

    if mode is BitrateChange.LIVE:
        if target > current.ceiling_bps:
            return _reopen(current, target, f"above the open ceiling {current.ceiling_bps} bps{clamped}")
        if target < current.ceiling_bps * LIVE_MIN_FRACTION:
            return _reopen(
                current,
                target,
                f"below {LIVE_MIN_FRACTION:g} x the open ceiling {current.ceiling_bps} bps{clamped}",
            )
        return BitrateDecision(
            Action.LIVE,
            replace(current, bitrate_bps=target),
            False,
            f"live change {current.bitrate_bps} -> {target} bps{clamped} "
            f"(ceiling {current.ceiling_bps} bps, one-frame VBV)",
        )

    # LIVE_IDR: the VBV buffer stays the size (in bits) it was opened with.
    vbv_frames = current.bufsize_bits * current.fps / target
    if vbv_frames > LIVE_MAX_VBV_FRAMES:
        return _reopen(
            current,
            target,
            f"the open VBV buffer would be {vbv_frames:.1f} frames (> {LIVE_MAX_VBV_FRAMES:g}) and let "
            f"keyframes exceed the cap{clamped}",
        )
    return BitrateDecision(
        Action.LIVE_IDR,
        replace(current, bitrate_bps=target),
        True,
        f"live change {current.bitrate_bps} -> {target} bps{clamped}: the encoder resets and emits an IDR",
    )
