"""Table tests for the pure quality ladder: fake clock (plain integers), exact rungs."""

from __future__ import annotations

import pytest

from streamer.abr.ladder import (
    Ladder,
    LadderDecision,
    LadderOrder,
    LadderState,
    Rung,
    build_ladder,
    decide,
    desktop_ladder,
    floor_bps,
    game_ladder,
    initial_state,
)

GAME = game_ladder()  # floors: 1080p60 6_220_800, 720p60 2_764_800, 540p60 1_555_200, 360p60 691_200
DESKTOP = desktop_ladder()  # floors: 1080p60 3_732_480, 1080p30 1_866_240, 1080p15 933_120
UP_TO_1080P = 8_087_040  # 130 % of 6_220_800


def run(state: LadderState, steps: list[tuple[int, int]]) -> list[LadderDecision]:
    """Feed (now_ms, target_bps) steps in order; return every decision."""
    decisions = []
    for now_ms, target_bps in steps:
        decision = decide(state, target_bps, now_ms)
        decisions.append(decision)
        state = decision.state
    return decisions


def heights(decisions: list[LadderDecision]) -> list[int]:
    return [d.rung.height for d in decisions]


def at(ladder: Ladder, index: int) -> LadderState:
    return LadderState(ladder=ladder, index=index)


# --- construction -----------------------------------------------------------------------


def test_game_ladder_keeps_fps_and_drops_resolution() -> None:
    assert GAME.order == "keep_fps"
    assert GAME.rungs == (
        Rung(1920, 1080, 60, 6_220_800),
        Rung(1280, 720, 60, 2_764_800),
        Rung(960, 540, 60, 1_555_200),
        Rung(640, 360, 60, 691_200),
    )


def test_desktop_ladder_keeps_resolution_and_drops_fps() -> None:
    assert DESKTOP.order == "keep_resolution"
    assert DESKTOP.rungs == (
        Rung(1920, 1080, 60, 3_732_480),
        Rung(1920, 1080, 30, 1_866_240),
        Rung(1920, 1080, 15, 933_120),
    )


@pytest.mark.parametrize(
    ("width", "height", "fps", "order", "modes"),
    [
        (
            2560,
            1440,
            60,
            LadderOrder.KEEP_FPS,
            [(2560, 1440), (1920, 1080), (1280, 720), (960, 540), (640, 360)],
        ),
        (
            1920,
            1200,
            60,
            LadderOrder.KEEP_FPS,
            [(1920, 1200), (1728, 1080), (1152, 720), (864, 540), (576, 360)],
        ),
        (1280, 720, 30, LadderOrder.KEEP_FPS, [(1280, 720), (960, 540), (640, 360)]),
        (1920, 1080, 144, LadderOrder.KEEP_RESOLUTION, [(1920, 1080)] * 4),  # 144, 72, 36, 18 fps
    ],
)
def test_build_ladder(
    width: int, height: int, fps: int, order: LadderOrder, modes: list[tuple[int, int]]
) -> None:
    ladder = build_ladder(width, height, fps, order, bits_per_pixel_milli=50)
    assert [(r.width, r.height) for r in ladder.rungs] == modes
    if order is LadderOrder.KEEP_RESOLUTION:
        assert [r.fps for r in ladder.rungs] == [144, 72, 36, 18]


def test_floor_is_bits_per_pixel_per_frame() -> None:
    assert floor_bps(1920, 1080, 60, 50) == 6_220_800  # 1920*1080*60 * 0.05
    assert floor_bps(1280, 720, 30, 30) == 829_440


def test_ladder_validation() -> None:
    with pytest.raises(ValueError):
        Ladder(rungs=(), order=LadderOrder.KEEP_FPS)
    with pytest.raises(ValueError):
        Ladder(
            rungs=(Rung(640, 360, 60, 700_000), Rung(1280, 720, 60, 2_700_000)), order=LadderOrder.KEEP_FPS
        )
    with pytest.raises(ValueError):
        Ladder(rungs=GAME.rungs, order=LadderOrder.KEEP_FPS, step_up_margin_percent=90)


@pytest.mark.parametrize(
    ("target_bps", "height"),
    [(None, 1080), (30_000_000, 1080), (6_220_800, 1080), (3_000_000, 720), (1_555_200, 540), (100_000, 360)],
)
def test_initial_state_picks_best_rung_the_target_meets(target_bps: int | None, height: int) -> None:
    assert initial_state(GAME, target_bps).rung.height == height


# --- stepping down ----------------------------------------------------------------------


def test_sustained_drop_steps_down_after_one_second() -> None:
    decisions = run(at(GAME, 0), [(0, 6_000_000), (500, 6_000_000), (999, 6_000_000), (1_000, 6_000_000)])
    assert [d.reason for d in decisions] == ["step_down_pending"] * 3 + ["step_down"]
    assert heights(decisions) == [1080, 1080, 1080, 720]
    assert [d.changed for d in decisions] == [False, False, False, True]


def test_deep_drop_jumps_to_the_rung_the_target_meets_in_one_step() -> None:
    decisions = run(at(GAME, 0), [(0, 1_000_000), (1_000, 1_000_000)])
    assert (decisions[1].reason, decisions[1].rung) == ("step_down", Rung(640, 360, 60, 691_200))


def test_below_the_lowest_rung_stays() -> None:
    decisions = run(at(GAME, 3), [(0, 300_000), (5_000, 300_000)])
    assert [(d.reason, d.changed, d.rung.height) for d in decisions] == [("lowest_rung", False, 360)] * 2


def test_desktop_drops_fps_60_30_15() -> None:
    decisions = run(
        initial_state(DESKTOP), [(0, 2_000_000), (1_000, 2_000_000), (2_000, 1_000_000), (3_000, 1_000_000)]
    )
    assert [d.rung.fps for d in decisions] == [60, 30, 30, 15]
    assert {d.rung.height for d in decisions} == {1080}


def test_target_oscillating_around_a_floor_does_not_step_down() -> None:
    # below the 1080p floor for 500 ms at a time, never for the 1000 ms step-down time
    steps = [(t, 6_200_000 if (t // 500) % 2 else 6_300_000) for t in range(0, 20_000, 500)]
    decisions = run(at(GAME, 0), steps)
    assert not any(d.changed for d in decisions)
    assert {d.reason for d in decisions} == {"hold", "step_down_pending"}


# --- stepping up ------------------------------------------------------------------------


def test_sustained_recovery_steps_up_after_three_seconds() -> None:
    steps = [(t, UP_TO_1080P) for t in range(0, 3_500, 500)]
    decisions = run(at(GAME, 1), steps)
    assert [d.reason for d in decisions] == ["step_up_pending"] * 6 + ["step_up"]
    assert heights(decisions) == [720] * 6 + [1080]
    assert decisions[-1].changed is True


def test_recovery_below_the_margin_never_steps_up() -> None:
    decisions = run(at(GAME, 1), [(t, UP_TO_1080P - 1) for t in range(0, 30_000, 1_000)])
    assert {(d.reason, d.rung.height) for d in decisions} == {("hold", 720)}


def test_steps_up_one_rung_at_a_time() -> None:
    # each change restarts the timer at the next sample: 3 s from 0, then from 4_000, then from 8_000
    times = list(range(0, 12_000, 1_000))
    decisions = run(at(GAME, 3), [(t, 30_000_000) for t in times])
    changes = [(t, d.rung.height) for t, d in zip(times, decisions, strict=True) if d.changed]
    assert changes == [(3_000, 540), (7_000, 720), (11_000, 1080)]


def test_target_oscillating_above_the_margin_does_not_step_up() -> None:
    steps = [(t, UP_TO_1080P if (t // 1_000) % 2 else 8_000_000) for t in range(0, 30_000, 1_000)]
    decisions = run(at(GAME, 1), steps)
    assert not any(d.changed for d in decisions)


def test_no_flapping_after_a_step_up() -> None:
    # step up at 130 % of the 1080p floor, then the target sags 20 % (still above the floor)
    up = run(at(GAME, 1), [(t, 8_100_000) for t in range(0, 3_001, 1_000)])
    assert up[-1].reason == "step_up"
    after = run(up[-1].state, [(t, 6_480_000) for t in range(4_000, 30_000, 1_000)])
    assert {(d.reason, d.rung.height) for d in after} == {("hold", 1080)}


def test_change_restarts_the_sustain_timers() -> None:
    # below 1080p's floor since 0: step to 720p at 1_000; then below 720p's floor from 1_500:
    # the 1 s step-down time counts again from 1_500, not from 0
    steps = [(0, 6_000_000), (1_000, 6_000_000), (1_500, 2_000_000), (2_499, 2_000_000), (2_500, 2_000_000)]
    decisions = run(at(GAME, 0), steps)
    assert [d.reason for d in decisions] == [
        "step_down_pending",
        "step_down",
        "step_down_pending",
        "step_down_pending",
        "step_down",
    ]
    assert heights(decisions) == [1080, 720, 720, 720, 540]


def test_step_down_jumps_then_holds_when_the_target_meets_the_new_floor() -> None:
    decisions = run(
        at(GAME, 0), [(0, 2_000_000), (1_000, 2_000_000), (1_500, 2_000_000), (60_000, 2_000_000)]
    )
    assert [d.reason for d in decisions] == ["step_down_pending", "step_down", "hold", "hold"]
    assert heights(decisions) == [1080, 540, 540, 540]


def test_time_must_not_go_backwards() -> None:
    state = run(at(GAME, 0), [(1_000, 7_000_000)])[0].state
    with pytest.raises(ValueError):
        decide(state, 7_000_000, 999)


# --- application-limited encoder ------------------------------------------------------------


def run_flags(state: LadderState, steps: list[tuple[int, int, bool]]) -> list[LadderDecision]:
    """Feed (now_ms, target_bps, app_limited) steps in order; return every decision."""
    decisions = []
    for now_ms, target_bps, app_limited in steps:
        decision = decide(state, target_bps, now_ms, app_limited=app_limited)
        decisions.append(decision)
        state = decision.state
    return decisions


def test_app_limited_target_below_the_floor_holds_the_rung() -> None:
    # An idle desktop: the REMB followed its tiny traffic, the target sits at the profile minimum.
    decisions = run_flags(initial_state(DESKTOP), [(t, 300_000, True) for t in range(0, 10_001, 200)])
    assert {(d.reason, d.changed, d.rung.fps) for d in decisions} == {("app_limited", False, 60)}
    # The same targets from an encoder that uses its bits do step down (one jump to 15 fps).
    busy = run_flags(initial_state(DESKTOP), [(t, 300_000, False) for t in range(0, 1_001, 200)])
    assert [d.rung.fps for d in busy] == [60] * 5 + [15]


def test_app_limited_sample_restarts_the_step_down_timer() -> None:
    steps = [(0, 2_000_000, False), (800, 2_000_000, True), (1_000, 2_000_000, False), (1_999, 2_000_000, False)]
    steps.append((2_000, 2_000_000, False))
    decisions = run_flags(initial_state(DESKTOP), steps)
    assert [d.reason for d in decisions] == [
        "step_down_pending", "app_limited", "step_down_pending", "step_down_pending", "step_down",
    ]  # fmt: skip
    assert [d.rung.fps for d in decisions] == [60, 60, 60, 60, 30]


def test_app_limited_never_blocks_a_step_up() -> None:
    steps = [(t, UP_TO_1080P, True) for t in range(0, 3_001, 500)]
    decisions = run_flags(at(GAME, 1), steps)
    assert decisions[-1].reason == "step_up" and decisions[-1].rung.height == 1080


# --- CPU: the node's frame load ---------------------------------------------------------------


def run_load(state: LadderState, steps: list[tuple[int, int, float | None]]) -> list[LadderDecision]:
    """Feed (now_ms, target_bps, frame_load) steps in order; return every decision."""
    decisions = []
    for now_ms, target_bps, load in steps:
        decision = decide(state, target_bps, now_ms, frame_load=load)
        decisions.append(decision)
        state = decision.state
    return decisions


def test_an_overloaded_frame_thread_steps_down_one_rung_after_two_seconds_whatever_the_target() -> None:
    # 720p60 with a target that fits 1080p60 (no bitrate reason to move): load 0.95 for 2 s -> 540p,
    # one rung, not two; a sample under the threshold restarts the timer; still overloaded at 540p, a
    # further step needs 2 s more of it.
    steps = [(0, 5_000_000, 0.95), (1_000, 5_000_000, 0.8), (1_100, 5_000_000, 0.95), (3_099, 5_000_000, 1.4),
             (3_100, 5_000_000, 1.4), (3_200, 5_000_000, 1.4)]
    decisions = run_load(at(GAME, 1), steps)
    assert [str(d.reason) for d in decisions] == [
        "cpu_step_down_pending", "hold", "cpu_step_down_pending", "cpu_step_down_pending", "cpu_step_down",
        "cpu_step_down_pending",
    ]
    assert heights(decisions) == [720, 720, 720, 720, 540, 540]


def test_an_overload_that_goes_on_after_a_cpu_step_needs_ten_seconds_for_the_next() -> None:
    steps = [(0, 5_000_000, 1.5), (2_000, 5_000_000, 1.5)]  # 720p -> 540p
    steps += [(2_100, 5_000_000, 1.5), (11_999, 5_000_000, 1.5), (12_100, 5_000_000, 1.5)]
    decisions = run_load(at(GAME, 1), steps)
    assert [str(d.reason) for d in decisions] == [
        "cpu_step_down_pending", "cpu_step_down", "cpu_step_down_pending", "cpu_step_down_pending", "cpu_step_down",
    ]
    assert heights(decisions) == [720, 540, 540, 540, 360]
    # an overload that starts later than 2 s after the step is a new one: 2 s again
    later = run_load(decisions[1].state, [(4_200, 5_000_000, 0.5), (4_300, 5_000_000, 1.5), (6_300, 5_000_000, 1.5)])
    assert heights(later) == [540, 540, 360]


def test_a_step_up_waits_until_the_better_rungs_projected_load_fits() -> None:
    # 540p60 with a target over 130 % of 720p60's floor: 720p has 1280*720 / (960*540) = 1.78x the pixels.
    up = 2_764_800 * 130 // 100
    state = at(GAME, 2)
    held = run_load(state, [(0, up, 0.43), (3_000, up, 0.43)])  # 0.43 x 1.78 = 0.764: over 0.75
    assert [str(d.reason) for d in held] == ["cpu_limited", "cpu_limited"] and heights(held) == [540, 540]
    climbs = run_load(state, [(0, up, 0.42), (3_000, up, 0.42)])  # 0.747: it fits
    assert [str(d.reason) for d in climbs] == ["step_up_pending", "step_up"] and heights(climbs) == [540, 720]
    unknown = run_load(state, [(0, up, None), (3_000, up, None)])  # no load known: the bitrate decides alone
    assert heights(unknown) == [540, 720]


def test_the_lowest_rung_has_nowhere_to_go_and_a_bitrate_step_down_comes_first() -> None:
    lowest = run_load(at(GAME, 3), [(0, 1_000_000, 2.0), (5_000, 1_000_000, 2.0)])
    assert [str(d.reason) for d in lowest] == ["hold", "hold"]
    # under the floor and overloaded: the bitrate's step down (to the rung the target meets) wins
    both = run_load(at(GAME, 0), [(0, 2_000_000, 1.2), (1_000, 2_000_000, 1.2)])
    assert [str(d.reason) for d in both] == ["step_down_pending", "step_down"] and heights(both) == [1080, 540]
