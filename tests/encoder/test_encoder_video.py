"""Real encodes with the software backends: decodable, recognisable, rate
changes, keyframe requests and caps, timestamps aiortc can packetize."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.codecs.h264 import H264Encoder
from aiortc.codecs.vpx import Vp8Encoder

from encoder.backends import backend_by_name
from encoder.pattern import moving_pattern
from encoder.probe import h264_nal_types, h264_profile_level_id
from encoder.ratecontrol import Action, keyframe_cap_bytes
from encoder.video import RTP_VIDEO_TIME_BASE, EncoderConfig, VideoEncoder

SOFTWARE = ["libx264", "libvpx", "libsvtav1"]
X264 = backend_by_name("libx264")
VP8 = backend_by_name("libvpx")


@pytest.fixture(autouse=True)
def _software_available(request, probes):
    name = request.node.callspec.params.get("name") if hasattr(request.node, "callspec") else None
    for backend in {name, "libx264", "libvpx"} - {None}:
        if not probes[backend].ok:
            pytest.fail(f"software encoder {backend} must work here: {probes[backend].reason}")


@pytest.mark.parametrize("name", SOFTWARE)
def test_encode_decode_is_recognisable(name, helpers):
    backend = backend_by_name(name)
    with helpers.open_encoder(backend, 320, 240, bitrate_bps=1_000_000) as enc:
        sources, per_frame = helpers.encode_pattern(enc, 30)
        snap = enc.stats.snapshot()
    assert all(len(p) == 1 for p in per_frame)  # one packet per frame, nothing held back
    frames = helpers.decode(backend, per_frame)
    assert len(frames) == 30
    assert {(f.width, f.height) for f in frames} == {(320, 240)}
    y = [helpers.y_psnr(f, s, backend.yuv_matrix) for f, s in zip(frames, sources, strict=True)]
    rgb = [helpers.rgb_psnr(f, s) for f, s in zip(frames, sources, strict=True)]
    assert np.mean(y) > 35.0, y
    assert min(y) > 30.0, y
    assert np.mean(rgb) > 30.0, rgb  # colour matrix survives the round trip
    assert helpers.keyframes(per_frame) == [0]
    assert (snap.frames, snap.keyframes) == (30, 1)
    assert snap.bytes == sum(helpers.frame_bytes(per_frame))
    assert snap.encode_ms_p50 > 0 and snap.convert_ms_p50 > 0


@pytest.mark.parametrize("name", SOFTWARE)
def test_keyframe_request_hits_the_next_frame(name, helpers):
    def before(i: int, enc: VideoEncoder) -> None:
        if i in (7, 13):
            enc.request_keyframe()

    with helpers.open_encoder(backend_by_name(name)) as enc:
        _, per_frame = helpers.encode_pattern(enc, 20, before=before)
        assert enc.stats.snapshot().requested_keyframes == 2
    assert helpers.keyframes(per_frame) == [0, 7, 13]


def test_x264_keyframes_carry_sps_pps_and_are_constrained_baseline(helpers):
    with helpers.open_encoder(X264) as enc:
        _, per_frame = helpers.encode_pattern(enc, 12, before=lambda i, e: i == 6 and e.request_keyframe())
    for index in helpers.keyframes(per_frame):
        data = bytes(per_frame[index][0])
        assert data.startswith(b"\x00\x00\x00\x01")  # Annex-B, what aiortc's pack() splits
        types = h264_nal_types(data)
        assert 7 in types and 8 in types and 5 in types, types
        profile = h264_profile_level_id(data)
        assert profile is not None and profile[:2] == "42" and int(profile[2:4], 16) & 0x40
    assert 7 not in h264_nal_types(bytes(per_frame[1][0]))


def test_x264_live_bitrate_change_follows_without_keyframe(helpers):
    fps = 30
    with helpers.open_encoder(X264, 640, 360, fps=fps, bitrate_bps=2_000_000) as enc:
        decisions = []

        def before(i: int, e: VideoEncoder) -> None:
            if i == 90:
                decisions.append(e.set_bitrate(1_000_000))
            if i == 180:
                decisions.append(e.set_bitrate(2_000_000))

        _, per_frame = helpers.encode_pattern(enc, 270, detail=True, before=before)
        snap = enc.stats.snapshot()
    sizes = helpers.frame_bytes(per_frame)

    def rate(a: int, b: int) -> float:
        return sum(sizes[a:b]) * 8 * fps / (b - a)

    high, low, high_again = rate(30, 90), rate(105, 180), rate(195, 270)
    assert [d.action for d in decisions] == [Action.LIVE, Action.LIVE]
    assert low < 0.75 * high, (high, low)
    assert high_again > 1.3 * low, (low, high_again)
    # x264's one-frame VBV undershoots; rate_factor 1.25 compensates (see ratecontrol).
    assert 0.6 < low / 1_000_000 < 1.1 and 0.6 < high / 2_000_000 < 1.1, (low, high)
    assert helpers.keyframes(per_frame) == [0]  # no keyframe paid for either change
    assert (snap.live_bitrate_changes, snap.reopens, snap.bitrate_keyframes) == (2, 0, 0)
    assert enc.bitrate_bps == 2_000_000


def test_x264_change_above_ceiling_reopens_with_one_keyframe(helpers):
    with helpers.open_encoder(X264, bitrate_bps=500_000) as enc:
        _, per_frame = helpers.encode_pattern(enc, 10, before=lambda i, e: i == 5 and e.set_bitrate(3_000_000))
        assert enc.last_bitrate_decision is not None
        assert enc.last_bitrate_decision.action is Action.REOPEN
        assert enc.stats.snapshot().bitrate_keyframes == 1
    assert helpers.keyframes(per_frame) == [0, 5]


def test_vp8_bitrate_change_reopens_and_records_the_keyframe(helpers):
    fps = 30
    with helpers.open_encoder(VP8, 640, 360, fps=fps, bitrate_bps=1_500_000) as enc:
        previews = []

        def before(i: int, e: VideoEncoder) -> None:
            if i == 60:
                previews.append(e.set_bitrate(500_000))
            if i == 90:
                previews.append(e.set_bitrate(530_000))  # within the deadband: held

        _, per_frame = helpers.encode_pattern(enc, 120, detail=True, before=before)
        snap = enc.stats.snapshot()
        assert enc.last_bitrate_decision is not None
        assert enc.last_bitrate_decision.action is Action.HOLD
    sizes = helpers.frame_bytes(per_frame)
    assert [p.action for p in previews] == [Action.REOPEN, Action.HOLD]
    assert previews[0].costs_keyframe
    assert helpers.keyframes(per_frame) == [0, 60]
    assert (snap.reopens, snap.bitrate_keyframes) == (1, 1)
    before_rate = sum(sizes[20:60]) * 8 * fps / 40
    after_rate = sum(sizes[75:120]) * 8 * fps / 45
    assert after_rate < 0.5 * before_rate, (before_rate, after_rate)


@pytest.mark.parametrize(
    ("name", "bitrate"), [("libx264", 300_000), ("libx264", 1_000_000), ("libx264", 4_000_000), ("libvpx", 1_000_000)]
)
def test_keyframes_stay_under_the_cap(name, bitrate, helpers):
    backend = backend_by_name(name)
    fps = 30
    cap = keyframe_cap_bytes(bitrate, fps)
    with helpers.open_encoder(backend, 640, 360, fps=fps, bitrate_bps=bitrate) as enc:
        assert enc.keyframe_cap_bytes == cap
        _, per_frame = helpers.encode_pattern(
            enc, 40, detail=backend.codec == "libx264", before=lambda i, e: i in (20, 30) and e.request_keyframe()
        )
    sizes = helpers.frame_bytes(per_frame)
    keys = helpers.keyframes(per_frame)
    assert keys == [0, 20, 30]
    assert max(sizes[i] for i in keys) <= cap, ([sizes[i] for i in keys], cap)


def test_input_formats_convert_once_and_only_when_needed(helpers):
    w, h = 320, 240
    bgra = moving_pattern(w, h, 3)
    inputs = {
        "numpy bgra": bgra,
        "numpy bgr24": np.ascontiguousarray(bgra[..., :3]),
        "numpy strided": np.ascontiguousarray(moving_pattern(w * 2, h, 3))[:, ::2],
        "frame bgr0": av.VideoFrame.from_ndarray(bgra, format="bgra").reformat(format="bgr0"),
        "frame yuv420p": av.VideoFrame.from_ndarray(bgra, format="bgra").reformat(format="yuv420p"),
        "frame 640x480": av.VideoFrame.from_ndarray(moving_pattern(640, 480, 3), format="bgra"),
    }
    with helpers.open_encoder(X264, w, h) as enc:
        converted = {}
        per_frame = []
        for label, frame in inputs.items():
            per_frame.append(enc.encode(frame))
            assert enc.stats.last is not None
            converted[label] = enc.stats.last.converted
    assert converted == {
        "numpy bgra": True,
        "numpy bgr24": True,
        "numpy strided": True,
        "frame bgr0": True,
        "frame yuv420p": False,  # already what x264 takes: passed straight through
        "frame 640x480": True,  # scaled in the same pass
    }
    frames = helpers.decode(X264, per_frame)
    assert len(frames) == len(inputs)
    assert all((f.width, f.height) == (w, h) for f in frames)


def test_bad_numpy_input_is_rejected(helpers):
    with helpers.open_encoder(X264) as enc:
        with pytest.raises(ValueError, match="HxWx4"):
            enc.encode(np.zeros((240, 320), dtype=np.uint8))
        with pytest.raises(ValueError, match="uint8"):
            enc.encode(np.zeros((240, 320, 4), dtype=np.float32))


def test_timestamps_are_90khz_and_strictly_increasing(helpers):
    with helpers.open_encoder(X264, fps=30) as enc:
        synthetic = [enc.encode(moving_pattern(320, 240, i))[0] for i in range(3)]
        explicit = enc.encode(moving_pattern(320, 240, 3), pts=900_000)[0]
        stale = enc.encode(moving_pattern(320, 240, 4), pts=10)[0]
        frame = av.VideoFrame.from_ndarray(moving_pattern(320, 240, 5), format="bgra")
        frame.pts, frame.time_base = 11, Fraction(1, 1)
        from_frame = enc.encode(frame)[0]
    assert [p.pts for p in synthetic] == [0, 3000, 6000]
    assert explicit.pts == 900_000
    assert stale.pts == 900_001
    assert from_frame.pts == 990_000
    assert all(p.time_base == RTP_VIDEO_TIME_BASE for p in (*synthetic, explicit, stale, from_frame))


@pytest.mark.parametrize(("name", "packer"), [("libx264", H264Encoder), ("libvpx", Vp8Encoder)])
def test_aiortc_packetizes_the_packets_as_they_are(name, packer, helpers):
    with helpers.open_encoder(backend_by_name(name), 640, 360, bitrate_bps=2_000_000) as enc:
        _, per_frame = helpers.encode_pattern(enc, 5)
    rtp = packer()
    stamps = []
    for packets in per_frame:
        payloads, timestamp = rtp.pack(packets[0])
        assert payloads and all(len(p) <= 1300 for p in payloads)
        stamps.append(timestamp)
    assert stamps == [0, 3000, 6000, 9000, 12000]


def test_close_is_idempotent_and_final(helpers):
    enc = helpers.open_encoder(VP8)
    enc.encode(moving_pattern(320, 240, 0))
    enc.close()
    enc.close()
    assert enc.closed
    with pytest.raises(RuntimeError, match="closed"):
        enc.encode(moving_pattern(320, 240, 1))


def test_config_is_validated():
    with pytest.raises(ValueError, match="even"):
        EncoderConfig(321, 240)
    with pytest.raises(ValueError, match="fps"):
        EncoderConfig(320, 240, fps=0)
    with pytest.raises(ValueError, match="threads"):
        EncoderConfig(320, 240, threads=0)


def test_thread_count_defaults_by_size(helpers):
    with helpers.open_encoder(X264, 320, 240) as small:
        assert small.threads == 1
    with VideoEncoder(X264, EncoderConfig(1920, 1080, threads=None)) as big:
        assert big.threads == 2
        assert "threads=2" in repr(big)


def test_fast_convert_is_still_recognisable(helpers):
    with helpers.open_encoder(X264, 320, 240, bitrate_bps=1_000_000, fast_convert=True) as enc:
        sources, per_frame = helpers.encode_pattern(enc, 10)
    frames = helpers.decode(X264, per_frame)
    assert np.mean([helpers.rgb_psnr(f, s) for f, s in zip(frames, sources, strict=True)]) > 30.0
