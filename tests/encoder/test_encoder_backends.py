"""Backends as data: priority order, invariants, and options this FFmpeg knows.

The option check needs no GPU: it reads the AVOptions each codec declares, so
the NVENC options (names and choice values) are verified on every machine.
"""

from __future__ import annotations

import pytest

from encoder.backends import (
    BACKENDS,
    GOP_INFINITE_FRAMES,
    WEBRTC_H264,
    auto_threads,
    backend_by_name,
    codec_options,
    h264_level,
)
from encoder.probe import check_options
from encoder.ratecontrol import X264_CLAMPED_BUFSIZE_BITS, BitrateChange, open_rate_control


def test_priority_order_hardware_first_software_last():
    names = [b.name for b in BACKENDS]
    assert names == ["h264_nvenc", "hevc_nvenc", "av1_nvenc", "libx264", "libvpx", "libsvtav1"]
    kinds = [b.hardware for b in BACKENDS]
    assert kinds == sorted(kinds, reverse=True)
    assert {b.webrtc_codec for b in BACKENDS} == {"H264", "HEVC", "AV1", "VP8"}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_options_are_known_to_this_ffmpeg(backend):
    assert check_options(backend) == []
    assert check_options(backend, 1920, 1080) == []


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_low_latency_invariants_as_data(backend):
    opts = codec_options(backend, open_rate_control(4_000_000, 60.0), 1280, 720, threads=2)
    assert opts["threads"] == "2"
    assert "flags" not in opts  # never global_header: SPS/PPS ride in every keyframe
    if backend.codec != "libvpx" and backend.codec != "libsvtav1":
        assert opts["bf"] == "0"
    if backend.hardware:
        assert opts["g"] == str(GOP_INFINITE_FRAMES)
        assert opts["delay"] == "0" and opts["zerolatency"] == "1" and opts["rc"] == "cbr"
        assert opts["tune"] in {"ull", "ll"} and opts["preset"] in {"p1", "p2", "p3", "p4"}
        assert opts["forced-idr"] == "1"
        assert backend.pix_fmts[:2] == ("bgr0", "bgra")  # straight from capture
        assert int(opts["bufsize"]) == 4_000_000 // 60  # one frame
    else:
        assert backend.pix_fmts == ("yuv420p",)
    if backend.webrtc_codec == WEBRTC_H264:
        assert opts["profile"] == "baseline"
        assert opts["level"] == "3.2"


def test_x264_is_opened_cbr_like_with_a_clamped_buffer():
    x264 = backend_by_name("libx264")
    assert x264.bitrate_change is BitrateChange.LIVE
    rate = open_rate_control(2_000_000, 30.0, x264.headroom, x264.rate_factor)
    opts = codec_options(x264, rate, 640, 360, threads=1)
    assert opts["maxrate"] == str(rate.open_bitrate_bps)
    assert opts["bufsize"] == str(X264_CLAMPED_BUFSIZE_BITS)
    assert opts["x264-params"] == "keyint=infinite"
    assert opts["tune"] == "zerolatency" and opts["preset"] == "ultrafast"


def test_vp8_is_cbr_and_reopens_on_bitrate_change():
    vp8 = backend_by_name("libvpx")
    assert vp8.bitrate_change is BitrateChange.REOPEN
    opts = codec_options(vp8, open_rate_control(1_000_000, 30.0), 640, 360, threads=1)
    assert opts["minrate"] == opts["maxrate"] == "1000000"
    assert opts["deadline"] == "realtime" and opts["lag-in-frames"] == "0"
    assert vp8.yuv_matrix == "bt601"


@pytest.mark.parametrize(
    ("size", "fps", "maxrate", "level"),
    [
        ((640, 360), 30, 2_000_000, "3.1"),
        ((1280, 720), 30, 5_000_000, "3.1"),
        ((1280, 720), 60, 5_000_000, "3.2"),
        ((1920, 1080), 30, 10_000_000, "4"),
        ((1920, 1080), 30, 30_000_000, "4.1"),
        ((1920, 1080), 60, 20_000_000, "4.2"),
        ((3840, 2160), 30, 40_000_000, "5.1"),
        ((3840, 2160), 60, 40_000_000, "5.2"),
        ((7680, 4320), 60, 40_000_000, "5.2"),  # nothing fits: highest
    ],
)
def test_h264_level(size, fps, maxrate, level):
    assert h264_level(*size, fps, maxrate) == level


def test_lookup_and_threads():
    assert backend_by_name("LIBX264").codec == "libx264"
    with pytest.raises(KeyError, match="known:"):
        backend_by_name("openh264")
    assert auto_threads(1280, 720) == 1
    assert auto_threads(1920, 1080) == 2


def test_hardware_backends_open_on_the_seated_gpu():
    """NVENC gets FFmpeg's ``gpu`` option (the CUDA ordinal) so a session encodes on its own card;
    software encoders have no device and get no such option."""
    for b in BACKENDS:
        rate = open_rate_control(4_000_000, 60.0, b.headroom, b.rate_factor)
        opts = codec_options(b, rate, 1920, 1080, threads=1, gpu=3)
        if b.hardware:
            assert opts["gpu"] == "3", b.name
            assert "gpu" not in codec_options(b, rate, 1920, 1080, threads=1), b.name
        else:
            assert "gpu" not in opts, b.name
    nvenc = backend_by_name("h264_nvenc")
    with pytest.raises(ValueError, match="gpu"):
        codec_options(nvenc, open_rate_control(4_000_000, 60.0, 1.0, 1.0), 1280, 720, threads=1, gpu=-1)
