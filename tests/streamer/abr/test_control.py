"""Encoder choice per viewer and the per-viewer controller state (pure: fake probes, fake time)."""

from __future__ import annotations

import itertools
import math

import pytest

from encoder import NoEncoderError, ProbeResult
from streamer.abr.bitrate import DESKTOP_PROFILE, GAME_PROFILE, BitrateReason, Feedback
from streamer.abr.control import SENDABLE_BACKENDS, StreamController, choose_backend
from streamer.abr.ladder import LadderReason, desktop_ladder, game_ladder


def probes(*ok: str) -> tuple[ProbeResult, ...]:
    return tuple(ProbeResult(b.name, b.name in ok, "ok" if b.name in ok else "no", 1.0) for b in SENDABLE_BACKENDS)


def test_only_packetizable_backends_are_probed() -> None:
    assert {b.webrtc_codec for b in SENDABLE_BACKENDS} == {"H264", "VP8"}


@pytest.mark.parametrize(
    ("codec", "peer", "expected"),
    [
        ("auto", {"H264", "VP8"}, "libx264"),
        ("vp8", {"H264", "VP8"}, "libvpx"),
        ("h264", {"VP8"}, "libvpx"),  # the viewer cannot receive the profile's codec: what it can
        ("auto", {"VP8"}, "libvpx"),
    ],
)
def test_choose_backend(codec: str, peer: set[str], expected: str) -> None:
    selection = choose_backend(
        probes("libx264", "libvpx"), encoder_preference="auto", codec_preference=codec, peer_codecs=frozenset(peer)
    )
    assert selection.backend.name == expected
    if codec == "h264" and "H264" not in peer:
        assert "not receivable" in selection.reasons[0]


def test_hardware_first_when_it_probed_ok() -> None:
    selection = choose_backend(
        probes("h264_nvenc", "libx264"), encoder_preference="auto", codec_preference="auto",
        peer_codecs=frozenset({"H264", "VP8"}),
    )  # fmt: skip
    assert selection.backend.name == "h264_nvenc"


def test_no_encoder_for_the_viewer_raises_with_reasons() -> None:
    with pytest.raises(NoEncoderError) as info:
        choose_backend(probes("libx264"), encoder_preference="auto", codec_preference="auto",
                       peer_codecs=frozenset({"VP8"}))  # fmt: skip
    assert any("libvpx" in r for r in info.value.reasons)


def test_controller_starts_at_the_profile_start_and_steps_the_ladder_down() -> None:
    ladder = game_ladder(1280, 720, 60)
    controller = StreamController(GAME_PROFILE, ladder)
    assert controller.rung == ladder.rungs[0]
    step = controller.update(Feedback(), 0)
    assert step.bitrate.reason is BitrateReason.START and step.bitrate.target_bps == GAME_PROFILE.start_bps
    # The viewer's REMB says 2 Mbps: the target is capped under it, below 720p60's floor; after the
    # sustain time the ladder steps down (one keyframe for the caller to apply).
    now = 0
    changed = []
    for _ in range(10):
        now += 200
        step = controller.update(Feedback(remb_bps=2_000_000), now)
        changed.append(step.ladder.changed)
    assert step.bitrate.target_bps <= 2_000_000
    assert changed.count(True) == 1
    assert controller.rung.height < 720
    assert controller.last is step and step.ladder.reason in (LadderReason.HOLD, LadderReason.LOWEST_RUNG)


def test_idle_desktop_with_a_remb_that_follows_its_traffic_keeps_its_fps() -> None:
    """aiortc's REMB estimator starts at the incoming rate and stays under 1.5x it + 10 kbps.

    An idle desktop sending 50 kbps therefore gets an 85 kbps REMB: the target sits at the
    profile minimum, far below the floors of 1080p60 and 1080p30 (where the 2 Mbps start
    rate put it).  That says nothing about the path, so the ladder keeps 30 fps; once the
    content gets busy (the encoder uses its target) the same low REMB steps it down.
    """
    ladder = desktop_ladder(1920, 1080, 60)
    controller = StreamController(DESKTOP_PROFILE, ladder)
    controller.update(Feedback(), 0)
    assert controller.rung.fps == 30
    now = 0
    idle = []
    for _ in range(50):  # 10 s
        now += 200
        idle.append(controller.update(Feedback(remb_bps=85_000, send_rate_bps=50_000), now))
    assert {(s.bitrate.target_bps, s.bitrate.reason) for s in idle[1:]} == {(300_000, BitrateReason.MIN_CLAMP)}
    assert {s.ladder.reason for s in idle[1:]} == {LadderReason.APP_LIMITED}
    assert controller.rung.fps == 30
    busy = []
    for _ in range(6):  # the encoder now sends 80 % of its 300 kbps target
        now += 200
        busy.append(controller.update(Feedback(remb_bps=85_000, send_rate_bps=240_000), now))
    assert [s.ladder.changed for s in busy] == [False] * 5 + [True]
    assert controller.rung.fps == 15


def test_control_step_record_carries_target_reasons_rung_and_signals() -> None:
    controller = StreamController(GAME_PROFILE, game_ladder(1280, 720, 60))
    controller.update(Feedback(), 0)
    step = controller.update(
        Feedback(remb_bps=4_000_000, fraction_lost=64, cumulative_lost=3, jitter_ms=2.345, rtt_ms=41.0,
                 send_rate_bps=3_000_000),
        200,
    )  # fmt: skip
    assert step.record(200) == {
        "now_ms": 200,
        "target_bps": 4_375_000,  # 25 % loss: 5 Mbps * (1 - 0.125); the first REMB measured 3 Mbps sent
        # 3 of the 5 Mbps given were sent: the efficiency sample (0.6, clipped at 1 / 1.3) moves
        # the estimate 1 - e^(-200/500) of the way from 1: 0.924, gain 1.082
        "encoder_bps": 4_735_258,
        "changed": True,
        "reason": "loss_backoff",
        "ladder_reason": "hold",
        "rung": "1280x720@60",
        "rung_changed": False,
        "remb_bps": 4_000_000,
        "remb_cap_bps": 4_800_000,  # not a fall: the probe ceiling
        "send_rate_bps": 3_000_000,
        "rtt_ms": 41.0,
        "rtt_baseline_ms": 41.0,
        "jitter_ms": 2.35,
        "jitter_baseline_ms": 2.35,
        "loss": 0.25,
        "lost_packets_delta": None,
        "capacity_bps": 5_000_000,  # the 25 % loss cut remembers where congestion was seen
        "app_limited": False,
        "fast": False,  # no probe answers: the receiver reports are the delay signal
        "probe_rtt_ms": None,
        "probe_rtt_baseline_ms": None,
        "probe_threshold_ms": None,
        "probe_floor_ms": None,
        "standing": False,
        "recv_rate_bps": None,
        "sent_matched_bps": None,
        "frame_load": None,
    }


def test_encoder_efficiency_follows_send_over_given_and_jumps_up_on_an_overshoot() -> None:
    from streamer.abr.control import RATE_MATCH_MAX_GAIN, encoder_efficiency, rate_match_gain

    # 820 kbps sent of 1 Mbps given (target 1 Mbps): the estimate moves towards 0.82 with a 500 ms
    # time constant, and the gain is its inverse
    step = encoder_efficiency(1.0, 820_000, 1_000_000, 1_000_000, app_limited=False, elapsed_ms=500)
    assert step == pytest.approx(1.0 - 0.18 * (1 - math.exp(-1)))
    estimate = 1.0
    for _ in range(50):
        estimate = encoder_efficiency(estimate, 820_000, 1_000_000, 1_000_000, app_limited=False, elapsed_ms=100)
    assert estimate == pytest.approx(0.82, abs=1e-3) and rate_match_gain(estimate) == pytest.approx(1 / 0.82, abs=1e-3)
    # the gain is bounded: never under 1, never over RATE_MATCH_MAX_GAIN (a sample under 1/1.3 is clipped)
    assert rate_match_gain(1.0) == 1.0 and rate_match_gain(0.5) == RATE_MATCH_MAX_GAIN == 1.3
    low = encoder_efficiency(0.8, 100_000, 1_000_000, 900_000, app_limited=False, elapsed_ms=10_000)
    assert low == pytest.approx(1 / 1.3)
    # sending 6 % over the target: the estimate jumps to the sample at once (the gain comes down now)
    assert encoder_efficiency(0.8, 1_060_000, 1_200_000, 1_000_000, app_limited=False, elapsed_ms=100) == pytest.approx(
        1_060_000 / 1_200_000
    )
    # nothing to learn: no send rate, nothing given, no target, an application-limited encoder, no time
    cases = ((None, 1_000_000, 1_000_000, False, 100), (500_000, None, 1_000_000, False, 100),
             (500_000, 1_000_000, None, False, 100), (100_000, 1_000_000, 1_000_000, True, 100),
             (500_000, 1_000_000, 1_000_000, False, 0))  # fmt: skip
    for sent, given, target, limited, elapsed in cases:
        assert encoder_efficiency(0.9, sent, given, target, app_limited=limited, elapsed_ms=elapsed) == 0.9


def test_right_after_a_big_cut_the_encoders_undershoot_is_not_learnt() -> None:
    from streamer.abr.control import encoder_efficiency

    # not steady (the target moved > 25 % within the window): a lower sample is ignored, a higher
    # one still counts
    kw = {"app_limited": False, "elapsed_ms": 100, "steady": False}
    assert encoder_efficiency(0.8, 600_000, 1_000_000, 1_000_000, **kw) == 0.8  # type: ignore[arg-type]
    assert encoder_efficiency(0.8, 900_000, 1_000_000, 1_000_000, **kw) > 0.8  # type: ignore[arg-type]
    # in the controller: a loss cut halves the target; the encoder then sends little for a while,
    # and the gain does not climb on it until the window holds one target again
    controller = StreamController(GAME_PROFILE, game_ladder(1280, 720, 30))
    controller.update(Feedback(), 0)
    for t in range(100, 1_100, 100):
        controller.update(Feedback(send_rate_bps=int(0.8 * 5_000_000 * controller.gain)), t)
    cut = controller.update(Feedback(fraction_lost=255, send_rate_bps=int(0.8 * 5_000_000 * controller.gain)), 1_100)
    assert cut.bitrate.reason == "loss_backoff"
    before = controller.gain
    gains = []
    for t in range(1_200, 1_600, 100):  # x264 starved after the cut: 60 % of what it is given
        step = controller.update(Feedback(send_rate_bps=int(0.6 * step_given(controller))), t)
        gains.append(controller.gain)
        assert step.bitrate.target_bps <= cut.bitrate.target_bps * 1.1
    assert max(gains) <= before + 1e-9


def step_given(controller: StreamController) -> int:
    assert controller.last is not None
    return controller.last.encoder_bps


def test_mean_target_weighs_each_step_by_its_time_in_the_window() -> None:
    from streamer.abr.control import mean_target

    assert mean_target([(0, 4_000_000)], 100, window_ms=500) == 4_000_000  # held before its own time too
    # 8 Mbps until 300, then 2 Mbps: over [0, 500] that is 300 ms at 8 and 200 ms at 2
    assert mean_target([(-1_000, 8_000_000), (300, 2_000_000)], 500, window_ms=500) == 5_600_000
    # a step that ended before the window counts only for the part inside it
    assert mean_target([(-1_000, 1_000_000), (-200, 3_000_000), (400, 5_000_000)], 500, window_ms=500) == 3_400_000


def test_a_cut_does_not_pull_the_gain_down_while_the_send_rate_still_averages_the_old_target() -> None:
    from streamer.abr.control import RATE_MATCH_WINDOW_MS, mean_target

    # the plant: the encoder spends 82 % of the bitrate it is given, and the send rate the
    # controller gets is that averaged over the window (as streamer.media.session measures it)
    controller = StreamController(GAME_PROFILE, game_ladder(1280, 720, 30))
    given: list[tuple[int, int]] = [(0, controller.update(Feedback(), 0).encoder_bps)]
    gains: dict[int, float] = {}
    for t in range(200, 4_200, 200):
        send = int(0.82 * mean_target(given, t, RATE_MATCH_WINDOW_MS))
        # a loss report with 255/256 lost at 2000 ms: the target is cut about in half
        step = controller.update(Feedback(send_rate_bps=send, fraction_lost=255 if t == 2_000 else None), t)
        given.append((t, step.encoder_bps))
        gains[t] = controller.gain
        if t == 2_000:
            assert step.bitrate.reason == "loss_backoff"
    assert gains[1_800] > 1.15
    # for the next 500 ms the send rate mostly shows the old target: the gain does not take that
    # for an overshoot (against the latest target alone it fell 3 % a period, or more)
    assert all(gains[t] >= gains[1_800] for t in range(2_000, 2_800, 200))


def test_the_encoder_gets_target_times_gain() -> None:
    controller = StreamController(GAME_PROFILE, game_ladder(1280, 720, 30))
    first = controller.update(Feedback(), 0)
    assert (first.bitrate.target_bps, first.encoder_bps) == (5_000_000, 5_000_000)  # nothing measured yet
    steps = [controller.update(Feedback(send_rate_bps=4_000_000), t) for t in range(200, 2_200, 200)]
    # 4 Mbps sent of 5+ given: the efficiency estimate falls, the gain rises, up to its cap
    ratios = [s.encoder_bps / s.bitrate.target_bps for s in steps]
    assert all(b > a for a, b in itertools.pairwise(ratios[:5])) and 1.0 < ratios[0] < ratios[-1] <= 1.3 + 1e-6
    assert steps[-1].encoder_bps == round(steps[-1].bitrate.target_bps * controller.gain)
    assert controller.gain == min(1.3, 1 / controller.efficiency)


def test_a_resized_screen_gets_a_new_ladder_and_keeps_the_bitrate_state() -> None:
    controller = StreamController(DESKTOP_PROFILE, desktop_ladder(1280, 720, 30))
    now = 0
    for _ in range(10):
        now += 200
        controller.update(Feedback(remb_bps=1_500_000), now)
    target = controller.last.bitrate.target_bps if controller.last else 0
    bigger = desktop_ladder(2560, 1440, 30)
    rung = controller.set_ladder(bigger)
    assert rung in bigger.rungs and controller.rung == rung
    # the best rung of the new ladder whose floor the target meets: 2560x1440 at some fps
    assert (rung.width, rung.height) == (2560, 1440)
    assert rung.floor_bps <= target or rung == bigger.rungs[-1]
    step = controller.update(Feedback(remb_bps=1_500_000), now + 200)
    assert step.ladder.rung in bigger.rungs  # decisions go on from the new ladder
    assert abs(step.bitrate.target_bps - target) <= target // 2  # the path's estimate was kept, not restarted
