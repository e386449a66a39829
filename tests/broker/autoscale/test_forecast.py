"""The demand forecaster: exact concurrency bins, profiles by time of week, trend, the recent-error
correction, and its error against the seasonal-naive baseline on synthetic weeks."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from broker.autoscale.forecast import (
    BIN_S,
    RATIO_LIMITS,
    TREND_LIMITS,
    WEEK_S,
    DemandForecast,
    ForecastError,
    concurrency_series,
    corrected_errors,
    fit,
    forecast_from_sessions,
    plain_errors,
    time_of_week_s,
    update_ratio,
)
from broker.autoscale.simulate import Arrival, synthetic_demand

MONDAY = datetime(2024, 1, 1, tzinfo=UTC).timestamp()  # 00:00 UTC
PER_WEEK = WEEK_S // BIN_S
UTC_ZONE = ZoneInfo("UTC")


def test_concurrency_series_is_the_exact_mean_per_bin() -> None:
    sessions = [Arrival(0.0, 600.0), Arrival(150.0, 300.0), Arrival(250.0, 10_000.0)]
    s = concurrency_series(sessions, 900.0, 300)
    # bin 0: 300 + 150 + 50 seconds; bin 1: 300 + 150 + 300; bin 2: 300 (the long one, clipped at 900)
    assert s == (500 / 300, 750 / 300, 1.0)
    assert concurrency_series([Arrival(0.0, 100.0)], 150.0, 100) == (1.0, 0.0)  # a last partial bin
    assert concurrency_series([], 600.0, 300) == (0.0, 0.0)


def test_time_of_week_follows_the_zone() -> None:
    assert time_of_week_s(MONDAY, UTC_ZONE) == 0.0
    assert time_of_week_s(MONDAY + 3 * 86_400 + 3600, UTC_ZONE) == 3 * 86_400 + 3600  # Thursday 01:00
    paris = ZoneInfo("Europe/Paris")  # UTC+1 in January
    assert time_of_week_s(MONDAY, paris) == 3600.0


def weekly(values: list[float]) -> list[float]:
    """A week of bins: bin k holds values[k % len(values)]."""
    return [values[k % len(values)] for k in range(PER_WEEK)]


def test_a_repeating_history_is_forecast_exactly_and_seasonal_naive_is_last_week() -> None:
    week = [float(k % 288) for k in range(PER_WEEK)]  # a daily sawtooth, 0..287 sessions
    history = week * 3
    fc = fit(history, MONDAY - 3 * WEEK_S)
    assert (fc.weeks, fc.method, fc.trend_per_week) == (3, "profile", 1.0)
    assert fc.profile == pytest.approx(tuple(week))  # the weighted mean of three equal weeks
    # at a bin centre the forecast is the bin; between two centres it interpolates
    assert fc.at(MONDAY + 10 * BIN_S + BIN_S / 2) == pytest.approx(10.0)
    assert fc.at(MONDAY + 11 * BIN_S) == pytest.approx(10.5)
    assert fc.peak(MONDAY + 10 * BIN_S, MONDAY + 13 * BIN_S) == pytest.approx(12.5)  # the window's end is highest

    last = [2.0] * PER_WEEK
    naive = fit([1.0] * PER_WEEK + last, MONDAY - 2 * WEEK_S, weeks=1, trend=False)
    assert (naive.method, naive.weeks) == ("seasonal-naive", 1)
    assert naive.at(MONDAY + 12_345) == 2.0


def test_recent_weeks_weigh_more() -> None:
    older, newer = [10.0] * PER_WEEK, [20.0] * PER_WEEK
    fc = fit(older + newer, MONDAY - 2 * WEEK_S, trend=False, decay=0.5)
    assert fc.profile[0] == pytest.approx((20 * 1 + 10 * 0.5) / 1.5)


def test_trend_is_fitted_and_clamped() -> None:
    growing = [100.0 * 1.1 ** w for w in range(4) for _ in range(PER_WEEK)]
    fc = fit(growing, MONDAY - 4 * WEEK_S)
    assert fc.trend_per_week == pytest.approx(1.1)
    # the profile is brought to the latest week's level (133.1), which holds mid-way through that week
    assert fc.profile[0] == pytest.approx(133.1)
    assert fc.at(MONDAY + WEEK_S / 2) == pytest.approx(133.1 * 1.1)  # one week after that level
    exploding = [1.0 * 3 ** w for w in range(3) for _ in range(PER_WEEK)]
    assert fit(exploding, MONDAY - 3 * WEEK_S).trend_per_week == TREND_LIMITS[1]


def test_a_profile_is_in_the_plan_time_zone() -> None:
    # demand 100 at 09:00-10:00 Paris time (08:00 UTC in January), else 0
    hot = {(9 * 3600 - 3600) // BIN_S + k for k in range(12)}  # UTC bins of 08:00-09:00 on Monday
    history = [100.0 if k in hot else 0.0 for k in range(PER_WEEK)]
    fc = fit(history, MONDAY - WEEK_S, time_zone="Europe/Paris", trend=False)
    assert fc.profile[9 * 3600 // BIN_S] == 100.0  # Monday 09:00 local
    assert fc.at(MONDAY + 8 * 3600 + 1800) == 100.0  # next Monday 08:30 UTC = 09:30 Paris


def test_less_than_a_week_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one week"):
        fit([1.0] * (PER_WEEK - 1), MONDAY)
    with pytest.raises(ValueError, match="divide a week"):
        fit([1.0] * PER_WEEK, MONDAY, bin_s=7000)
    assert forecast_from_sessions([Arrival(0.0, 60.0)], MONDAY, 6 * 86_400.0) is None


def test_the_correction_is_an_ewma_shrunk_and_clamped() -> None:
    # actual 150 vs forecast 100 with a pseudo-count of 10: raw (160 / 110), half of the way from 1.0
    assert update_ratio(1.0, 150, 100, 10) == pytest.approx(1 + 0.5 * (160 / 110 - 1))
    assert update_ratio(1.0, 0, 0, 10) == 1.0  # nothing expected, nothing seen
    assert update_ratio(1.0, 1000, 0, 1) == 1.0 + 0.5 * (RATIO_LIMITS[1] - 1.0)  # raw clamped at the limit
    r = 1.0
    for _ in range(30):
        r = update_ratio(r, 140, 100, 0.5)
    assert r == pytest.approx(140.5 / 100.5)  # converges to the steady ratio


def test_forecast_error_figures() -> None:
    e = ForecastError.of("x", [110.0, 90.0, 100.0], [100.0, 100.0, 100.0])
    assert (e.mae, e.bias, e.max_under) == (pytest.approx(20 / 3), 0.0, 10.0)
    assert e.mape_pct == pytest.approx(100 * 20 / 300)


def test_correction_tracks_a_level_shift_the_profile_missed() -> None:
    fc = DemandForecast(tuple([100.0] * PER_WEEK), BIN_S, "UTC", 1.0, MONDAY, 1, "profile")
    actual = [140.0] * 200  # 40 % above the forecast all along
    plain = plain_errors(fc, actual, MONDAY)
    corrected = corrected_errors(fc, actual, MONDAY, 600)
    assert plain.mae == pytest.approx(40.0) and plain.bias == pytest.approx(-40.0)
    assert corrected.mae < 0.2 * plain.mae


def test_on_synthetic_weeks_the_profile_beats_seasonal_naive_and_the_correction_beats_both() -> None:
    history = synthetic_demand(400, 28, seed=11)
    week = synthetic_demand(400, 7, seed=12)
    series = concurrency_series(history, 28 * 86_400.0)
    actual = concurrency_series(week, 7 * 86_400.0)
    profile = fit(series, MONDAY - 4 * WEEK_S)
    naive = fit(series, MONDAY - 4 * WEEK_S, weeks=1, trend=False)
    e_naive, e_profile = plain_errors(naive, actual, MONDAY), plain_errors(profile, actual, MONDAY)
    e_corrected = corrected_errors(profile, actual, MONDAY, 600)
    assert e_corrected.mae < e_profile.mae < e_naive.mae
    assert math.isclose(profile.trend_per_week, 1.0, abs_tol=0.03)
