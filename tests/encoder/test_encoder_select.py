"""Encoder selection: a table of probe outcomes, preferences and peers (pure)."""

from __future__ import annotations

import pytest

from encoder.backends import AIORTC_VIDEO_CODECS, BACKENDS, ProbeResult
from encoder.select import NoEncoderError, select_backend

NO_CUDA = "Cannot load libcuda.so.1"
NVENC = ("h264_nvenc", "hevc_nvenc", "av1_nvenc")
SOFTWARE = ("libx264", "libvpx", "libsvtav1")


def probes(ok: set[str], failures: dict[str, str] | None = None) -> list[ProbeResult]:
    """Probe results: names in ``ok`` work; the others fail with a reason."""
    failures = failures or {}
    return [
        ProbeResult(b.name, b.name in ok, "ok" if b.name in ok else failures.get(b.name, NO_CUDA), 1.0)
        for b in BACKENDS
    ]


GPU_HOST = probes(set(NVENC) | set(SOFTWARE))
CPU_HOST = probes(set(SOFTWARE))
ALL = frozenset({"H264", "VP8", "HEVC", "AV1"})

# (case, probes, preference, peer codecs, packetizable, chosen)
TABLE = [
    ("nvenc present, auto", GPU_HOST, "auto", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "h264_nvenc"),
    ("nvenc absent, auto", CPU_HOST, "auto", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "libx264"),
    ("named backend", GPU_HOST, "libx264", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "libx264"),
    ("codec preference", GPU_HOST, "vp8", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "libvpx"),
    ("codec preference, case", CPU_HOST, "H264", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "libx264"),
    ("peer only VP8", GPU_HOST, "auto", {"VP8"}, AIORTC_VIDEO_CODECS, "libvpx"),
    ("peer lacks HEVC -> H264", GPU_HOST, "hevc", {"H264", "VP8"}, ALL, "h264_nvenc"),
    ("HEVC when all can", GPU_HOST, "hevc", ALL, ALL, "hevc_nvenc"),
    ("AV1 not packetizable", GPU_HOST, "av1", ALL, AIORTC_VIDEO_CODECS, "h264_nvenc"),
    ("software AV1 when all can", CPU_HOST, "av1", ALL, ALL, "libsvtav1"),
    ("preference unavailable -> fallback", CPU_HOST, "h264_nvenc", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "libx264"),
    ("unknown preference -> fallback", CPU_HOST, "mpeg2", AIORTC_VIDEO_CODECS, AIORTC_VIDEO_CODECS, "libx264"),
]


@pytest.mark.parametrize(
    ("case", "results", "preference", "peer", "packetizable", "chosen"), TABLE, ids=[row[0] for row in TABLE]
)
def test_selection_table(case, results, preference, peer, packetizable, chosen):
    selection = select_backend(results, preference, peer, packetizable=packetizable)
    assert selection.backend.name == chosen, selection.reasons
    assert selection.reasons[-1].startswith(f"chose {chosen}")


def test_nvenc_absent_says_why():
    selection = select_backend(CPU_HOST)
    assert selection.reasons == (
        f"h264_nvenc: unavailable ({NO_CUDA})",
        "hevc_nvenc: peer cannot receive HEVC (peer accepts H264, VP8)",
        "av1_nvenc: peer cannot receive AV1 (peer accepts H264, VP8)",
        "chose libx264 (H264) for preference 'auto'",
    )


def test_peer_without_hevc_falls_to_h264_with_reasons():
    selection = select_backend(GPU_HOST, "hevc", {"H264"}, packetizable=ALL)
    assert selection.backend.name == "h264_nvenc"
    assert selection.reasons[0] == "hevc_nvenc: peer cannot receive HEVC (peer accepts H264)"
    assert "falling back to 'auto'" in selection.reasons[1]


def test_unavailable_preference_is_an_error_when_strict():
    with pytest.raises(NoEncoderError) as err:
        select_backend(CPU_HOST, "h264_nvenc", strict=True)
    assert err.value.reasons == (f"h264_nvenc: unavailable ({NO_CUDA})",)
    assert NO_CUDA in str(err.value)


def test_unknown_preference_is_an_error_when_strict():
    with pytest.raises(NoEncoderError, match="unknown preference 'mpeg2'"):
        select_backend(CPU_HOST, "mpeg2", strict=True)


def test_all_fail_raises_with_every_reason():
    failures = {"libx264": "encode failed: boom", "libvpx": "first packet is not a keyframe"}
    with pytest.raises(NoEncoderError) as err:
        select_backend(probes(set(), failures))
    reasons = err.value.reasons
    assert reasons == (
        f"h264_nvenc: unavailable ({NO_CUDA})",
        "hevc_nvenc: peer cannot receive HEVC (peer accepts H264, VP8)",
        "av1_nvenc: peer cannot receive AV1 (peer accepts H264, VP8)",
        "libx264: unavailable (encode failed: boom)",
        "libvpx: unavailable (first packet is not a keyframe)",
        "libsvtav1: peer cannot receive AV1 (peer accepts H264, VP8)",
    )
    for reason in reasons:
        assert reason in str(err.value)


def test_preference_fallback_that_also_fails_lists_both_rounds():
    with pytest.raises(NoEncoderError) as err:
        select_backend(probes(set()), "vp8")
    assert err.value.reasons[0] == f"libvpx: unavailable ({NO_CUDA})"
    assert "falling back to 'auto'" in err.value.reasons[1]
    assert any(r.startswith("libx264: unavailable") for r in err.value.reasons)


def test_peer_that_receives_nothing_we_make():
    with pytest.raises(NoEncoderError, match="peer cannot receive"):
        select_backend(GPU_HOST, "auto", {"VP9"})


def test_missing_probe_is_a_reason():
    with pytest.raises(NoEncoderError, match="libx264: not probed"):
        select_backend([], "libx264", strict=True)


def test_selection_is_pure_and_repeatable():
    first = select_backend(GPU_HOST, "auto")
    assert select_backend(GPU_HOST, "auto") == first
