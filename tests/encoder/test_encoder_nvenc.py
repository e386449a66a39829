"""NVENC: real encodes where a probe says NVENC works; skipped with the
probe's reason elsewhere. (The options are checked on every machine by
test_encoder_backends.py::test_options_are_known_to_this_ffmpeg.)"""

from __future__ import annotations

import av
import numpy as np
import pytest

from encoder.backends import backend_by_name
from encoder.pattern import moving_pattern
from encoder.probe import h264_profile_level_id
from encoder.ratecontrol import Action, keyframe_cap_bytes

NVENC = ["h264_nvenc", "hevc_nvenc", "av1_nvenc"]


@pytest.fixture(params=NVENC)
def nvenc(request, probes):
    result = probes[request.param]
    if not result.ok:
        pytest.skip(f"{request.param} unavailable here: {result.reason}")
    return backend_by_name(request.param)


def test_bgr0_straight_from_capture_decodes(nvenc, helpers):
    w, h = 640, 360
    with helpers.open_encoder(nvenc, w, h, bitrate_bps=3_000_000, source_format="bgr0") as enc:
        assert enc.pix_fmt == "bgr0"
        sources = []
        per_frame = []
        for i in range(30):
            bgra = moving_pattern(w, h, i)
            sources.append(bgra)
            frame = av.VideoFrame.from_ndarray(bgra, format="bgra").reformat(format="bgr0")
            per_frame.append(enc.encode(frame))
            assert enc.stats.last is not None and not enc.stats.last.converted
    assert all(len(p) == 1 for p in per_frame)
    frames = helpers.decode(nvenc, per_frame)
    assert len(frames) == 30
    rgb = [helpers.rgb_psnr(f, s) for f, s in zip(frames, sources, strict=True)]
    assert np.mean(rgb) > 30.0, rgb
    assert helpers.keyframes(per_frame) == [0]
    if nvenc.webrtc_codec == "H264":
        profile = h264_profile_level_id(bytes(per_frame[0][0]))
        assert profile is not None and profile.startswith("42")


def test_keyframe_request_and_cap(nvenc, helpers):
    with helpers.open_encoder(nvenc, 640, 360, fps=30, bitrate_bps=2_000_000) as enc:
        _, per_frame = helpers.encode_pattern(enc, 20, before=lambda i, e: i == 10 and e.request_keyframe())
    assert helpers.keyframes(per_frame) == [0, 10]
    cap = keyframe_cap_bytes(2_000_000, 30)
    assert max(helpers.frame_bytes(per_frame)[i] for i in (0, 10)) <= cap


def test_live_bitrate_change_costs_one_idr(nvenc, helpers):
    with helpers.open_encoder(nvenc, 640, 360, bitrate_bps=4_000_000) as enc:
        _, per_frame = helpers.encode_pattern(enc, 20, before=lambda i, e: i == 10 and e.set_bitrate(2_000_000))
        assert enc.last_bitrate_decision is not None
        assert enc.last_bitrate_decision.action is Action.LIVE_IDR
    assert helpers.keyframes(per_frame) == [0, 10]
