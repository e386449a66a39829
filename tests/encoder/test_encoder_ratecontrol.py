"""Rate-control sizing and the live-bitrate policy: pure, exact assertions."""

from __future__ import annotations

import pytest

from encoder.ratecontrol import (
    KEYFRAME_CAP_FRAMES,
    MAX_BITRATE_BPS,
    MIN_BITRATE_BPS,
    Action,
    BitrateChange,
    RateControl,
    keyframe_cap_bytes,
    open_rate_control,
    plan_bitrate_change,
)


def test_open_window_is_one_frame_of_vbv_and_a_ceiling():
    rate = open_rate_control(3_000_000, 30.0, headroom=2.0, rate_factor=1.25)
    assert rate.bitrate_bps == 3_000_000
    assert rate.ceiling_bps == 6_000_000
    assert rate.bufsize_bits == 100_000  # one frame at 3 Mbit/s, 30 fps
    assert rate.codec_bitrate_bps == 3_750_000
    assert rate.open_bitrate_bps == 7_500_000
    assert rate.frame_budget_bytes == pytest.approx(12_500)


def test_keyframe_cap_is_four_frames_in_bytes():
    assert KEYFRAME_CAP_FRAMES == 4.0
    assert keyframe_cap_bytes(1_000_000, 30.0) == 16_666
    assert open_rate_control(8_000_000, 60.0).keyframe_cap_bytes == 66_666


def test_open_rejects_nonsense():
    with pytest.raises(ValueError):
        open_rate_control(1_000_000, 0.0)
    with pytest.raises(ValueError):
        open_rate_control(1_000_000, 30.0, headroom=0.5)


def test_requests_are_clamped():
    rate = open_rate_control(1, 30.0)
    assert rate.bitrate_bps == MIN_BITRATE_BPS
    decision = plan_bitrate_change(rate, 10**12, BitrateChange.REOPEN)
    assert decision.rate.bitrate_bps == MAX_BITRATE_BPS
    assert "clamped" in decision.reason


@pytest.mark.parametrize("mode", list(BitrateChange))
def test_same_bitrate_is_no_action(mode):
    rate = open_rate_control(2_000_000, 30.0, headroom=2.0)
    decision = plan_bitrate_change(rate, 2_000_000, mode)
    assert decision.action is Action.NONE
    assert decision.rate == rate
    assert not decision.costs_keyframe


def test_live_within_window_keeps_ceiling_and_costs_nothing():
    rate = open_rate_control(2_000_000, 30.0, headroom=2.0, rate_factor=1.25)
    down = plan_bitrate_change(rate, 500_000, BitrateChange.LIVE)
    assert down.action is Action.LIVE
    assert not down.costs_keyframe
    assert down.rate == RateControl(500_000, 4_000_000, 66_666, 30.0, 2.0, 1.25)
    up = plan_bitrate_change(down.rate, 4_000_000, BitrateChange.LIVE)
    assert up.action is Action.LIVE
    assert up.rate.bitrate_bps == 4_000_000
    assert up.rate.codec_bitrate_bps == 5_000_000


def test_live_above_ceiling_reopens_with_a_new_ceiling():
    rate = open_rate_control(2_000_000, 30.0, headroom=2.0)
    decision = plan_bitrate_change(rate, 5_000_000, BitrateChange.LIVE)
    assert decision.action is Action.REOPEN
    assert decision.costs_keyframe
    assert decision.rate.ceiling_bps == 10_000_000
    assert decision.rate.bufsize_bits == 166_666
    assert "ceiling" in decision.reason


def test_live_far_below_ceiling_reopens():
    rate = open_rate_control(2_000_000, 30.0, headroom=2.0)  # ceiling 4 Mbit/s
    assert plan_bitrate_change(rate, 400_000, BitrateChange.LIVE).action is Action.LIVE
    decision = plan_bitrate_change(rate, 300_000, BitrateChange.LIVE)
    assert decision.action is Action.REOPEN
    assert decision.rate.ceiling_bps == 600_000


def test_reopen_backend_holds_small_changes_and_reopens_big_ones():
    rate = open_rate_control(1_000_000, 30.0)
    hold = plan_bitrate_change(rate, 1_100_000, BitrateChange.REOPEN)
    assert hold.action is Action.HOLD
    assert hold.rate == rate
    assert not hold.costs_keyframe
    reopen = plan_bitrate_change(rate, 1_300_000, BitrateChange.REOPEN)
    assert reopen.action is Action.REOPEN
    assert reopen.costs_keyframe
    assert reopen.rate == open_rate_control(1_300_000, 30.0)
    assert "keyframe" in reopen.reason


def test_live_idr_costs_a_keyframe_and_reopens_when_buffer_would_be_too_big():
    rate = open_rate_control(3_000_000, 60.0)
    idr = plan_bitrate_change(rate, 2_000_000, BitrateChange.LIVE_IDR)
    assert idr.action is Action.LIVE_IDR
    assert idr.costs_keyframe
    assert idr.rate.bufsize_bits == rate.bufsize_bits  # fixed at open
    # 3 Mbit/s buffer of one frame = 4 frames at 750 kbit/s: over LIVE_MAX_VBV_FRAMES.
    too_low = plan_bitrate_change(rate, 750_000, BitrateChange.LIVE_IDR)
    assert too_low.action is Action.REOPEN
    assert too_low.rate.bufsize_bits == 12_500


def test_replayed_sequence_ends_in_an_exact_state():
    """Decide-then-apply over a REMB-like sequence, like aiortc's rate tests."""
    LIVE, REOPEN = Action.LIVE, Action.REOPEN
    rate = open_rate_control(2_000_000, 30.0, headroom=2.0, rate_factor=1.25)
    actions = []
    for target in (1_800_000, 1_500_000, 3_900_000, 4_200_000, 4_300_000, 900_000, 800_000):
        decision = plan_bitrate_change(rate, target, BitrateChange.LIVE)
        actions.append(decision.action)
        rate = decision.rate
    assert actions == [LIVE, LIVE, LIVE, REOPEN, LIVE, LIVE, REOPEN]
    assert rate == RateControl(800_000, 1_600_000, 26_666, 30.0, 2.0, 1.25)
