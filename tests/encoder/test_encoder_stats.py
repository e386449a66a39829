"""Per-frame statistics: percentiles, rolling window, counters, snapshots."""

from __future__ import annotations

import threading

import pytest

from encoder.stats import EncoderStats, FrameStats, percentile


def frame(ms: float, size: int = 100, key: bool = False, convert_ms: float = 0.5) -> FrameStats:
    return FrameStats(encode_ms=ms, convert_ms=convert_ms, bytes=size, keyframe=key, converted=True)


def test_percentile_interpolates():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) == 0.0
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_counters_and_snapshot():
    stats = EncoderStats()
    stats.record(frame(10.0, size=5000, key=True))
    for ms in (1.0, 2.0, 3.0):
        stats.record(frame(ms, size=1000))
    stats.note_requested_keyframe()
    stats.note_bitrate_change(reopened=True, costs_keyframe=True)
    stats.note_bitrate_change(reopened=False, costs_keyframe=False)
    snap = stats.snapshot()
    assert (snap.frames, snap.keyframes, snap.bytes) == (4, 1, 8000)
    assert (stats.frames, stats.keyframes, stats.bytes) == (4, 1, 8000)
    assert snap.requested_keyframes == 1
    assert (snap.reopens, snap.live_bitrate_changes, snap.bitrate_keyframes) == (1, 1, 1)
    assert snap.encode_ms_p50 == pytest.approx(2.5)
    assert snap.convert_ms_p95 == pytest.approx(0.5)
    assert snap.total_ms_p50 == pytest.approx(3.0)
    assert snap.max_keyframe_bytes == 5000
    assert snap.max_frame_bytes == 5000
    assert stats.last == frame(3.0, size=1000)


def test_window_is_bounded_but_counters_are_not():
    stats = EncoderStats(window=10)
    for i in range(25):
        stats.record(frame(float(i)))
    snap = stats.snapshot()
    assert snap.frames == 25
    assert snap.window_frames == 10
    assert [f.encode_ms for f in stats.window()] == [float(i) for i in range(15, 25)]
    assert snap.encode_ms_p50 == pytest.approx(19.5)


def test_snapshots_while_another_thread_records():
    stats = EncoderStats(window=50)
    done = threading.Event()

    def writer() -> None:
        for i in range(20_000):
            stats.record(frame(float(i % 7), key=i % 100 == 0))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    snaps = []
    while not done.is_set():
        snaps.append(stats.snapshot())
    thread.join()
    final = stats.snapshot()
    assert final.frames == 20_000
    assert final.keyframes == 200
    assert all(s.window_frames <= 50 for s in snaps)
    assert [s.frames for s in snaps] == sorted(s.frames for s in snaps)  # counters only grow


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        EncoderStats(window=0)
