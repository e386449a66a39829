"""Table tests for the pure bitrate controller: fake clock (plain integers), exact numbers.

Size: about 760 lines of table tests for one pure function, one test per behaviour, grouped by stage.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import streamer.abr.bitrate as bitrate_module
from streamer.abr.bitrate import (
    DESKTOP_PROFILE,
    GAME_PROFILE,
    BitrateDecision,
    BitrateProfile,
    BitrateState,
    Feedback,
    decide,
    initial_state,
    jitter_ms_from_rtp,
    remb_cap_bps,
)

PROFILE = BitrateProfile("test", min_bps=100_000, max_bps=50_000_000, start_bps=1_000_000)
CLEAN = Feedback(fraction_lost=0, jitter_ms=3.0, rtt_ms=50.0)  # additive rate: 9600*1000//150 = 64_000


def run(steps: list[tuple[int, Feedback]], state: BitrateState | None = None) -> list[BitrateDecision]:
    """Feed (now_ms, feedback) steps in order; return every decision."""
    state = state if state is not None else initial_state(PROFILE)
    decisions = []
    for now_ms, feedback in steps:
        decision = decide(state, feedback, now_ms)
        decisions.append(decision)
        state = decision.state
    return decisions


def targets(decisions: list[BitrateDecision]) -> list[int]:
    return [d.target_bps for d in decisions]


def reasons(decisions: list[BitrateDecision]) -> list[str]:
    return [str(d.reason) for d in decisions]


# --- start ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "feedback", "target", "reason"),
    [
        (PROFILE, CLEAN, 1_000_000, "start"),
        (DESKTOP_PROFILE, Feedback(), 2_000_000, "start"),
        (GAME_PROFILE, Feedback(), 5_000_000, "start"),
        (GAME_PROFILE, Feedback(remb_bps=3_000_000), 2_550_000, "remb_cap"),
        (DESKTOP_PROFILE, Feedback(remb_bps=200_000), 300_000, "min_clamp"),
    ],
)
def test_first_decision(profile: BitrateProfile, feedback: Feedback, target: int, reason: str) -> None:
    decision = decide(initial_state(profile), feedback, 0)
    assert (decision.target_bps, decision.reason, decision.changed) == (target, reason, True)


def test_profile_constants() -> None:
    assert (DESKTOP_PROFILE.min_bps, DESKTOP_PROFILE.max_bps) == (300_000, 8_000_000)
    assert (GAME_PROFILE.min_bps, GAME_PROFILE.max_bps) == (1_000_000, 25_000_000)


# --- ramp-up ----------------------------------------------------------------------------


def test_multiplicative_ramp_is_8_percent_per_second() -> None:
    decisions = run([(t, CLEAN) for t in range(0, 6_000, 1_000)])
    assert targets(decisions) == [1_000_000, 1_080_000, 1_166_400, 1_259_712, 1_360_488, 1_469_327]
    assert reasons(decisions) == ["start"] + ["ramp_multiplicative"] * 5


def test_multiplicative_ramp_in_half_second_steps() -> None:
    # alpha = 1.08 ** 0.5 per step, truncated to whole bps: ~8 %/s whatever the report rate
    decisions = run([(t, CLEAN) for t in range(0, 2_500, 500)])
    assert targets(decisions) == [1_000_000, 1_039_230, 1_079_999, 1_122_367, 1_166_398]


def test_feedback_gap_counts_at_most_one_second() -> None:
    decisions = run([(0, CLEAN), (5_000, CLEAN)])
    assert targets(decisions) == [1_000_000, 1_080_000]


def test_timer_update_without_feedback_ramps_on_latest_signals() -> None:
    decisions = run([(0, CLEAN), (1_000, Feedback())])
    assert (decisions[1].target_bps, decisions[1].reason) == (1_080_000, "ramp_multiplicative")


def test_same_millisecond_update_holds() -> None:
    decisions = run([(0, CLEAN), (1_000, CLEAN), (1_000, CLEAN)])
    assert targets(decisions) == [1_000_000, 1_080_000, 1_080_000]
    assert reasons(decisions)[2] == "hold"
    assert decisions[2].changed is False


# --- delay signal -----------------------------------------------------------------------


def test_jitter_rise_backs_off_before_any_loss() -> None:
    high_jitter = Feedback(fraction_lost=0, jitter_ms=20.0, rtt_ms=50.0)  # baseline 3 + 10 < 20
    decisions = run(
        [
            (0, CLEAN),
            (1_000, CLEAN),
            (2_000, high_jitter),
            (3_000, high_jitter),
            (4_000, CLEAN),
            (5_000, CLEAN),
        ]
    )
    assert reasons(decisions) == [
        "start",
        "ramp_multiplicative",
        "hold",  # one high sample: stop ramping, do not cut
        "delay_backoff",  # second consecutive high sample: 85 % of 1_080_000
        "ramp_additive",  # 700 ms after the 300 ms hold, +64_000 bps/s near capacity
        "ramp_additive",
    ]
    assert targets(decisions) == [1_000_000, 1_080_000, 1_080_000, 918_000, 962_800, 1_026_800]
    assert all(d.signals.fraction_lost == 0 and d.signals.loss_ratio == 0.0 for d in decisions)
    cut = decisions[3].signals
    assert (cut.jitter_ms, cut.jitter_baseline_ms, cut.capacity_bps) == (20.0, 3.0, 1_080_000)


def test_rtt_rise_backs_off() -> None:
    # threshold is baseline + max(25 ms, 25 % of baseline) = 65 ms above a 40 ms baseline
    decisions = run(
        [
            (0, Feedback(fraction_lost=0, rtt_ms=40.0)),
            (1_000, Feedback(fraction_lost=0, rtt_ms=65.0)),
            (2_000, Feedback(fraction_lost=0, rtt_ms=70.0)),
            (3_000, Feedback(fraction_lost=0, rtt_ms=80.0)),
        ]
    )
    assert reasons(decisions) == ["start", "ramp_multiplicative", "hold", "delay_backoff"]
    assert targets(decisions) == [1_000_000, 1_080_000, 1_080_000, 918_000]
    assert decisions[3].state.hold_until_ms == 3_300  # max(300 ms, 80 ms RTT)


def test_single_noisy_jitter_sample_never_cuts() -> None:
    spike = Feedback(fraction_lost=0, jitter_ms=30.0, rtt_ms=50.0)
    decisions = run([(0, CLEAN), (1_000, CLEAN), (2_000, spike), (3_000, CLEAN), (4_000, CLEAN)])
    assert targets(decisions) == [1_000_000, 1_080_000, 1_080_000, 1_166_400, 1_259_712]
    assert reasons(decisions) == [
        "start",
        "ramp_multiplicative",
        "hold",
        "ramp_multiplicative",
        "ramp_multiplicative",
    ]


def test_isolated_spikes_between_normal_samples_never_cut() -> None:
    spike = Feedback(fraction_lost=0, jitter_ms=30.0, rtt_ms=50.0)
    steps = [(t, spike if (t // 1_000) % 2 else CLEAN) for t in range(0, 10_000, 1_000)]
    decisions = run(steps)
    assert "delay_backoff" not in reasons(decisions)
    assert targets(decisions) == sorted(targets(decisions))  # never decreases


@pytest.mark.parametrize(
    ("send_rate_bps", "target"),
    [
        (None, 850_000),  # no send rate: 85 % of the target
        (900_000, 765_000),  # the path carried 900 kbps: 85 % of that
        (1_200_000, 850_000),  # never above the target it replaces
        (500_000, 425_000),  # exactly half the target still counts as path evidence
        (400_000, 850_000),  # under half: application-limited, say nothing of the path
    ],
)
def test_delay_backoff_base(send_rate_bps: int | None, target: int) -> None:
    high = Feedback(fraction_lost=0, jitter_ms=20.0, rtt_ms=50.0, send_rate_bps=send_rate_bps)
    decisions = run([(0, CLEAN), (500, high), (500, high)])
    assert (decisions[2].target_bps, decisions[2].reason) == (target, "delay_backoff")


def test_baseline_window_adopts_a_persistent_new_jitter_level() -> None:
    high = Feedback(fraction_lost=0, jitter_ms=20.0, rtt_ms=50.0)
    decisions = run([(0, CLEAN)] + [(t, high) for t in range(1_000, 11_000, 1_000)])
    # each cut resets the persistence count: a new cut needs two fresh high samples
    assert reasons(decisions) == [
        "start",
        "hold",
        "delay_backoff",
        "hold",
        "delay_backoff",
        "hold",
        "delay_backoff",
        "hold",
        "delay_backoff",
        "hold",
        "ramp_additive",  # t=10_000: the 3 ms sample left the 10 s window; 20 ms is the baseline
    ]
    assert decisions[-1].signals.jitter_baseline_ms == 20.0


# --- loss signal ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction_lost", "target", "reason"),
    [
        (0, 1_080_000, "ramp_multiplicative"),
        (5, 1_080_000, "ramp_multiplicative"),  # 1.95 % < 2 %: increase
        (6, 1_000_000, "hold"),  # 2.34 %: hold
        (25, 1_000_000, "hold"),  # 9.77 %: hold
        (26, 949_218, "loss_backoff"),  # 10.16 %: 1e6 * (1 - 0.5 * 26/256)
        (64, 875_000, "loss_backoff"),  # 25 %
        (128, 750_000, "loss_backoff"),  # 50 %
        (255, 501_953, "loss_backoff"),  # 99.6 %
    ],
)
def test_loss_table(fraction_lost: int, target: int, reason: str) -> None:
    feedback = Feedback(fraction_lost=fraction_lost, jitter_ms=3.0, rtt_ms=50.0)
    decisions = run([(0, CLEAN), (1_000, feedback)])
    assert (decisions[1].target_bps, decisions[1].reason) == (target, reason)
    assert decisions[1].signals.loss_ratio == fraction_lost / 256


def test_loss_burst_cuts_once_then_holds_one_rtt() -> None:
    clean = Feedback(fraction_lost=0, jitter_ms=3.0, rtt_ms=500.0)  # additive: 9600*1000//600 = 16_000
    burst = Feedback(fraction_lost=64, jitter_ms=3.0, rtt_ms=500.0)
    decisions = run([(0, clean), (1_000, burst), (1_200, burst), (1_400, clean), (1_500, clean), (2_000, clean)])
    assert reasons(decisions) == ["start", "loss_backoff", "hold", "hold", "hold", "ramp_additive"]
    # one cut per hold (max(300 ms, 500 ms RTT)); ramp counts only time after the hold
    assert targets(decisions) == [1_000_000, 875_000, 875_000, 875_000, 875_000, 883_000]


def test_stale_loss_blocks_increase_but_does_not_cut_again() -> None:
    burst = Feedback(fraction_lost=128, jitter_ms=3.0, rtt_ms=50.0)
    decisions = run([(0, CLEAN), (1_000, burst), (2_000, Feedback()), (3_000, Feedback())])
    assert reasons(decisions) == ["start", "loss_backoff", "hold", "hold"]
    assert targets(decisions) == [1_000_000, 750_000, 750_000, 750_000]


def test_far_below_capacity_ramps_multiplicatively_then_additively() -> None:
    burst = Feedback(fraction_lost=128, jitter_ms=3.0, rtt_ms=50.0)
    decisions = run([(0, CLEAN), (1_000, burst)] + [(t, CLEAN) for t in range(2_000, 6_000, 1_000)])
    assert reasons(decisions) == [
        "start",
        "loss_backoff",  # 750_000, capacity 1_000_000: below the +-20 % band
        "ramp_multiplicative",  # 700 ms after the hold: * 1.08 ** 0.7
        "ramp_multiplicative",
        "ramp_additive",  # 854_832 >= 80 % of capacity: near it, +64_000 bps/s
        "ramp_additive",
    ]
    assert targets(decisions) == [1_000_000, 750_000, 791_512, 854_832, 918_832, 982_832]


def test_capacity_is_forgotten_above_its_band() -> None:
    state = run([(0, CLEAN)])[0].state
    state = replace(state, target_bps=1_190_000, capacity_bps=1_000_000)
    decisions = run([(1_000, CLEAN), (2_000, CLEAN)], state)
    assert reasons(decisions) == ["ramp_additive", "ramp_multiplicative"]
    assert targets(decisions) == [1_254_000, 1_354_320]
    assert decisions[0].signals.capacity_bps is None


def test_cumulative_loss_is_reported_as_a_delta() -> None:
    decisions = run([(0, Feedback(cumulative_lost=10)), (1_000, Feedback(cumulative_lost=25))])
    assert [d.signals.lost_packets_delta for d in decisions] == [None, 15]


# --- REMB and profile bounds ------------------------------------------------------------


def test_remb_caps_with_headroom_after_a_fall_then_is_a_probe_ceiling() -> None:
    remb = Feedback(remb_bps=1_200_000, fraction_lost=0, jitter_ms=3.0, rtt_ms=50.0)
    decisions = run([(t, remb) for t in range(0, 13_000, 1_000)])
    # the first REMB, with no send rate to compare, counts as a fall: 85 % of it for REMB_TRUST_MS
    assert targets(decisions)[:5] == [1_000_000, 1_020_000, 1_020_000, 1_020_000, 1_020_000]
    assert reasons(decisions)[1:5] == ["remb_cap"] * 4
    assert remb_cap_bps(1_200_000) == 1_020_000 and decisions[4].signals.remb_cap_bps == 1_020_000
    # 5 s later the REMB has not fallen again: the target probes above it, up to 120 % of it
    assert reasons(decisions)[5:9] == ["ramp_multiplicative"] * 4
    assert targets(decisions)[5:] == [
        1_101_600,
        1_189_728,
        1_284_906,
        1_387_698,
        1_440_000,
        1_440_000,
        1_440_000,
        1_440_000,
    ]
    assert reasons(decisions)[9:] == ["remb_cap"] * 4
    assert decisions[12].signals.remb_cap_bps == remb_cap_bps(1_200_000, False) == 1_440_000
    # a REMB under 90 % of the highest since the fall is a new fall: the headroom cap at once
    fall = run([(13_000, replace(remb, remb_bps=1_000_000))], decisions[-1].state)[0]
    assert (fall.target_bps, fall.reason) == (850_000, "remb_cap")
    # a first REMB at or above 90 % of the send rate measures our own traffic: no fall, probe ceiling
    measured = run([(0, Feedback()), (200, Feedback(remb_bps=950_000, send_rate_bps=1_000_000))])[1]
    assert measured.signals.remb_cap_bps == 1_140_000 and measured.reason == "ramp_multiplicative"
    first_low = run([(0, Feedback()), (200, Feedback(remb_bps=890_000, send_rate_bps=1_000_000))])[1]
    assert (first_low.target_bps, first_low.reason) == (756_500, "remb_cap")


def test_remb_drop_applies_immediately() -> None:
    decisions = run([(0, CLEAN), (1_000, CLEAN), (1_100, Feedback(remb_bps=1_000_000))])
    assert (decisions[2].target_bps, decisions[2].reason) == (850_000, "remb_cap")
    assert decisions[2].signals.remb_cap_bps == 850_000


def test_max_clamp() -> None:
    profile = BitrateProfile("custom", min_bps=500_000, max_bps=1_200_000, start_bps=1_000_000)
    decisions = run([(t, CLEAN) for t in range(0, 5_000, 1_000)], initial_state(profile))
    assert targets(decisions) == [1_000_000, 1_080_000, 1_166_400, 1_200_000, 1_200_000]
    assert reasons(decisions) == [
        "start",
        "ramp_multiplicative",
        "ramp_multiplicative",
        "max_clamp",
        "max_clamp",
    ]


def test_min_clamp_under_heavy_loss_and_low_remb() -> None:
    burst = Feedback(fraction_lost=255, jitter_ms=3.0, rtt_ms=50.0)
    decisions = run([(0, CLEAN)] + [(t, burst) for t in (1_000, 2_000, 3_000)], initial_state(DESKTOP_PROFILE))
    assert targets(decisions) == [2_000_000, 1_003_906, 503_913, 300_000]
    assert reasons(decisions) == ["start", "loss_backoff", "loss_backoff", "min_clamp"]
    # a REMB whose cap is below the minimum: the minimum wins (the ladder steps down instead)
    low = run([(4_000, Feedback(remb_bps=100_000))], decisions[-1].state)[0]
    assert (low.target_bps, low.reason) == (300_000, "min_clamp")


def test_invariants_hold_on_random_feedback() -> None:
    rng = random.Random(7)
    for profile in (DESKTOP_PROFILE, GAME_PROFILE):
        state = initial_state(profile)
        now_ms = 0
        for _ in range(2_000):
            now_ms += rng.randrange(0, 1_500)
            feedback = Feedback(
                remb_bps=rng.choice([None, rng.randrange(100_000, 40_000_000)]),
                fraction_lost=rng.choice([None, 0, 0, 0, rng.randrange(256)]),
                jitter_ms=rng.choice([None, rng.uniform(0.0, 60.0)]),
                rtt_ms=rng.choice([None, rng.uniform(5.0, 400.0)]),
                send_rate_bps=rng.choice([None, rng.randrange(0, 30_000_000)]),
            )
            decision = decide(state, feedback, now_ms)
            assert profile.min_bps <= decision.target_bps <= profile.max_bps
            cap = decision.signals.remb_cap_bps
            if cap is not None and cap >= profile.min_bps:
                assert decision.target_bps <= cap
            if decision.target_bps > state.target_bps and state.started:
                # only a ramp raises the target (possibly limited by the REMB cap or the maximum)
                assert decision.reason in ("ramp_multiplicative", "ramp_additive", "remb_cap", "max_clamp")
            state = decision.state


# --- purity and validation --------------------------------------------------------------


def test_decide_is_pure() -> None:
    state = run([(0, CLEAN)])[0].state
    first = decide(state, CLEAN, 1_000)
    second = decide(state, CLEAN, 1_000)
    assert first == second
    assert state.target_bps == 1_000_000  # the input state is untouched


@pytest.mark.parametrize(
    "kwargs",
    [{"fraction_lost": 256}, {"fraction_lost": -1}, {"remb_bps": -1}, {"rtt_ms": -1.0}, {"jitter_ms": -0.5}],
)
def test_feedback_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Feedback(**kwargs)  # type: ignore[arg-type]


def test_profile_validation() -> None:
    with pytest.raises(ValueError):
        BitrateProfile("bad", min_bps=2_000_000, max_bps=1_000_000, start_bps=1_500_000)
    with pytest.raises(ValueError):
        BitrateProfile("bad", min_bps=0, max_bps=1_000_000, start_bps=500_000)


def test_time_must_not_go_backwards() -> None:
    state = run([(1_000, CLEAN)])[0].state
    with pytest.raises(ValueError):
        decide(state, CLEAN, 999)


def test_jitter_conversion() -> None:
    assert jitter_ms_from_rtp(900) == 10.0
    assert jitter_ms_from_rtp(480, clock_rate_hz=48_000) == 10.0


# --- application-limited sender -----------------------------------------------------------


def test_send_rate_far_below_the_target_marks_the_decision_app_limited() -> None:
    # Judged against the target in force while the send rate was measured (1_000_000 here).
    decisions = run(
        [
            (0, Feedback(send_rate_bps=10_000)),  # first decision: nothing was in force yet
            (200, Feedback(send_rate_bps=499_999)),  # < 50 % of 1 Mbps
            (400, Feedback(send_rate_bps=510_000)),  # >= 50 % of the ramped 1_015_511: not limited
            (600, Feedback()),  # no fresh send rate: no judgement
            (800, Feedback(send_rate_bps=100_000, remb_bps=200_000)),
        ]
    )
    assert [d.signals.app_limited for d in decisions] == [False, True, False, False, True]
    # The flag only describes; the target follows the same rules as before: here a first REMB above
    # the send rate (a measurement of our own traffic, not a fall) is a probe ceiling of 120 %.
    assert (decisions[-1].target_bps, decisions[-1].reason) == (240_000, "remb_cap")


# --- fast mode: delay probes and the viewer's receive rate ---------------------------------


def fast(rtt: float = 20.0, rate: int | None = 1_000_000, recv: int | None = None, **kw: object) -> Feedback:
    """A period with probe answers: probe RTT, send rate, the viewer's receive rate (default = send)."""
    return Feedback(probe_rtt_ms=rtt, send_rate_bps=rate, recv_rate_bps=recv if recv is not None else rate, **kw)  # type: ignore[arg-type]


def test_fast_mode_ramps_50_percent_a_second_and_ignores_the_remb() -> None:
    # Far from any known capacity: x1.5 per second, in 200 ms steps (1.5 ** 0.2 each).  A REMB
    # of 1.1 Mbps would cap at 1.32 Mbps (probe ceiling) without probes; with them it does not bind.
    # The viewer keeps up: each period it receives what the previous target sent.
    decisions = run([(0, fast())])
    for t in range(200, 1_200, 200):
        previous = decisions[-1].target_bps
        step = fast(rate=previous, recv=previous, remb_bps=1_100_000)
        decisions += run([(t, step)], decisions[-1].state)
    assert all(d.signals.fast for d in decisions)
    assert all(d.signals.remb_cap_bps is None for d in decisions)
    assert reasons(decisions)[1:] == ["ramp_multiplicative"] * 5
    assert targets(decisions)[-1] == pytest.approx(1_500_000, rel=1e-4)


def test_fast_ramp_never_runs_more_than_20_percent_ahead_of_what_the_viewer_receives() -> None:
    # The viewer gets 600 kbps of a 1 Mbps target (the encoder lags): the ramp stops at 720 kbps
    # = 120 % of it, which is under the target in force, so the target holds where it is.
    decisions = run([(0, fast()), (1_000, fast(rate=900_000, recv=600_000))])
    assert decisions[-1].target_bps == 1_000_000
    decisions = run([(0, fast()), (1_000, fast(rate=1_000_000, recv=1_100_000))])
    assert decisions[-1].target_bps == 1_320_000  # 1.5 Mbps capped at 120 % of 1.1 Mbps


@pytest.mark.parametrize(
    ("first", "second", "percent"),
    [
        (45.0, 50.0, 94),  # a 30 ms queue drains in 500 ms at 94 %
        (41.0, 42.0, 95),  # a 22 ms queue would drain at 95.6 %: the cut is never shallower than 95 %
    ],
)
def test_probe_rtt_rise_cuts_the_received_rate_by_the_queue_after_two_samples(
    first: float, second: float, percent: int
) -> None:
    steps = [(0, fast()), (200, fast()), (400, fast(rtt=first)), (600, fast(rtt=second, recv=900_000))]
    decisions = run(steps)
    # baseline 20 ms, threshold 20 ms: the first is high (hold), the second is high again and rising: cut.
    assert reasons(decisions)[2:] == ["hold", "delay_backoff"]
    assert decisions[-1].target_bps == 900_000 * percent // 100
    assert decisions[-1].signals.probe_rtt_baseline_ms == 20.0
    assert decisions[-1].signals.probe_threshold_ms == 20.0


@pytest.mark.parametrize(("rtt", "percent"), [(70.0, 90), (120.0, 80), (270.0, 50), (600.0, 50)])
def test_a_severe_probe_rtt_cuts_at_once_deeper_for_a_bigger_queue(rtt: float, percent: int) -> None:
    # > baseline + 2 thresholds (60 ms) cuts on the first sample; the cut leaves the queue the probe
    # shows (rtt - 20 ms) 500 ms to drain: 100 ms of queue -> 80 %, never under 50 %.
    decisions = run([(0, fast()), (200, fast()), (400, fast(rtt=rtt))])
    assert (decisions[-1].reason, decisions[-1].target_bps) == ("delay_backoff", 1_000_000 * percent // 100)


def test_on_a_jittery_path_the_cut_leaves_the_jitters_share_of_the_rise_out_of_the_queue() -> None:
    # probe noise 10 ms (a jittery path): threshold max(20, 4 x 10) = 40 ms, severe over 100 ms.
    # A 140 ms sample: 120 ms over the baseline, of which 2 x 10 ms is taken for jitter -> a
    # 100 ms queue -> 80 % (a clean path with the same sample: 120 ms -> 76 %).
    warm = run([(0, fast()), (200, fast())])[-1].state
    jittery = replace(warm, probe_noise_ms=10.0)
    cut = run([(400, fast(rtt=140.0))], jittery)[-1]
    assert (cut.reason, cut.target_bps) == ("delay_backoff", 800_000)
    assert run([(400, fast(rtt=140.0))], warm)[-1].target_bps == 760_000


def test_a_draining_queue_does_not_cut_again_and_holds_the_ramp() -> None:
    steps = [(0, fast()), (200, fast()), (400, fast(rtt=120.0))]  # severe: cut to 800_000
    steps += [(t, fast(rtt=rtt, rate=800_000)) for t, rtt in ((600, 110.0), (800, 95.0), (1_000, 80.0), (1_200, 62.0))]
    decisions = run(steps)
    assert reasons(decisions)[2:] == ["delay_backoff", "hold", "hold", "hold", "hold"]
    assert targets(decisions)[-1] == 800_000
    # the queue stops draining (RTT falls < 5 ms) while still high, 1 s after the cut, and the viewer
    # gets all 800 kbps we send: a level that did not drain when we sent less is not our queue -- the
    # baseline moves to it (58 ms) and the ramp goes on, to the cruise (90 % of the 1 Mbps capacity)
    more = run([(1_400, fast(rtt=58.0, rate=800_000)), (1_600, fast(rtt=59.0, rate=800_000))], decisions[-1].state)
    assert [(str(d.reason), d.target_bps) for d in more] == [("hold", 800_000), ("ramp_multiplicative", 867_577)]
    assert more[-1].signals.probe_rtt_baseline_ms == 58.0
    # the same level while the viewer gets under 95 % of it: the path is full, the baseline stays
    full = run([(1_400, fast(rtt=58.0, rate=800_000, recv=740_000))], decisions[-1].state)[-1]
    assert (full.reason, full.signals.probe_rtt_baseline_ms) == ("hold", 20.0)


def test_probe_noise_raises_the_threshold_so_jitter_alone_never_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    # A jittery path without a queue: 30 +- 15 ms each way (uniform), RTT 60 +- 30 ms; each
    # period reports the lowest of its 4 probes.  The threshold follows 4 x the mean
    # sample-to-sample change, so for 20 s no sample pair cuts, and the ramp goes on between
    # the high samples.  With the noise term left out (the 20 ms floor only) the same
    # samples cut many times.
    rng = random.Random(5)
    rtts = [min(60.0 + rng.uniform(-15, 15) + rng.uniform(-15, 15) for _ in range(4)) for _ in range(100)]
    steps = [(200 * i, fast(rtt=rtt, rate=None)) for i, rtt in enumerate(rtts)]
    decisions = run(steps)
    assert "delay_backoff" not in reasons(decisions)
    threshold = decisions[-1].signals.probe_threshold_ms
    assert threshold is not None and threshold > 25.0
    assert targets(decisions)[-1] > 2_000_000
    monkeypatch.setattr(bitrate_module, "PROBE_NOISE_FACTOR", 0.0)
    assert reasons(run(steps)).count("delay_backoff") >= 1


@pytest.mark.parametrize(
    ("recvs", "expected"),
    [
        ((490_000,), [("recv_shortfall", 490_000 * 95 // 100)]),  # < 50 % of what we send: at once
        # (the target is 1_084_471 by then: one 200 ms step of the x1.5/s ramp from 1 Mbps)
        ((700_000, 700_000), [("hold", 1_084_471), ("recv_shortfall", 700_000 * 95 // 100)]),  # < 80 %: twice
        ((700_000, 1_000_000), [("hold", 1_084_471), ("ramp_multiplicative", 1_176_078)]),  # once is noise
    ],
)
def test_the_viewer_receiving_less_than_we_send_cuts_to_what_it_receives(
    recvs: tuple[int, ...], expected: list[tuple[str, int]]
) -> None:
    steps = [(0, fast()), (200, fast())] + [(400 + 200 * i, fast(recv=r)) for i, r in enumerate(recvs)]
    decisions = run(steps)[2:]
    assert [(str(d.reason), d.target_bps) for d in decisions] == expected


def test_the_shortfall_compares_with_what_was_sent_over_the_viewers_own_window() -> None:
    # A loaded node's encoder slows down: over the viewer's window it sent 720 kbps, which the viewer
    # got in full, while the send rate (a longer, later average) still says 1 Mbps.  Matched, that is
    # no shortfall (the ramp goes on, capped at 120 % of the viewer's 700 kbps: the target holds);
    # against the send rate it was two samples under 80 % and a cut to 665 kbps.
    slow = [(400, fast(recv=700_000, sent_matched_bps=720_000)), (600, fast(recv=700_000, sent_matched_bps=720_000))]
    decisions = run([(0, fast()), (200, fast()), *slow])[2:]
    assert [(str(d.reason), d.target_bps) for d in decisions] == [("hold", 1_084_471), ("hold", 1_084_471)]
    assert decisions[-1].signals.sent_matched_bps == 720_000
    unmatched = run([(0, fast()), (200, fast()), (400, fast(recv=700_000)), (600, fast(recv=700_000))])[2:]
    assert [(str(d.reason), d.target_bps) for d in unmatched] == [("hold", 1_084_471), ("recv_shortfall", 665_000)]
    # what was sent over the window did not arrive: the path's shortfall, cut as before
    lost = [(400, fast(recv=700_000, sent_matched_bps=1_000_000)), (600, fast(recv=700_000, sent_matched_bps=990_000))]
    assert str(run([(0, fast()), (200, fast()), *lost])[-1].reason) == "recv_shortfall"


def test_after_a_shortfall_cut_only_a_further_shortfall_cuts_again() -> None:
    # The send rate is a window's average and stays high after the cut; the reference is the
    # lower of it and the target, so a viewer receiving what the new target sends is fine.
    first = run([(0, fast()), (200, fast()), (400, fast(recv=400_000))])
    assert first[-1].target_bps == 380_000  # 95 %: no queue to drain
    later = run([(600, fast(rate=900_000, recv=340_000)), (800, fast(rate=800_000, recv=150_000))], first[-1].state)
    assert [(str(d.reason), d.target_bps) for d in later] == [("hold", 380_000), ("recv_shortfall", 142_500)]


def test_fast_mode_loss_without_a_queue_does_not_hold_and_answered_loss_does_not_cut() -> None:
    # 5 % loss (13/256) with clean probes: random loss of the path, the ramp goes on.
    decisions = run([(0, fast()), (200, fast(fraction_lost=13))])
    assert decisions[-1].reason == "ramp_multiplicative"
    # 30 % loss reported 1 s after a probe cut: that cut answered it.  2 s after, with a queue forming
    # in the probes (35 ms: over baseline 20 + half the 20 ms threshold): a new loss event.
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1].state
    later = run(
        [(1_400, fast(fraction_lost=77, rate=800_000)), (2_600, fast(rtt=35.0, fraction_lost=77, rate=800_000))], cut
    )
    assert [str(d.reason) for d in later] == ["ramp_multiplicative", "loss_backoff"]


def test_fast_mode_loss_cuts_only_where_the_probes_showed_a_queue_within_the_reports_span() -> None:
    # 30 % loss 2 s after the cut, probes clean since: the path's own loss, no cut (RTCP mode cut it).
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1].state
    clean = run([(1_400, fast(rate=800_000)), (2_600, fast(fraction_lost=77, rate=800_000))], cut)
    assert "loss_backoff" not in reasons(clean)
    # a queue forming 1 s before the report (within its 1.5 s span), gone by the report: the loss is an overflow's
    queued = run([(1_600, fast(rtt=35.0, rate=800_000)), (2_600, fast(fraction_lost=77, rate=800_000))], cut)
    assert reasons(queued)[-1] == "loss_backoff"
    assert queued[-1].target_bps < queued[0].target_bps
    # the same report with no probes (RTCP mode): cut, as ever
    rtcp = run([(0, Feedback()), (1_000, Feedback(fraction_lost=77, send_rate_bps=2_000_000))])
    assert reasons(rtcp)[-1] == "loss_backoff"


def test_bursts_of_loss_without_a_queue_leave_the_cruise_alone() -> None:
    # The matrix's burst cell: 150 ms of 50 % loss every 2.5 s.  Each burst reaches a receiver report
    # as 10-40 % loss; the probes (those that get through) show no queue.  Over 20 s of cruising at
    # 900 kbps on a 1 Mbps path the target never goes under the cruise, and bandwidth probes still run.
    state = cruising(next_ms=100_000)
    decisions: list[BitrateDecision] = []
    for t in range(600, 20_000, 100):
        lost = 77 if t % 2_500 == 300 else (26 if t % 2_500 == 1_300 else None)
        rate = state.target_bps
        decisions += run([(t, fast(rate=rate, recv=rate, fraction_lost=lost))], state)
        state = decisions[-1].state
    assert "loss_backoff" not in reasons(decisions)
    assert min(targets(decisions)) >= 900_000


def test_fast_mode_ignores_receiver_report_delay_and_ends_without_probes() -> None:
    # RTCP's RTT says 300 ms (a report from before a cut) while the probes see no queue: no cut.
    steps = [(0, fast(rtt_ms=20.0)), (200, fast(rtt_ms=20.0)), (400, fast(rtt_ms=300.0)), (600, fast(rtt_ms=300.0))]
    assert "delay_backoff" not in reasons(run(steps))
    # No probe answer for over a second: RTCP rules again (REMB cap, receiver-report delay signal).
    state = run(steps)[-1].state
    later = run([(1_400, Feedback(remb_bps=500_000)), (1_800, Feedback(remb_bps=500_000))], state)
    assert later[0].signals.fast is True and later[0].signals.remb_cap_bps is None
    assert later[1].signals.fast is False and (later[1].reason, later[1].target_bps) == ("remb_cap", 425_000)


def test_fast_mode_ramps_fast_up_to_the_cruise_90_percent_of_the_capacity_a_cut_found_and_stays() -> None:
    # A severe probe (120 ms) cuts 1 Mbps carried to 800 kbps: the capacity is the 1 Mbps the viewer
    # received.  After the 500 ms hold the ramp is x1.5/s, but stops at 900 kbps (the cruise, 90 % of
    # it), and stays there, with no queue, until the next bandwidth probe (3 s after the cut).
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1]
    assert (cut.reason, cut.target_bps, cut.signals.capacity_bps) == ("delay_backoff", 800_000, 1_000_000)
    assert cut.state.bw_next_ms == 3_400
    fast_ramp = run([(1_200, fast(rtt=20.0, rate=800_000, recv=800_000))], cut.state)[-1]
    assert (fast_ramp.reason, fast_ramp.target_bps) == ("ramp_multiplicative", 900_000)  # 1.5 ** 0.3 would be 903 k
    cruise = run([(t, fast(rtt=20.0, rate=900_000, recv=900_000)) for t in range(1_400, 3_400, 200)], fast_ramp.state)
    assert {(str(d.reason), d.target_bps) for d in cruise} == {("cruise", 900_000)}
    # a capacity that is no multiple of 10: the cruise is rounded down
    odd = replace(cut.state, capacity_bps=1_856_643, target_bps=1_600_000)
    edge = run([(1_200, fast(rtt=20.0, rate=1_600_000, recv=1_600_000))], odd)[-1]
    assert edge.target_bps == 1_856_643 * 90 // 100
    on = run([(1_400, fast(rtt=20.0, rate=edge.target_bps, recv=edge.target_bps))], edge.state)[-1]
    assert (on.reason, on.target_bps) == ("cruise", edge.target_bps)


def cruising(capacity: int = 1_000_000, next_ms: int = 1_000) -> BitrateState:
    """A fast-mode state cruising at 90 % of ``capacity`` on a 20 ms path, its next probe due at ``next_ms``."""
    warm = run([(0, fast()), (200, fast()), (400, fast())])[-1].state
    return replace(warm, target_bps=capacity * 90 // 100, capacity_bps=capacity, bw_next_ms=next_ms)


def test_a_bandwidth_probe_that_finds_more_sets_the_capacity_and_the_next_probe_is_bigger_and_sooner() -> None:
    # At 1_000 ms the probe goes to 104 % of the capacity for 300 ms + the 20 ms path; then the
    # target returns to the cruise for a tail (max(500 ms, RTT)) while the viewer's rate, which lags,
    # shows what the probe carried: 1.03 Mbps, over 102 % of the capacity -> the new capacity, and
    # the next probe 500 ms later (once at the new cruise) at 110 % of it.
    rate = 900_000
    steps = [(1_000, fast(rate=rate)), (1_100, fast(rate=rate)), (1_300, fast(rate=rate, recv=990_000))]
    steps += [(1_400, fast(rate=1_040_000, recv=1_030_000)), (1_600, fast(rate=1_040_000, recv=1_000_000))]
    steps += [(1_900, fast(rate=900_000, recv=920_000)), (2_400, fast(rate=927_000)), (2_900, fast(rate=927_000))]
    decisions = run(steps, cruising())
    assert [(str(d.reason), d.target_bps) for d in decisions] == [
        ("probe_up", 1_040_000),
        ("probe_up", 1_040_000),
        ("probe_up", 1_040_000),
        ("probe_down", 900_000),  # 1_400 >= 1_000 + 300 + 20: the tail, until 1_900
        ("hold", 900_000),
        ("hold", 900_000),  # the tail ends: 1.03 Mbps found, capacity 1_030_000, next probe at 2_400
        ("ramp_multiplicative", 927_000),  # up to the new cruise first (90 % of 1_030_000)
        ("probe_up", 1_030_000 * 110 // 100),
    ]
    assert decisions[5].signals.capacity_bps == 1_030_000
    assert (decisions[5].state.bw_rounds, decisions[5].state.bw_next_ms) == (1, 2_400)


def test_a_bandwidth_probe_ends_at_once_on_a_standing_queue_and_the_capacity_is_what_the_viewer_got() -> None:
    # The probe's second period: the last three probes stand 10 ms over the 20 ms baseline (over the
    # 8 ms bar): the path is full at the 980 kbps the viewer gets; the capacity takes it (not under 95 %
    # of the old one), the target goes back to the cruise of it, holds while the queue drains, and the
    # next probe waits the full 3 s, from the first size.
    steps = [(1_000, fast(rtt=30.0, rate=900_000)), (1_100, fast(rtt=31.0, rate=1_000_000, recv=980_000))]
    state = replace(cruising(), probe_recent_ms=(20.0, 30.0), bw_rounds=2)
    decisions = run(steps, state)
    assert [(str(d.reason), d.target_bps) for d in decisions] == [("probe_up", 1_200_000), ("probe_down", 882_000)]
    end = decisions[-1]
    assert end.signals.capacity_bps == 980_000 and end.signals.standing
    assert (end.state.bw_rounds, end.state.bw_next_ms, end.state.hold_until_ms) == (0, 4_100, 1_600)


def test_a_probe_the_encoder_did_not_fill_teaches_nothing() -> None:
    # the viewer never got over 102 % of the capacity: it stays, and the next probe comes 3 s later
    steps = [(1_000, fast(rate=900_000)), (1_400, fast(rate=950_000, recv=950_000)), (1_900, fast(rate=950_000))]
    decisions = run(steps, cruising())
    assert reasons(decisions) == ["probe_up", "probe_down", "hold"]
    assert (decisions[-1].signals.capacity_bps, decisions[-1].state.bw_next_ms) == (1_000_000, 4_900)


def test_a_standing_queue_while_cruising_goes_under_what_the_viewer_receives() -> None:
    # Three probes in a row 9 ms over the baseline (the bar is 8 ms): the path carries less than the
    # cruise now; cut to 90 % of the viewer's 870 kbps, which is the new capacity.  Two such samples and
    # one at the baseline do not (a spike is no standing queue).
    state = cruising(next_ms=10_000)
    steps = [(t, fast(rtt=29.0, rate=900_000, recv=870_000)) for t in (600, 700, 800)]
    decisions = run(steps, state)
    assert [(str(d.reason), d.target_bps) for d in decisions] == [
        ("cruise", 900_000),
        ("cruise", 900_000),
        ("queue_backoff", 783_000),
    ]
    assert decisions[-1].signals.capacity_bps == 870_000
    spiky = [(600, fast(rtt=29.0)), (700, fast(rtt=20.0)), (800, fast(rtt=29.0))]
    assert "queue_backoff" not in reasons(run(spiky, state))


def test_the_probe_threshold_does_not_grow_with_the_paths_rtt_and_one_low_outlier_is_no_baseline() -> None:
    # A 120 ms path: the threshold stays 20 ms (a quarter of the RTT, 30 ms, let a 30 ms queue overflow)
    decisions = run([(0, fast(rtt=120.0)), (200, fast(rtt=121.0))])
    assert (decisions[-1].signals.probe_rtt_baseline_ms, decisions[-1].signals.probe_threshold_ms) == (120.0, 20.0)
    # one sample far under the path's RTT does not become the baseline (it takes the higher of two)
    outlier = run([(400, fast(rtt=60.0)), (600, fast(rtt=121.0))], decisions[-1].state)
    assert outlier[-1].signals.probe_rtt_baseline_ms == 120.0
    assert "delay_backoff" not in reasons(outlier)


def test_queue_free_says_whether_loss_now_is_the_paths_or_a_queues() -> None:
    from streamer.abr.bitrate import queue_free

    quiet = run([(0, fast()), (200, fast(rtt=29.0))])[-1]  # baseline 20, threshold 20: 29 < 30
    assert queue_free(quiet.signals)
    forming = run([(0, fast()), (200, fast(rtt=31.0))])[-1]
    assert not queue_free(forming.signals)
    rtcp_only = run([(0, CLEAN), (200, CLEAN)])[-1]  # no probe answers: nothing to tell by
    assert not queue_free(rtcp_only.signals)


def test_fast_mode_forgets_the_capacity_once_the_viewer_gets_10_percent_more_without_a_queue() -> None:
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1]
    above = replace(cut.state, target_bps=1_090_000)
    # 1.09 Mbps received (9 % over the 1 Mbps capacity): remembered, back to its cruise
    kept = run([(1_200, fast(rtt=20.0, rate=1_090_000, recv=1_090_000))], above)[-1]
    assert (kept.reason, kept.target_bps, kept.signals.capacity_bps) == ("cruise", 900_000, 1_000_000)
    # 1.11 Mbps with a queue in the probes: remembered (the path is full there)
    queued = run([(1_200, fast(rtt=60.0, rate=1_110_000, recv=1_110_000))], above)[-1]
    assert queued.signals.capacity_bps == 1_000_000
    # 1.11 Mbps and no queue: the path grew; the fast ramp (x1.5/s) resumes
    grown = run([(1_200, fast(rtt=20.0, rate=1_110_000, recv=1_110_000))], above)[-1]
    assert (grown.reason, grown.signals.capacity_bps) == ("ramp_multiplicative", None)
    assert grown.target_bps == 1_090_000 + int((1.5**0.3 - 1) * 1_090_000)


def test_fast_mode_holds_500_ms_after_a_cut_the_time_it_gives_the_queue_to_drain() -> None:
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1]
    assert cut.state.hold_until_ms == 900
    # a high, not-draining probe at 800 ms does not cut again; at 900 ms the ramp may resume
    still = run([(800, fast(rtt=119.0, rate=800_000)), (900, fast(rtt=20.0, rate=800_000))], cut.state)
    assert reasons(still) == ["hold", "hold"]  # 900: no time past the hold yet
    assert run([(1_000, fast(rtt=20.0, rate=800_000))], still[-1].state)[-1].reason == "ramp_multiplicative"


def test_fast_mode_a_second_cut_while_the_queue_drains_remembers_what_the_viewer_received() -> None:
    # 1 Mbps carried, a 120 ms probe cuts to 800 k; 400 ms later the queue still shows (the
    # encoder and the send rate lag) and the viewer still receives 1 Mbps: a second cut goes
    # under the 800 k target, but the capacity stays the 1 Mbps the path carried.
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1]
    again = run([(800, fast(rtt=110.0, rate=1_000_000, recv=1_000_000)),
                 (1_000, fast(rtt=118.0, rate=1_000_000, recv=1_000_000))], cut.state)[-1]  # fmt: skip
    assert again.reason == "delay_backoff" and again.target_bps < 800_000
    assert again.signals.capacity_bps == 1_000_000


def test_fast_mode_holds_the_ramp_while_the_viewer_receives_less_than_we_send() -> None:
    # 1 Mbps sent, 940 kbps received (< 95 %): the path is full, what we send beyond it queues.
    decisions = run([(0, fast()), (200, fast(rate=1_000_000, recv=940_000))])
    assert (decisions[-1].reason, decisions[-1].target_bps) == ("hold", 1_000_000)
    # 960 kbps (>= 95 %): ramp on, capped at 120 % of it
    decisions = run([(0, fast()), (200, fast(rate=1_000_000, recv=960_000))])
    assert decisions[-1].reason == "ramp_multiplicative" and decisions[-1].target_bps > 1_000_000


@pytest.mark.parametrize(("recv", "expected"), [(700_000, "delay_backoff"), (820_000, "hold")])
def test_in_the_hold_a_queue_that_does_not_drain_cuts_again_when_the_viewer_gets_under_the_target(
    recv: int, expected: str
) -> None:
    # A severe probe (120 ms) cuts 1 Mbps to 800 kbps (the queue: 100 ms -> 80 %).  Within the
    # 500 ms hold the queue stays high and does not drain (two samples): with the viewer receiving
    # 700 kbps, under 95 % of the 800 kbps target, the cut missed the path and is taken again, to
    # 700 k x the drain share of a 110 ms queue (78 %); receiving 820 kbps, the cut works: hold.
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1]
    assert (cut.reason, cut.target_bps) == ("delay_backoff", 800_000)
    steps = [(500, fast(rtt=125.0, rate=900_000, recv=recv)), (600, fast(rtt=130.0, rate=900_000, recv=recv))]
    later = run(steps, cut.state)
    # a single sample, severe as it is, does not cut in the hold: the cut shows a period later
    assert [str(d.reason) for d in later] == ["hold", expected]
    if expected == "delay_backoff":
        assert later[-1].target_bps == recv * 78 // 100
        assert later[-1].signals.capacity_bps == recv
    else:
        assert later[-1].target_bps == 800_000


def test_in_the_hold_a_draining_queue_does_not_cut_again() -> None:
    # The same miss, but the probes fall 10 ms a sample: the queue drains, the cut works.
    cut = run([(0, fast()), (200, fast()), (400, fast(rtt=120.0))])[-1]
    steps = [(500, fast(rtt=110.0, rate=900_000, recv=700_000)), (600, fast(rtt=100.0, rate=900_000, recv=700_000))]
    later = run(steps, cut.state)
    assert [(str(d.reason), d.target_bps) for d in later] == [("hold", 800_000), ("hold", 800_000)]
