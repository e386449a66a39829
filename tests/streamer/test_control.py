"""Encoder choice per viewer and the per-viewer controller state (pure: fake probes, fake time)."""

from __future__ import annotations

import pytest

from encoder import NoEncoderError, ProbeResult
from streamer.bitrate import GAME_PROFILE, BitrateReason, Feedback
from streamer.control import SENDABLE_BACKENDS, StreamController, choose_backend
from streamer.ladder import LadderReason, game_ladder


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
