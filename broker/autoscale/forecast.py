"""Demand forecast: concurrent sessions by time of week, from a pool's history.

Job: tell the predictive autoscaler how many sessions a pool will run over the next boot
time plus one evaluation interval, before the ramp is visible in the live counts.

  - `concurrency_series` turns session requests (when, how long) into the mean number of
    concurrent sessions in each ``bin_s`` bin -- demand as users asked for it (a request that
    waited still counts from when it was made).
  - `fit` builds a `DemandForecast` from the last whole weeks of such a series: a
    time-of-week profile in the plan's time zone (bins of ``bin_s``; the recent weeks weigh
    more, ``decay`` per week back), a multiplicative weekly trend (least squares on the log
    of the weekly means, clamped to ``TREND_LIMITS``), each week scaled by the trend to the
    latest week's level before averaging.  ``fit(..., weeks=1, trend=False)`` is the
    seasonal-naive baseline: the value one week earlier.
  - The recent-error correction: the caller keeps a ratio of actual to forecast demand and
    updates it once per evaluation with `update_ratio` (an exponentially weighted ratio,
    shrunk toward 1 by a pseudo-count so a handful of sessions at night cannot swing it),
    then multiplies the forecast ahead by it.  `corrected_errors` replays exactly that on a
    series to measure it.

Concurrency model: none.  Pure values and functions; ``now`` is always an argument (epoch
seconds), nothing reads a clock or does I/O.  zoneinfo's cached tz database lookup is the
only outside read.

Invariants: a profile has exactly one value per time-of-week bin (``WEEK_S / bin_s``), each >=
0; the trend factor lies within ``TREND_LIMITS``; `update_ratio` stays within ``RATIO_LIMITS``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol
from zoneinfo import ZoneInfo

WEEK_S: Final = 7 * 86_400
BIN_S: Final = 300  # five minutes: one default autoscaler interval
TREND_LIMITS: Final = (0.8, 1.25)  # weekly growth factor a fit may claim
RATIO_LIMITS: Final = (0.25, 4.0)  # actual / forecast the correction may apply
RATIO_ALPHA: Final = 0.5  # weight of the newest actual/forecast ratio in the correction
PSEUDO_FRACTION: Final = 0.05  # correction pseudo-count: 5 % of the profile's mean concurrency
DEFAULT_DECAY: Final = 0.7  # weight of each older week in the profile


class Session(Protocol):
    @property
    def at_s(self) -> float: ...

    @property
    def duration_s(self) -> float: ...


def concurrency_series(sessions: Iterable[Session], horizon_s: float, bin_s: int = BIN_S) -> tuple[float, ...]:
    """Mean concurrent sessions in each bin of ``[0, horizon_s)`` (times are seconds from the series start)."""
    n = math.ceil(horizon_s / bin_s)
    area = [0.0] * (n + 1)
    full = [0.0] * (n + 1)  # difference array of whole bins covered
    for s in sessions:
        a, b = max(0.0, s.at_s), min(horizon_s, s.at_s + s.duration_s)
        if b <= a:
            continue
        ka, kb = int(a // bin_s), min(n - 1, int(b // bin_s))
        if ka == kb:
            area[ka] += b - a
            continue
        area[ka] += (ka + 1) * bin_s - a
        area[kb] += b - kb * bin_s
        full[ka + 1] += 1.0
        full[kb] -= 1.0
    out = []
    covered = 0.0
    for k in range(n):
        covered += full[k]
        width = min(bin_s, horizon_s - k * bin_s)
        out.append((area[k] + covered * bin_s) / width)
    return tuple(out)


def time_of_week_s(epoch_s: float, zone: ZoneInfo) -> float:
    """Seconds since Monday 00:00 local time in ``zone``."""
    local = datetime.fromtimestamp(epoch_s, zone)
    return local.weekday() * 86_400 + local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6


@dataclass(frozen=True)
class DemandForecast:
    """Concurrent sessions expected at any instant: a time-of-week profile times a weekly trend."""

    profile: tuple[float, ...]  # mean concurrency per time-of-week bin, Monday 00:00 local first
    bin_s: int
    time_zone: str
    trend_per_week: float  # multiplicative growth per week (1.0: flat)
    level_at_s: float  # epoch seconds at which the profile's level holds (the latest week's middle)
    weeks: int  # whole weeks of history behind it
    method: str  # "profile" or "seasonal-naive"

    @property
    def pseudo_count(self) -> float:
        """Sessions added to both sides of the actual/forecast ratio (see `update_ratio`)."""
        mean = sum(self.profile) / len(self.profile) if self.profile else 0.0
        return max(1.0, PSEUDO_FRACTION * mean)

    def at(self, epoch_s: float) -> float:
        """Expected concurrent sessions at ``epoch_s`` (linear between bin centres, trend applied)."""
        n = len(self.profile)
        x = time_of_week_s(epoch_s, ZoneInfo(self.time_zone)) / self.bin_s - 0.5
        i = math.floor(x)
        frac = x - i
        v = self.profile[i % n] * (1 - frac) + self.profile[(i + 1) % n] * frac
        return v * math.pow(self.trend_per_week, (epoch_s - self.level_at_s) / WEEK_S)

    def peak(self, start_s: float, end_s: float) -> float:
        """Most concurrent sessions expected at any instant of ``[start_s, end_s]``."""
        points = [start_s, end_s]
        k = math.floor(start_s / self.bin_s)  # bin centres in between (zone offsets are whole minutes)
        while True:
            centre = (k + 0.5) * self.bin_s
            if centre >= end_s:
                break
            if centre > start_s:
                points.append(centre)
            k += 1
        return max(self.at(p) for p in points)


def fit(series: Sequence[float], start_epoch_s: float, *, bin_s: int = BIN_S, time_zone: str = "UTC",
        weeks: int | None = None, trend: bool = True, decay: float = DEFAULT_DECAY) -> DemandForecast:
    """A forecast from ``series`` (mean concurrency per ``bin_s`` bin from ``start_epoch_s``).

    Uses the last ``weeks`` whole weeks (all of them when None); raises ValueError with less than
    one week.  ``trend=False`` keeps the trend at 1; ``weeks=1, trend=False`` is seasonal-naive.
    """
    if WEEK_S % bin_s:
        raise ValueError("bin_s must divide a week")
    per_week = WEEK_S // bin_s
    have = len(series) // per_week
    use = have if weeks is None else min(weeks, have)
    if use < 1:
        raise ValueError(f"a forecast needs at least one week of history ({per_week} bins of {bin_s} s)")
    end = len(series)
    chunks = [series[end - (j + 1) * per_week:end - j * per_week] for j in range(use)]  # j = 0: latest
    means = [sum(c) / per_week for c in chunks]
    growth = _trend(means) if trend else 1.0
    zone = ZoneInfo(time_zone)
    total = [0.0] * per_week
    weight = [0.0] * per_week
    for j, chunk in enumerate(chunks):
        w = decay ** j
        scale = growth ** j  # bring week j to the latest week's level
        first = start_epoch_s + (end - (j + 1) * per_week) * bin_s
        for i, v in enumerate(chunk):
            tow = int(time_of_week_s(first + (i + 0.5) * bin_s, zone) // bin_s) % per_week
            total[tow] += w * v * scale
            weight[tow] += w
    profile = [0.0] * per_week
    for k in range(per_week):  # a bin no week covered (a DST gap) takes the previous bin's value
        profile[k] = total[k] / weight[k] if weight[k] else profile[k - 1]
    level_at = start_epoch_s + end * bin_s - WEEK_S / 2
    method = "seasonal-naive" if use == 1 and not trend else "profile"
    return DemandForecast(tuple(max(0.0, v) for v in profile), bin_s, time_zone, growth, level_at, use, method)


def _trend(means: Sequence[float]) -> float:
    """Weekly growth factor from weekly means (latest first): exp of the least-squares slope of log mean."""
    pts = [(-j, math.log(m)) for j, m in enumerate(means) if m > 0]
    if len(pts) < 2:
        return 1.0
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return min(TREND_LIMITS[1], max(TREND_LIMITS[0], math.exp(slope)))


def update_ratio(previous: float, actual: float, forecast: float, pseudo: float) -> float:
    """The recent-error correction after one more observation: EWMA of (actual + k) / (forecast + k)."""
    raw = (max(0.0, actual) + pseudo) / (max(0.0, forecast) + pseudo)
    raw = min(RATIO_LIMITS[1], max(RATIO_LIMITS[0], raw))
    return min(RATIO_LIMITS[1], max(RATIO_LIMITS[0], previous + RATIO_ALPHA * (raw - previous)))


@dataclass(frozen=True)
class ForecastError:
    """Errors of per-bin predictions against actual mean concurrency."""

    label: str
    mae: float  # mean absolute error, sessions
    mape_pct: float  # mean absolute error / mean actual, percent (weighted, so quiet nights do not dominate)
    bias: float  # mean (predicted - actual), sessions
    max_under: float  # largest under-prediction, sessions (what waits are made of)

    @classmethod
    def of(cls, label: str, predicted: Sequence[float], actual: Sequence[float]) -> ForecastError:
        diffs = [p - a for p, a in zip(predicted, actual, strict=True)]
        n = max(1, len(diffs))
        total = sum(actual)
        mae = sum(abs(d) for d in diffs) / n
        return cls(label, mae, 100.0 * sum(abs(d) for d in diffs) / total if total else 0.0, sum(diffs) / n,
                   max((-d for d in diffs), default=0.0))


def plain_errors(forecast: DemandForecast, actual: Sequence[float], start_epoch_s: float,
                 label: str = "") -> ForecastError:
    """Errors of ``forecast`` (no correction) on each bin of ``actual`` (bins of the forecast's width)."""
    b = forecast.bin_s
    predicted = [forecast.at(start_epoch_s + (k + 0.5) * b) for k in range(len(actual))]
    return ForecastError.of(label or forecast.method, predicted, actual)


def corrected_errors(forecast: DemandForecast, actual: Sequence[float], start_epoch_s: float, lookahead_s: float,
                     label: str = "") -> ForecastError:
    """Errors of the corrected forecast made ``lookahead_s`` ahead, as the autoscaler makes it.

    At the end of bin k the ratio is updated with bin k's actual mean, and the bin ending
    ``lookahead_s`` later is predicted as the forecast times the ratio.  Bins predicted before
    any actual was seen use the plain forecast.
    """
    b = forecast.bin_s
    ahead = max(1, round(lookahead_s / b))
    predicted = [forecast.at(start_epoch_s + (k + 0.5) * b) for k in range(len(actual))]
    ratio = 1.0
    out = list(predicted)
    for k in range(len(actual)):
        ratio = update_ratio(ratio, actual[k], predicted[k], forecast.pseudo_count)
        j = k + ahead
        if j < len(actual):
            out[j] = predicted[j] * ratio
    return ForecastError.of(label or f"{forecast.method} + correction", out, actual)


def forecast_from_sessions(sessions: Iterable[Session], start_epoch_s: float, horizon_s: float, *,
                           time_zone: str = "UTC", weeks: int | None = None,
                           bin_s: int = BIN_S) -> DemandForecast | None:
    """Fit a forecast on session requests timed from ``start_epoch_s`` over ``horizon_s``; None under a week."""
    if horizon_s < WEEK_S:
        return None
    return fit(concurrency_series(sessions, horizon_s, bin_s), start_epoch_s, bin_s=bin_s, time_zone=time_zone,
               weeks=weeks)
