"""The self-test's picture and frame verdicts (pure: no encoder, no network)."""

from __future__ import annotations

import numpy as np

from streamer.desktop.game import read_stamp
from streamer.node.framecheck import FrameTally, luma, stamped_pattern

W, H = 320, 240


def y_of(frame_no: int, ts_ms: int = 1_000) -> np.ndarray:
    return luma(stamped_pattern(W, H, frame_no, ts_ms))


def test_the_pattern_carries_a_readable_stamp_and_is_deterministic() -> None:
    stamp = read_stamp(y_of(7, 123_456))
    assert stamp is not None and (stamp.frame_no, stamp.ts_ms) == (7, 123_456)
    assert np.array_equal(stamped_pattern(W, H, 7, 5), stamped_pattern(W, H, 7, 5))
    assert not np.array_equal(stamped_pattern(W, H, 7, 5), stamped_pattern(W, H, 8, 5))


def test_verdicts_checked_corrupt_and_recovering() -> None:
    t = FrameTally(W, H, psnr_floor_db=22.0)
    assert t.add(y_of(0), False, 0.0).kind == "checked"
    wrong = y_of(1).copy()
    wrong[40:] = y_of(9)[40:]  # frame 1's stamp over frame 9's picture
    v = t.add(wrong, False, 33.0)
    assert v.kind == "corrupt" and v.frame_no == 1 and v.psnr_db is not None and v.psnr_db < 22
    assert t.add(wrong, True, 66.0).kind == "recovering"  # references lost: a browser would not show it
    noise = np.zeros((H, W), dtype=np.uint8)
    assert t.add(noise, False, 99.0).detail == "stamp unreadable"
    assert (t.checked, t.corrupt, t.recovering) == (1, 2, 1)
    assert t.first_corrupt.startswith("frame 1: PSNR")


def test_missing_frames_inside_the_loss_and_its_recovery_are_explained_the_others_not() -> None:
    t = FrameTally(W, H)
    for n, ts in ((0, 0), (1, 33), (2, 66), (6, 200), (7, 233), (9, 300)):
        t.add(y_of(n, ts), False, ts + 10.0, loss_end_ms=150.0)
    assert t.missing() == [3, 4, 5, 8]
    assert t.recovered_at_ms == 210.0  # frame 6, the first rendered after the window, decoded at 210
    assert t.unexplained_missing(loss_start_ms=100.0, recovered_ms=t.recovered_at_ms) == 1  # frame 8
    assert t.unexplained_missing(loss_start_ms=None, recovered_ms=None) == 4
