"""The resize policy: a viewer's window size -> the screen size, within the session's limits."""

from __future__ import annotations

import itertools

import pytest

from streamer.abr.viewport import ABS_MAX_SIDE_PX, MIN_SIDE_PX, ViewportLimits, fit, limits_for


def test_a_request_within_the_limits_is_kept_even() -> None:
    limits = limits_for(1280, 720)
    assert fit(1000, 601, limits) == (1000, 600)
    assert fit(1280, 720, limits) == (1280, 720)


def test_the_start_profile_is_always_allowed() -> None:
    limits = limits_for(3840, 2160, max_pixels=1920 * 1080, max_side=1920)
    assert limits.max_pixels == 3840 * 2160 and limits.max_side == 3840
    assert fit(3840, 2160, limits) == (3840, 2160)
    assert limits.framebuffer == (3840, 3840)


@pytest.mark.parametrize(("w", "h"), [(2560, 1440), (5120, 2880), (1170, 2532), (7680, 100), (100, 7680),
                                      (3000, 3000), (65, 65), (1, 1), (7681, 4321)])
def test_any_request_fits_even_within_area_and_side_keeping_its_shape(w: int, h: int) -> None:
    limits = limits_for(1280, 720, max_pixels=1920 * 1080, max_side=2048)
    fw, fh = fit(w, h, limits)
    assert fw % 2 == 0 and fh % 2 == 0
    assert MIN_SIDE_PX <= fw <= limits.max_side and MIN_SIDE_PX <= fh <= limits.max_side
    assert fw * fh <= limits.max_pixels
    if min(w, h) > 4 * MIN_SIDE_PX and fw > MIN_SIDE_PX and fh > MIN_SIDE_PX:
        assert abs(fw / fh - w / h) / (w / h) < 0.02  # scaled whole, not cropped


def test_scaling_down_is_monotonic() -> None:
    limits = limits_for(640, 480, max_pixels=640 * 480, max_side=800)
    sizes = [fit(w, w * 9 // 16, limits) for w in range(200, 4000, 50)]
    for (a, _), (b, _) in itertools.pairwise(sizes):
        assert b >= a


def test_bad_limits_and_sizes_raise() -> None:
    with pytest.raises(ValueError, match="max_side"):
        ViewportLimits(max_pixels=10_000, max_side=ABS_MAX_SIDE_PX + 2)
    with pytest.raises(ValueError, match="max_pixels"):
        ViewportLimits(max_pixels=100, max_side=1000)
    with pytest.raises(ValueError, match="positive"):
        fit(0, 100, limits_for(640, 480))
