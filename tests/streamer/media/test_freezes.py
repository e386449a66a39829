"""Freeze counting (pure): gaps of 200 ms or more between frames, three intervals at low rates."""

from __future__ import annotations

import pytest

from streamer.media.freezes import FREEZE_MIN_MS, FreezeCounter, freeze_threshold_ms


@pytest.mark.parametrize("fps, threshold", [(60, 200.0), (30, 200.0), (15, 200.0), (10, 300.0), (1, 3000.0),
                                            (None, FREEZE_MIN_MS), (0, FREEZE_MIN_MS)])
def test_threshold_is_200_ms_or_three_intervals(fps: float | None, threshold: float) -> None:
    assert freeze_threshold_ms(fps) == pytest.approx(threshold)


def test_a_gap_of_200_ms_or_more_is_one_freeze_shorter_gaps_none() -> None:
    c = FreezeCounter()
    for t in range(0, 1000, 33):  # 30 fps: no freeze
        assert not c.frame(float(t))
    assert c.freezes == 0
    assert not c.frame(1000.0 + 166.0)  # a 199 ms gap from 967: not yet
    assert c.frame(1166.0 + 200.0)  # exactly 200 ms: a freeze
    assert (c.freezes, c.longest_ms) == (1, 200.0)


def test_an_open_gap_counts_once_when_seen_and_not_again_when_it_closes() -> None:
    c = FreezeCounter()
    c.frame(0.0)
    assert not c.idle(150.0)
    assert c.idle(250.0) and c.freezes == 1
    assert not c.idle(900.0)  # the same freeze
    assert not c.frame(1000.0)  # it ends: already counted
    assert (c.freezes, c.longest_ms) == (1, 1000.0)
    c.frame(1033.0)
    assert c.idle(1300.0) and c.freezes == 2  # a new one


def test_reset_starts_a_new_stream_without_a_freeze_for_the_gap() -> None:
    c = FreezeCounter()
    c.frame(0.0)
    c.frame(500.0)
    assert c.freezes == 1
    c.reset()
    assert not c.idle(5000.0)  # no stream yet
    c.frame(9000.0)  # a new viewer's first frame: the wait before it is no freeze
    assert c.freezes == 1
