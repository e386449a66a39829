"""The playout-delay policy (streamer.abr.playout): a fake clock, exact decisions."""

from __future__ import annotations

import pytest

from streamer.abr import playout
from streamer.abr.playout import JITTER_GROW_MS, RELAXED_MAX_MS, SHRINK_AFTER_MS, PlayoutReason, PlayoutState


def run(samples: list[tuple[int, float | None]]) -> list[tuple[int, int, bool, PlayoutReason]]:
    state = PlayoutState()
    out = []
    for now_ms, jitter in samples:
        d = playout.decide(state, jitter, now_ms)
        state = d.state
        out.append((d.min_ms, d.max_ms, d.changed, d.reason))
    return out


def test_a_smooth_path_keeps_zero_playout_delay() -> None:
    smooth = PlayoutReason.SMOOTH
    assert run([(0, None), (100, 2.0), (1_000, JITTER_GROW_MS), (2_000, None)]) == [
        (0, 0, False, smooth), (0, 0, False, smooth), (0, 0, False, smooth), (0, 0, False, smooth),
    ]


def test_jitter_relaxes_the_maximum_at_once_and_tightens_it_a_window_later() -> None:
    j = PlayoutReason.JITTER
    decisions = run([
        (0, 3.0),
        (1_000, 25.0),  # over the threshold: relaxed now
        (2_000, 4.0),  # lower, but the 20 ms sample is in the window
        (1_000 + SHRINK_AFTER_MS - 1, None),  # still in it
        (1_000 + SHRINK_AFTER_MS, None),  # it left the window: only 4 ms remains
        (1_000 + SHRINK_AFTER_MS + 100, 21.0),
    ])
    assert decisions == [
        (0, 0, False, PlayoutReason.SMOOTH),
        (0, RELAXED_MAX_MS, True, j),
        (0, RELAXED_MAX_MS, False, j),
        (0, RELAXED_MAX_MS, False, j),
        (0, 0, True, PlayoutReason.SMOOTH),
        (0, RELAXED_MAX_MS, True, j),
    ]


def test_the_window_keeps_the_highest_sample_only_while_it_is_recent() -> None:
    state = PlayoutState()
    for now_ms, jitter in ((0, 30.0), (1_000, 10.0), (2_000, 25.0), (3_000, 5.0)):
        d = playout.decide(state, jitter, now_ms)
        state = d.state
    assert d.peak_jitter_ms == 30.0
    assert state.peaks == ((0, 30.0), (2_000, 25.0), (3_000, 5.0))  # strictly decreasing: 10 can never lead
    d = playout.decide(state, None, SHRINK_AFTER_MS)  # the 30 ms sample is now 5 s old
    assert d.peak_jitter_ms == 25.0 and d.max_ms == RELAXED_MAX_MS


def test_time_never_goes_backwards_and_jitter_is_not_negative() -> None:
    state = playout.decide(PlayoutState(), 1.0, 1_000).state
    with pytest.raises(ValueError):
        playout.decide(state, 1.0, 999)
    with pytest.raises(ValueError):
        playout.decide(state, -1.0, 1_000)
