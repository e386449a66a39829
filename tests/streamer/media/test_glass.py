"""The node's glass-to-glass histogram: Prometheus ``le`` buckets, bad viewer values ignored, a bounded
number of samples per message and per second, snapshots that add up across sessions."""

from __future__ import annotations

import math

import pytest

from broker.protocol import VIEWER_STATS_MAX_SAMPLES
from streamer.media.glass import (
    GLASS_BUCKETS_MS,
    GLASS_MAX_MS,
    SAMPLE_BURST,
    SAMPLES_PER_S,
    GlassHistogram,
    merge_snapshots,
)


def test_a_bound_counts_in_its_own_bucket_and_the_rest_over_the_last() -> None:
    h = GlassHistogram((16.0, 33.0, 150.0))
    assert h.snapshot() is None  # nothing to report before the first sample
    assert h.observe([0, 16, 16.01, 33, 149.9, 150, 151, 5000], now_ms=0) == 8
    assert h.snapshot() == {"le": [16.0, 33.0, 150.0], "counts": [2, 2, 2, 2], "sum": 5515.91}
    assert h.count == 8 and h.ignored == 0


def test_values_a_viewer_should_not_send_are_ignored_and_counted() -> None:
    h = GlassHistogram()
    bad: list[object] = [-0.1, GLASS_MAX_MS + 1, math.nan, math.inf, -math.inf, True, "40", None, [40]]
    assert h.observe([*bad, 40.0, GLASS_MAX_MS], now_ms=0) == 2
    assert h.ignored == len(bad) and h.count == 2
    assert h.sum_ms == 40.0 + GLASS_MAX_MS


def test_one_message_keeps_at_most_the_protocol_limit() -> None:
    h = GlassHistogram()
    assert h.observe([50.0] * (VIEWER_STATS_MAX_SAMPLES + 10), now_ms=0) == VIEWER_STATS_MAX_SAMPLES
    assert h.ignored == 10


def test_a_viewer_that_reports_too_often_is_held_to_the_budget() -> None:
    h = GlassHistogram()
    kept = sum(h.observe([50.0] * VIEWER_STATS_MAX_SAMPLES, now_ms=0) for _ in range(4))
    assert kept == SAMPLE_BURST  # the burst, then nothing
    assert h.observe([50.0] * 10, now_ms=500) == int(0.5 * SAMPLES_PER_S)  # half a second of refill
    assert h.observe([50.0], now_ms=500) == 0
    # a viewer at the web client's pace (8 samples every 2 s) never meets the limit
    paced = GlassHistogram()
    assert all(paced.observe([50.0] * 8, now_ms=t) == 8 for t in range(0, 600_000, 2_000))
    assert paced.ignored == 0


def test_snapshots_add_up_and_different_buckets_refuse_to() -> None:
    a, b = GlassHistogram(), GlassHistogram()
    a.observe([12.0, 40.0], now_ms=0)
    b.observe([40.0, 2500.0], now_ms=0)
    total = merge_snapshots([None, a.snapshot(), GlassHistogram().snapshot(), b.snapshot()])
    assert total is not None and total["le"] == list(GLASS_BUCKETS_MS)
    assert total["counts"][GLASS_BUCKETS_MS.index(16.0)] == 1
    assert total["counts"][GLASS_BUCKETS_MS.index(50.0)] == 2
    assert total["counts"][-1] == 1 and sum(total["counts"]) == 4 and total["sum"] == 2592.0
    assert merge_snapshots([None, None]) is None
    other = GlassHistogram((10.0, 20.0))
    other.observe([5.0], now_ms=0)
    with pytest.raises(ValueError, match="different buckets"):
        merge_snapshots([a.snapshot(), other.snapshot()])


@pytest.mark.parametrize("bounds", [(), (0.0, 10.0), (10.0, 10.0), (20.0, 10.0)])
def test_bounds_must_be_positive_and_increasing(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="increasing"):
        GlassHistogram(bounds)
