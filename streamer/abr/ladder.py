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

CPU: the node's own frame time is an input of its own (``frame_load``: the frame thread's
wall time per frame -- capture or render, colour conversion, encode -- over the frame interval).
It never changes the bitrate: a late encoder is no congestion.  It moves the ladder instead: a load
of `CPU_OVERLOAD_LOAD` or more for `CPU_STEP_DOWN_AFTER_MS` steps down one rung (fewer pixels or
frames to make), and a step up waits until the better rung's projected load (this load x its pixel
rate over the current one's) is under `CPU_STEP_UP_LOAD`, so it does not climb back into overload.

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
  - A CPU step down is one rung; none while the frame load is unknown; an overload that goes on
    right after one needs `CPU_RESTEP_AFTER_MS` for the next.
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
# Frame load (wall time per frame / frame interval) at or over this is an overloaded node: frames
# start late (the frame thread skips the ticks it missed).  Sustained this long, step down one rung.
CPU_OVERLOAD_LOAD = 0.9
CPU_STEP_DOWN_AFTER_MS = 2_000
# An overload that goes on right after a CPU step down (within CPU_STEP_DOWN_AFTER_MS of it) needs this
# long for the next one: the machine may be busy with something else for a while, and a late frame
# thread waits for the CPU more than it works, so fewer pixels help less with each rung (a loaded
# 2-core test machine stepped 720p -> 540p -> 360p within 4 s of an 8 s load at 2 s).
CPU_RESTEP_AFTER_MS = 10_000
# Step up only when the better rung's projected load (this load x its pixel rate over this one's,
# 1.8-2.25x for keep_fps, 2x for keep_resolution) is under this: a margin under CPU_OVERLOAD_LOAD, so
# that a climb does not land in an overload (and step straight back down).  An idle 2-core node makes
# 720p60 at about 0.6 and 540p60 at about 0.35: 0.35 x 1.78 = 0.62 climbs.
CPU_STEP_UP_LOAD = 0.75


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
    CPU_STEP_DOWN_PENDING = "cpu_step_down_pending"  # the frame load is over CPU_OVERLOAD_LOAD, not for long enough
    CPU_STEP_DOWN = "cpu_step_down"  # one rung down: the node cannot make this rung's frames in time
    CPU_LIMITED = "cpu_limited"  # the target calls for a better rung the node's CPU cannot afford: hold


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
    overload_since_ms: int | None = None  # the frame load has been >= CPU_OVERLOAD_LOAD since
    cpu_step_ms: int | None = None  # the last CPU step down

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


def decide(
    state: LadderState, target_bps: int, now_ms: int, *, app_limited: bool = False, frame_load: float | None = None
) -> LadderDecision:
    """Fold the controller's latest target into the ladder state and pick the rung.

    ``app_limited``: the encoder sent far less than its target in the last period
    (``streamer.abr.bitrate.BitrateSignals.app_limited``); a target below the floor then holds.
    ``frame_load``: the frame thread's wall time per frame over the frame interval (None: unknown);
    it steps down one rung when sustained over `CPU_OVERLOAD_LOAD` and gates the steps up.
    """
    if state.last_update_ms is not None and now_ms < state.last_update_ms:
        raise ValueError(f"now_ms {now_ms} is before the previous update {state.last_update_ms}")
    ladder = state.ladder
    index = state.index
    lowest = len(ladder.rungs) - 1
    overloaded = frame_load is not None and frame_load >= CPU_OVERLOAD_LOAD
    over_since = (state.overload_since_ms if state.overload_since_ms is not None else now_ms) if overloaded else None

    if target_bps < ladder.rungs[index].floor_bps:
        if index == lowest:
            return _decision(state, index, LadderReason.LOWEST_RUNG, None, None, now_ms, over_since)
        if app_limited:
            return _decision(state, index, LadderReason.APP_LIMITED, None, None, now_ms, over_since)
        since = state.below_since_ms if state.below_since_ms is not None else now_ms
        if now_ms - since >= ladder.step_down_after_ms:
            new_index = max(index + 1, _best_index_for(ladder, target_bps))
            return _decision(state, new_index, LadderReason.STEP_DOWN, None, None, now_ms, None)
        return _decision(state, index, LadderReason.STEP_DOWN_PENDING, since, None, now_ms, over_since)

    if over_since is not None and index < lowest:
        stepped = state.cpu_step_ms
        sustain = CPU_STEP_DOWN_AFTER_MS
        if stepped is not None and over_since - stepped <= CPU_STEP_DOWN_AFTER_MS:
            sustain = CPU_RESTEP_AFTER_MS  # still overloaded after the last CPU step: give it time
        if now_ms - over_since >= sustain:
            step = _decision(state, index + 1, LadderReason.CPU_STEP_DOWN, None, None, now_ms, None)
            return replace(step, state=replace(step.state, cpu_step_ms=now_ms))
        return _decision(state, index, LadderReason.CPU_STEP_DOWN_PENDING, None, None, now_ms, over_since)

    if index > 0:
        next_floor = ladder.rungs[index - 1].floor_bps
        if target_bps * 100 >= next_floor * ladder.step_up_margin_percent:
            if frame_load is not None and frame_load * _pixel_rate_ratio(ladder, index) >= CPU_STEP_UP_LOAD:
                return _decision(state, index, LadderReason.CPU_LIMITED, None, None, now_ms, over_since)
            since = state.above_since_ms if state.above_since_ms is not None else now_ms
            if now_ms - since >= ladder.step_up_after_ms:
                return _decision(state, index - 1, LadderReason.STEP_UP, None, None, now_ms, None)
            return _decision(state, index, LadderReason.STEP_UP_PENDING, None, since, now_ms, over_since)

    return _decision(state, index, LadderReason.HOLD, None, None, now_ms, over_since)


def _pixel_rate_ratio(ladder: Ladder, index: int) -> float:
    """The next better rung's pixels per second over rung ``index``'s (what a step up costs the CPU)."""
    up, here = ladder.rungs[index - 1], ladder.rungs[index]
    return (up.width * up.height * up.fps) / (here.width * here.height * here.fps)


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
    overload_since_ms: int | None = None,
) -> LadderDecision:
    new_state = replace(
        state,
        index=index,
        below_since_ms=below_since_ms,
        above_since_ms=above_since_ms,
        last_update_ms=now_ms,
        overload_since_ms=overload_since_ms,
    )
    return LadderDecision(
        rung=new_state.rung,
        changed=index != state.index,
        reason=reason,
        state=new_state,
    )
