"""Demand scenarios for the autoscaler benchmark: history to fit a forecast on, and surprise weeks.

Job: give the predictive autoscaler something it did not see coming.  A scenario is a weekly
demand curve (fraction of peak concurrency at t seconds after a Monday 00:00) for the week
under test and one for the weeks of history before it.  The history always follows the
ordinary curve (`broker.autoscale.simulate.weekly_shape`, scaled by the scenario's growth); the
test week adds the surprise:

  - ``normal``: nothing -- the benchmark week itself;
  - ``spike``: +40 % demand on Wednesday 17:00-23:00 (an evening event; stays under the
    benchmark pool's 4,000 seats);
  - ``day_spike``: +40 % on Thursday 10:00-16:00 (above the benchmark pool's cap at its
    default size: every plan is bounded by ``max_hosts`` there);
  - ``holiday``: Monday follows the weekend curve (a public holiday dip);
  - ``early_ramp`` / ``late_ramp``: every day's curve one hour earlier / later;
  - ``growth``: demand grows 5 % a week through the history and the test week (the trend).

`build` generates the arrivals (seeded: the test week with ``seed``, the history with
``seed + 1``, like any two weeks) and fits the forecast on the history, so the same call
reproduces the same figures.

Concurrency model: none.  Pure functions of their arguments; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import time
from typing import Final

from broker.autoscale.forecast import BIN_S, DemandForecast, concurrency_series, fit
from broker.autoscale.simulate import DAY_S, WEEK_S, Arrival, SimConfig, synthetic_demand, weekly_shape

Shape = Callable[[float], float]
HOUR_S: Final = 3600
SPIKE: Final = 1.4  # +40 %
WEEKLY_GROWTH: Final = 1.05


def _window(day: int, start_h: float, end_h: float, factor: float) -> Shape:
    lo, hi = day * DAY_S + start_h * HOUR_S, day * DAY_S + end_h * HOUR_S

    def shape(t: float) -> float:
        return weekly_shape(t) * (factor if lo <= t % WEEK_S < hi else 1.0)

    return shape


def _holiday_monday(t: float) -> float:
    return weekly_shape(t + 5 * DAY_S) if t % WEEK_S < DAY_S else weekly_shape(t)  # Monday shaped as Saturday


def _shifted(hours: float) -> Shape:
    return lambda t: weekly_shape(t + hours * HOUR_S)


def _growing(weeks_before: int) -> Shape:
    return lambda t: weekly_shape(t) * WEEKLY_GROWTH ** (t / WEEK_S - weeks_before)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    week: Shape  # the test week, t from its Monday 00:00
    growth: bool = False  # the history grows into the test week's level


SCENARIOS: Final = {s.name: s for s in (
    Scenario("normal", "the benchmark week: the curve the history follows", weekly_shape),
    Scenario("spike", "+40 % demand Wednesday 17:00-23:00", _window(2, 17, 23, SPIKE)),
    Scenario("day_spike", "+40 % demand Thursday 10:00-16:00", _window(3, 10, 16, SPIKE)),
    Scenario("holiday", "Monday is a holiday (weekend curve)", _holiday_monday),
    Scenario("early_ramp", "every day's curve 1 h earlier", _shifted(1)),
    Scenario("late_ramp", "every day's curve 1 h later", _shifted(-1)),
    Scenario("growth", "demand grows 5 % a week through history and the test week", _growing(0), growth=True),
)}
SURPRISES: Final = ("spike", "holiday", "early_ramp")  # the three surprise weeks
VARIANTS: Final = ("day_spike", "late_ramp", "growth")  # further variations, not tuned on


@dataclass(frozen=True)
class Built:
    scenario: Scenario
    week: tuple[Arrival, ...]
    forecast: DemandForecast | None
    history: tuple[float, ...] = ()  # mean concurrency per forecast bin over the history
    history_start_s: float = 0.0  # epoch seconds of the history's first bin


def build(scenario: Scenario, config: SimConfig, peak_concurrency: int, *, seed: int, history_weeks: int = 4,
          mean_duration_s: float = 3600.0) -> Built:
    """The test week's arrivals under ``scenario`` and a forecast fitted on ``history_weeks`` of ordinary history.

    The history ends where the test week (``config.start``, a Monday 00:00) begins.
    """
    if config.start.weekday() != 0 or config.start.utcoffset() or config.start.time() != time(0):
        raise ValueError("scenario weeks start on a Monday 00:00 UTC")
    week = synthetic_demand(peak_concurrency, config.days, seed=seed, mean_duration_s=mean_duration_s,
                            shape=scenario.week)
    if history_weeks < 1:
        return Built(scenario, week, None)
    history_shape = _growing(history_weeks) if scenario.growth else weekly_shape
    days = 7.0 * history_weeks
    history = synthetic_demand(peak_concurrency, days, seed=seed + 1, mean_duration_s=mean_duration_s,
                               shape=history_shape)
    start = config.start.timestamp() - days * DAY_S
    series = concurrency_series(history, days * DAY_S, BIN_S)
    forecast = fit(series, start, bin_s=BIN_S, time_zone="UTC", weeks=history_weeks)
    return Built(scenario, week, forecast, series, start)
