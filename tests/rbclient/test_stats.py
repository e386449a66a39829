"""Viewer stats on a fake clock: fps, freezes over 200 ms, bitrate, stamps' gaps and latency, input RTT."""

from __future__ import annotations

import pytest

from rbclient.stamp import Stamp
from rbclient.stats import ViewerStats, percentile

WALL0 = 1_796_387_132_000.0


def test_a_steady_30_fps_stream_with_one_freeze_and_skipped_frames() -> None:
    s = ViewerStats()
    t = 0.0
    no = 100
    for i in range(90):  # 3 s at 30 fps, frames decoded 20 ms after render
        t = i * 1000 / 30
        s.on_frame(t, WALL0 + t, 640, 360, Stamp(no, int(WALL0 + t - 20)))
        no += 1
        s.on_packet(t, 988)  # 1000 bytes a frame with the header
    snap = s.snapshot(t)
    assert snap.fps == pytest.approx(30, abs=1) and snap.freezes == 0 and snap.stamp_gaps == 0
    assert snap.bitrate_bps == pytest.approx(30 * 1000 * 8, rel=0.05)
    assert snap.render_to_decode_ms == pytest.approx(20, abs=1)
    # a 500 ms stall: one freeze, the frames rendered meanwhile were never decoded
    t += 500
    no += 14
    s.on_frame(t, WALL0 + t, 640, 360, Stamp(no, int(WALL0 + t - 20)))
    snap = s.snapshot(t)
    assert (snap.freezes, snap.freeze_ms, snap.stamp_gaps) == (1, 500, 14)
    assert s.snapshot(t + 2000).fps == 0  # nothing decoded in the last second
    summary = s.summary()
    assert summary.frames == 91 and summary.longest_gap_ms == 500 and summary.freezes == 1
    assert summary.fps == pytest.approx(90 / (89 / 30 + 0.5), rel=0.01)
    assert summary.render_to_decode_p50_ms == pytest.approx(20, abs=1)


def test_no_figures_before_a_second_of_data_and_implausible_latency_is_dropped() -> None:
    s = ViewerStats()
    assert s.snapshot(0).fps is None and s.snapshot(0).render_to_decode_ms is None
    s.on_frame(0, WALL0, 640, 360, Stamp(1, int(WALL0 + 5000)))  # the other clock is 5 s ahead
    s.on_frame(33, WALL0 + 33, 640, 360, None)
    snap = s.snapshot(500)
    assert snap.fps is None and snap.bitrate_bps is None and snap.render_to_decode_ms is None
    assert snap.frames == 2 and snap.width == 640
    s.on_pong(1000, 990.5)
    s.on_pong(1000, 2000)  # from the future: not a round trip
    s.on_node_stats({"t": "stats", "codec": "H264", "rtt_ms": 1.5})
    snap = s.snapshot(1000)
    assert snap.input_rtt_ms == 9.5 and snap.node == {"codec": "H264", "rtt_ms": 1.5}
    text = "\n".join(snap.lines())
    assert "Codec           H264" in text and "Input RTT       9.5 ms" in text and "n/a (no frame stamp)" in text


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)
