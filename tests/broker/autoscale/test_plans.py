"""Scaling plans: schema errors name the field, the default plan round-trips, phase_at resolves
phases across time zones, DST, day boundaries and days no schedule covers."""

from __future__ import annotations

import copy
from datetime import UTC, date, datetime
from typing import Any

import pytest

from broker.autoscale.plans import (
    DEFAULT_PLAN,
    PhaseName,
    PredictiveSettings,
    ScalingPlan,
    phase_at,
    plan_json_schema,
)
from broker.errors import ValidationError


def body(**overrides: Any) -> dict[str, Any]:
    b = DEFAULT_PLAN.to_dict()
    b.update(overrides)
    return copy.deepcopy(b)


def weekday_only(time_zone: str = "UTC", **schedule: Any) -> ScalingPlan:
    s: dict[str, Any] = {"days": ["mon", "tue", "wed", "thu", "fri"],
                         "ramp_up": {"start": "07:00"}, "peak": {"start": "09:00"},
                         "ramp_down": {"start": "17:00"}, "off_peak": {"start": "19:00"}}
    s.update(schedule)
    return ScalingPlan.from_body({"time_zone": time_zone, "schedules": [s]})


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# --- schema ----------------------------------------------------------------------------------


def test_default_plan_round_trips_through_its_body() -> None:
    assert ScalingPlan.from_body(DEFAULT_PLAN.to_dict()) == DEFAULT_PLAN
    assert {s.name for s in DEFAULT_PLAN.schedules} == {"weekdays", "weekend"}
    assert sorted(d for s in DEFAULT_PLAN.schedules for d in s.days) == list(range(7))


def test_predictive_mode_is_a_stored_plan_field_with_defaults() -> None:
    plan = ScalingPlan.from_body({"schedules": [{"days": ["mon"]}], "mode": "predictive",
                                  "predictive": {"margin_pct": 15}})
    assert plan.is_predictive and plan.predictive == PredictiveSettings(margin_pct=15.0)
    assert plan.to_dict()["predictive"] == {"margin_pct": 15.0, "margin_seats": 4, "boot_s": 300,
                                            "history_weeks": 4}
    assert ScalingPlan.from_body(plan.to_dict()) == plan
    # a body stored before the field existed reads as reactive with default settings
    old = {k: v for k, v in DEFAULT_PLAN.to_dict().items() if k not in ("mode", "predictive")}
    assert ScalingPlan.from_body(old) == DEFAULT_PLAN and not DEFAULT_PLAN.is_predictive
    assert plan_json_schema()["properties"]["mode"]["enum"] == ["reactive", "predictive"]


def test_minimal_body_fills_phase_defaults() -> None:
    plan = ScalingPlan.from_body({"schedules": [{"days": ["mon"]}]})
    s = plan.schedules[0]
    assert plan.time_zone == "UTC"
    assert (s.ramp_up.strategy, s.ramp_down.strategy) == ("breadth-first", "depth-first")
    assert s.ramp_up.start < s.peak.start < s.ramp_down.start < s.off_peak.start
    assert s.name == "mon"


def _with_schedule(**changes: Any) -> dict[str, Any]:
    b = body()
    b["schedules"][0].update(changes)
    return b


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (body(time_zone="Mars/Olympus_Mons"), "time_zone"),
        (body(time_zone="../../etc/passwd"), "time_zone"),
        (body(time_zone=""), "time_zone"),
        (body(schedules=[]), "schedules"),
        (body(bogus=1), "bogus"),
        (body(scale_in_margin_pct=-1), "scale_in_margin_pct"),
        (_with_schedule(days=["monday"]), "schedules[0].days[0]"),
        (_with_schedule(days=[]), "schedules[0].days"),
        (_with_schedule(days=["mon", "mon"]), "schedules[0].days"),
        (_with_schedule(days=["sat"]), "schedules[1].days"),  # sat is also in the weekend schedule
        (_with_schedule(ramp_up={"start": "7:00"}), "schedules[0].ramp_up.start"),
        (_with_schedule(ramp_up={"start": "24:00"}), "schedules[0].ramp_up.start"),
        (_with_schedule(ramp_up={"start": "07:60"}), "schedules[0].ramp_up.start"),
        (_with_schedule(peak={"start": "06:00"}), "schedules[0].peak.start"),  # before ramp-up (07:00)
        (_with_schedule(off_peak={"start": "18:00"}), "schedules[0].off_peak.start"),  # == ramp_down
        (_with_schedule(peak={"start": "09:00", "capacity_threshold_pct": 0}),
         "schedules[0].peak.capacity_threshold_pct"),
        (_with_schedule(peak={"start": "09:00", "min_hosts_pct": 101}), "schedules[0].peak.min_hosts_pct"),
        (_with_schedule(peak={"start": "09:00", "strategy": "random"}), "schedules[0].peak.strategy"),
        (_with_schedule(scale_in_mode="kill"), "schedules[0].scale_in_mode"),
        (_with_schedule(logoff_wait_min=-5), "schedules[0].logoff_wait_min"),
        (body(mode="psychic"), "mode"),
        (body(mode=None), "mode"),
        (body(predictive=[]), "predictive"),
        (body(predictive={"margin_pct": -1}), "predictive.margin_pct"),
        (body(predictive={"margin_pct": 201}), "predictive.margin_pct"),
        (body(predictive={"margin_seats": 1.5}), "predictive.margin_seats"),
        (body(predictive={"boot_s": 3601}), "predictive.boot_s"),
        (body(predictive={"history_weeks": 0}), "predictive.history_weeks"),
        (body(predictive={"lookahead": 1}), "predictive.lookahead"),
    ],
)
def test_schema_errors_name_the_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        ScalingPlan.from_body(payload)
    assert err.value.field == field, err.value.detail
    assert err.value.detail.startswith(field)


def test_json_schema_describes_the_body() -> None:
    schema = plan_json_schema()
    assert schema["required"] == ["schedules"]
    phase = schema["properties"]["schedules"]["items"]["properties"]["ramp_down"]
    assert phase["properties"]["strategy"]["enum"] == ["breadth-first", "depth-first"]
    assert phase["properties"]["strategy"]["default"] == "depth-first"


# --- phase_at --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "phase", "day"),
    [
        (utc(2024, 1, 2, 6, 59, 59), PhaseName.OFF_PEAK, date(2024, 1, 1)),  # Tue before ramp-up: Monday's
        (utc(2024, 1, 2, 7, 0, 0), PhaseName.RAMP_UP, date(2024, 1, 2)),  # boundaries are inclusive
        (utc(2024, 1, 2, 8, 59), PhaseName.RAMP_UP, date(2024, 1, 2)),
        (utc(2024, 1, 2, 9, 0), PhaseName.PEAK, date(2024, 1, 2)),
        (utc(2024, 1, 2, 17, 0), PhaseName.RAMP_DOWN, date(2024, 1, 2)),
        (utc(2024, 1, 2, 19, 0), PhaseName.OFF_PEAK, date(2024, 1, 2)),
        (utc(2024, 1, 2, 23, 59, 59), PhaseName.OFF_PEAK, date(2024, 1, 2)),
        (utc(2024, 1, 6, 3, 0), PhaseName.OFF_PEAK, date(2024, 1, 5)),  # Saturday night: Friday's off-peak
        (utc(2024, 1, 6, 12, 0), PhaseName.OFF_PEAK, date(2024, 1, 5)),  # uncovered Saturday
        (utc(2024, 1, 7, 12, 0), PhaseName.OFF_PEAK, date(2024, 1, 5)),  # uncovered Sunday
        (utc(2024, 1, 8, 6, 0), PhaseName.OFF_PEAK, date(2024, 1, 5)),  # Monday before ramp-up
        (utc(2024, 1, 8, 7, 0), PhaseName.RAMP_UP, date(2024, 1, 8)),
    ],
)
def test_phase_at_utc_day_boundaries_and_uncovered_days(now: datetime, phase: PhaseName, day: date) -> None:
    p = phase_at(weekday_only(), now)
    assert (p.name, p.day) == (phase, day)


def test_phase_at_uses_the_plan_time_zone_and_follows_dst() -> None:
    plan = weekday_only("America/New_York")
    # Monday 2024-03-04, EST (UTC-5): 07:00 local is 12:00 UTC
    assert phase_at(plan, utc(2024, 3, 4, 11, 59)).name == PhaseName.OFF_PEAK
    assert phase_at(plan, utc(2024, 3, 4, 12, 0)).name == PhaseName.RAMP_UP
    # Monday 2024-03-11, EDT (UTC-4) since the 10th: 07:00 local is 11:00 UTC
    assert phase_at(plan, utc(2024, 3, 11, 11, 0)).name == PhaseName.RAMP_UP
    assert phase_at(plan, utc(2024, 3, 11, 10, 59)).name == PhaseName.OFF_PEAK
    # Friday 22:00 EST is Saturday 03:00 UTC: still Friday's off-peak, not "Saturday"
    p = phase_at(plan, utc(2024, 3, 9, 3, 0))
    assert (p.name, p.day) == (PhaseName.OFF_PEAK, date(2024, 3, 8))
    assert p.starts_at.isoformat() == "2024-03-08T19:00:00-05:00"


def test_phase_at_day_ahead_of_utc() -> None:
    plan = weekday_only("Asia/Tokyo")  # UTC+9
    # Sunday 23:00 UTC is Monday 08:00 in Tokyo
    p = phase_at(plan, utc(2024, 1, 7, 23, 0))
    assert (p.name, p.day) == (PhaseName.RAMP_UP, date(2024, 1, 8))
    # Friday 10:00 UTC is Friday 19:00 in Tokyo
    assert phase_at(plan, utc(2024, 1, 5, 10, 0)).name == PhaseName.OFF_PEAK


def test_phase_carries_the_phase_settings_and_scale_in_mode() -> None:
    plan = weekday_only(scale_in_mode="force_logoff", logoff_wait_min=20,
                        ramp_down={"start": "17:00", "capacity_threshold_pct": 75, "min_hosts_pct": 12.5})
    ramp_up = phase_at(plan, utc(2024, 1, 2, 8, 0))
    assert (ramp_up.scale_in, ramp_up.force_logoff, ramp_up.strategy) == (False, False, "breadth-first")
    down = phase_at(plan, utc(2024, 1, 2, 18, 0))
    assert (down.scale_in, down.force_logoff, down.logoff_wait_min) == (True, True, 20)
    assert (down.capacity_threshold_pct, down.min_hosts_pct, down.strategy) == (75, 12.5, "depth-first")
    assert "20 minutes" in down.logoff_message
    assert phase_at(plan, utc(2024, 1, 2, 20, 0)).force_logoff


def test_phase_at_rejects_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="aware"):
        phase_at(DEFAULT_PLAN, datetime(2024, 1, 1, 12, 0))
