"""The probe: real encodes on this machine, failure reasons, cache, async."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from encoder.backends import BACKENDS, backend_by_name
from encoder.probe import (
    PROBE_HEIGHT,
    PROBE_WIDTH,
    h264_nal_types,
    h264_profile_level_id,
    probe_all,
    probe_all_async,
    probe_backend,
)


def test_software_backends_work_here(probes):
    for name in ("libx264", "libvpx", "libsvtav1"):
        assert probes[name].ok, probes[name].reason
        assert probes[name].probe_ms > 0
    assert probes["libx264"].profile is not None
    assert probes["libx264"].profile.startswith("42")  # baseline


def test_every_backend_has_a_result_and_failures_say_why(probes):
    assert list(probes) == [b.name for b in BACKENDS]
    for result in probes.values():
        assert result.reason
    for name in ("h264_nvenc", "hevc_nvenc", "av1_nvenc"):
        if not probes[name].ok:
            # FFmpeg's own error line, not just "Operation not permitted".
            assert "Operation not permitted" not in probes[name].reason
            assert "avcodec_open2" not in probes[name].reason


def test_results_are_cached_per_process():
    first = probe_all()
    assert probe_all() is first
    fresh = probe_all(refresh=True)
    assert fresh is not first
    assert [r.ok for r in fresh] == [r.ok for r in first]
    assert probe_all() is fresh


async def test_async_probe_runs_off_the_event_loop():
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    loop_thread = threading.get_ident()
    results = await probe_all_async(refresh=True)
    stop.set()
    await task
    assert ticks > 1  # the loop kept running while the probe encoded
    assert threading.get_ident() == loop_thread
    assert {r.name for r in results} == {b.name for b in BACKENDS}
    assert await probe_all_async() is results


def test_unknown_option_is_reported_without_opening():
    bad = dataclasses.replace(
        backend_by_name("libx264"), options=(*backend_by_name("libx264").options, ("tunez", "fast"))
    )
    result = probe_backend(bad)
    assert not result.ok
    assert result.reason == "unknown option 'tunez'"


def test_bad_choice_value_is_reported():
    nvenc = backend_by_name("h264_nvenc")
    bad = dataclasses.replace(nvenc, options=(*nvenc.options, ("tune", "ultrafast")))
    result = probe_backend(bad)
    assert not result.ok
    assert "tune='ultrafast' not in" in result.reason


def test_missing_encoder_is_reported():
    bad = dataclasses.replace(backend_by_name("libx264"), name="h264_fake", codec="h264_fake")
    result = probe_backend(bad)
    assert not result.ok
    assert result.reason == "FFmpeg build has no h264_fake encoder"


def test_periodic_keyframes_fail_the_probe():
    x264 = backend_by_name("libx264")
    opts = tuple(("x264-params", "keyint=1") if k == "x264-params" else (k, v) for k, v in x264.options)
    result = probe_backend(dataclasses.replace(x264, options=opts))
    assert not result.ok
    assert result.reason == "unrequested keyframe at frame 1"


def test_non_baseline_h264_fails_the_probe():
    x264 = backend_by_name("libx264")
    # x264's profile option is a ceiling; "fast" turns on CABAC and 8x8 transforms -> High.
    changed = {"profile": "high", "preset": "fast"}
    opts = tuple((k, changed.get(k, v)) for k, v in x264.options)
    result = probe_backend(dataclasses.replace(x264, options=opts))
    assert not result.ok
    assert result.reason.startswith("H.264 profile 64")
    assert "not constrained baseline" in result.reason


def test_probe_size_is_used():
    result = probe_backend(backend_by_name("libvpx"), width=256, height=144)
    assert result.ok, result.reason
    assert "256x144" in result.reason
    assert (PROBE_WIDTH, PROBE_HEIGHT) == (320, 240)


def test_h264_bitstream_helpers():
    sps = b"\x67\x42\xc0\x1f\xaa"
    pps = b"\x68\xce\x3c\x80"
    idr = b"\x65\x88\x84\x00"
    stream = b"\x00\x00\x00\x01" + sps + b"\x00\x00\x01" + pps + b"\x00\x00\x00\x01" + idr
    assert h264_nal_types(stream) == [7, 8, 5]
    assert h264_profile_level_id(stream) == "42c01f"
    assert h264_profile_level_id(b"\x00\x00\x01" + idr) is None


@pytest.mark.parametrize("name", ["libx264", "libvpx"])
def test_probe_is_fast(name, probes):
    assert probes[name].probe_ms < 2_000  # a few frames at 320x240, even on a busy machine
