"""Quality ladder: which (width, height, fps) rung to encode at, given the target bitrate.

Job: follow the bitrate controller's target with a ladder of rungs, best first, each with
a bitrate floor below which its picture falls apart. When the target stays below the
current rung's floor for `step_down_after_ms`, step down (straight to the best rung
whose floor the target meets, so one keyframe rather than several); when the target
stays at or above the next better rung's floor times `step_up_margin_percent` for
`step_up_after_ms`, step up one rung. The caller applies a changed rung with one
keyframe (decide, then apply: this module changes no encoder).

Rung floors are bits-per-pixel-per-frame based:
    floor_bps = width * height * fps * bits_per_pixel_milli // 1000
with 0.05 bit/pixel/frame for games (1080p60: 6.22 Mbps, 720p60: 2.76 Mbps) and 0.03 for
desktops, whose text and flat areas compress far better (1080p60: 3.73 Mbps).

Step-down orders: "keep_resolution" (desktops: text must stay sharp, drop fps
60 -> 30 -> 15) and "keep_fps" (games: motion must stay fluid, drop resolution
1080p -> 720p -> 540p -> 360p).

Concurrency model: none. `decide(state, target_bps, now_ms)` is a pure function: no
clock, no I/O, no asyncio; states and decisions are frozen values.

Application-limited streams: when the caller says the encoder is application-limited
(it sends far less than its target: a mostly idle desktop), a target below the floor is
not a reason to step down -- the content needs fewer bits than the floor, and the low
target usually comes from a REMB that followed our own low traffic, not from the path.
Such a sample holds the rung (reason "app_limited") and restarts the step-down timer.

Invariants:
  - Rung floors strictly decrease down the ladder.
  - No step down on an application-limited sample.
  - No flapping: after a step up the target was >= margin * floor of the new rung, so
    stepping back down needs a drop below that floor (a >23 % fall at 130 %), sustained.
  - Any sample that breaks a condition restarts its sustain timer; a change restarts both.
  - Time never goes backwards: `now_ms` lower than the previous update's raises.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from enum import StrEnum

GAME_BITS_PER_PIXEL_MILLI = 50  # 0.05 bit per pixel per frame
DESKTOP_BITS_PER_PIXEL_MILLI = 30  # 0.03 bit per pixel per frame
STEP_DOWN_AFTER_MS = 1_000  # target below the current floor this long -> step down
STEP_UP_AFTER_MS = 3_000  # target above margin * next floor this long -> step up
STEP_UP_MARGIN_PERCENT = 130  # hysteresis: step up only at >= 130 % of the next floor
MIN_FPS = 15  # keep_resolution halves fps down to this
STANDARD_HEIGHTS = (2160, 1440, 1080, 720, 540, 360)  # keep_fps rungs below the source
MIN_HEIGHT = 360


class LadderOrder(StrEnum):
    """What a step down gives up."""

    KEEP_RESOLUTION = "keep_resolution"  # desktops: drop fps
    KEEP_FPS = "keep_fps"  # games: drop resolution


class LadderReason(StrEnum):
    """Why a ladder decision is what it is. Values are stable strings for logs/metrics."""

    HOLD = "hold"  # target between the current floor and margin * next floor
    STEP_DOWN_PENDING = "step_down_pending"  # below the current floor, not for long enough
    STEP_DOWN = "step_down"
    STEP_UP_PENDING = "step_up_pending"  # above margin * next floor, not for long enough
    STEP_UP = "step_up"
    LOWEST_RUNG = "lowest_rung"  # below the floor but there is nothing lower
    APP_LIMITED = "app_limited"  # below the floor, but the encoder does not use its target: hold


@dataclass(frozen=True, slots=True)
class Rung:
    """One encoding setting and the lowest bitrate at which it is worth using."""

    width: int
    height: int
    fps: int
    floor_bps: int


@dataclass(frozen=True, slots=True)
class Ladder:
    """Rungs best first (strictly decreasing floors) and the hysteresis settings."""

    rungs: tuple[Rung, ...]
    order: LadderOrder
    step_down_after_ms: int = STEP_DOWN_AFTER_MS
    step_up_after_ms: int = STEP_UP_AFTER_MS
    step_up_margin_percent: int = STEP_UP_MARGIN_PERCENT

    def __post_init__(self) -> None:
        if not self.rungs:
            raise ValueError("a ladder needs at least one rung")
        floors = [r.floor_bps for r in self.rungs]
        if any(lower >= upper for upper, lower in itertools.pairwise(floors)):
            raise ValueError("rung floors must strictly decrease down the ladder")
        if self.step_up_margin_percent < 100:
            raise ValueError("step_up_margin_percent must be >= 100")
        if self.step_down_after_ms < 0 or self.step_up_after_ms < 0:
            raise ValueError("sustain times must be >= 0")


@dataclass(frozen=True, slots=True)
class LadderState:
    """Current rung index (0 = best) and when each pending condition started (or None)."""

    ladder: Ladder
    index: int
    below_since_ms: int | None = None
    above_since_ms: int | None = None
    last_update_ms: int | None = None

    @property
    def rung(self) -> Rung:
        """The current rung."""
        return self.ladder.rungs[self.index]


@dataclass(frozen=True, slots=True)
class LadderDecision:
    """The rung to encode at, whether it changed (apply with one keyframe), why, next state."""

    rung: Rung
    changed: bool
    reason: LadderReason
    state: LadderState = field(repr=False, compare=False)


def floor_bps(width: int, height: int, fps: int, bits_per_pixel_milli: int) -> int:
    """Bitrate floor of a rung: pixels per second times bits per pixel (in 1/1000 bit)."""
    return width * height * fps * bits_per_pixel_milli // 1000


def build_ladder(
    width: int,
    height: int,
    fps: int,
    order: LadderOrder,
    bits_per_pixel_milli: int,
    *,
    min_fps: int = MIN_FPS,
    min_height: int = MIN_HEIGHT,
) -> Ladder:
    """A ladder topped by the source mode (width x height at fps).

    keep_resolution: fps halves while it stays >= min_fps (60, 30, 15).
    keep_fps: the standard heights below the source down to min_height, widths keeping
    the source aspect ratio rounded to even (1920x1080 -> 1280x720, 960x540, 640x360).
    """
    modes = [(width, height, fps)]
    if order is LadderOrder.KEEP_RESOLUTION:
        rate = fps // 2
        while rate >= min_fps:
            modes.append((width, height, rate))
            rate //= 2
    else:
        for h in STANDARD_HEIGHTS:
            if min_height <= h < height:
                w = 2 * round(width * h / height / 2)
                modes.append((w, h, fps))
    rungs = tuple(Rung(w, h, f, floor_bps(w, h, f, bits_per_pixel_milli)) for w, h, f in modes)
    return Ladder(rungs=rungs, order=order)


def desktop_ladder(width: int = 1920, height: int = 1080, fps: int = 60) -> Ladder:
    """Desktop ladder: keep resolution, drop fps; 0.03 bit/pixel/frame floors."""
    return build_ladder(width, height, fps, LadderOrder.KEEP_RESOLUTION, DESKTOP_BITS_PER_PIXEL_MILLI)


def game_ladder(width: int = 1920, height: int = 1080, fps: int = 60) -> Ladder:
    """Game ladder: keep fps, drop resolution; 0.05 bit/pixel/frame floors."""
    return build_ladder(width, height, fps, LadderOrder.KEEP_FPS, GAME_BITS_PER_PIXEL_MILLI)


def initial_state(ladder: Ladder, target_bps: int | None = None) -> LadderState:
    """Start at the best rung whose floor `target_bps` meets (the top rung when None)."""
    index = 0 if target_bps is None else _best_index_for(ladder, target_bps)
    return LadderState(ladder=ladder, index=index)


def decide(state: LadderState, target_bps: int, now_ms: int, *, app_limited: bool = False) -> LadderDecision:
    """Fold the controller's latest target into the ladder state and pick the rung.

    ``app_limited``: the encoder sent far less than its target in the last period
    (``streamer.abr.bitrate.BitrateSignals.app_limited``); a target below the floor then holds.
    """
    if state.last_update_ms is not None and now_ms < state.last_update_ms:
        raise ValueError(f"now_ms {now_ms} is before the previous update {state.last_update_ms}")
    ladder = state.ladder
    index = state.index
    lowest = len(ladder.rungs) - 1

    if target_bps < ladder.rungs[index].floor_bps:
        if index == lowest:
            return _decision(state, index, LadderReason.LOWEST_RUNG, None, None, now_ms)
        if app_limited:
            return _decision(state, index, LadderReason.APP_LIMITED, None, None, now_ms)
        since = state.below_since_ms if state.below_since_ms is not None else now_ms
        if now_ms - since >= ladder.step_down_after_ms:
            new_index = max(index + 1, _best_index_for(ladder, target_bps))
            return _decision(state, new_index, LadderReason.STEP_DOWN, None, None, now_ms)
        return _decision(state, index, LadderReason.STEP_DOWN_PENDING, since, None, now_ms)

    if index > 0:
        next_floor = ladder.rungs[index - 1].floor_bps
        if target_bps * 100 >= next_floor * ladder.step_up_margin_percent:
            since = state.above_since_ms if state.above_since_ms is not None else now_ms
            if now_ms - since >= ladder.step_up_after_ms:
                return _decision(state, index - 1, LadderReason.STEP_UP, None, None, now_ms)
            return _decision(state, index, LadderReason.STEP_UP_PENDING, None, since, now_ms)

    return _decision(state, index, LadderReason.HOLD, None, None, now_ms)


def _best_index_for(ladder: Ladder, target_bps: int) -> int:
    """Index of the best rung whose floor target_bps meets, else the lowest rung."""
    for i, rung in enumerate(ladder.rungs):
        if target_bps >= rung.floor_bps:
            return i
    return len(ladder.rungs) - 1


def _decision(
    state: LadderState,
    index: int,
    reason: LadderReason,
    below_since_ms: int | None,
    above_since_ms: int | None,
    now_ms: int,
) -> LadderDecision:
    new_state = replace(
        state,
        index=index,
        below_since_ms=below_since_ms,
        above_since_ms=above_since_ms,
        last_update_ms=now_ms,
    )
    return LadderDecision(
        rung=new_state.rung,
        changed=index != state.index,
        reason=reason,
        state=new_state,
    )
