"""Scaling plans: a pool's weekly schedule of autoscaling phases, its body schema, and `phase_at`.

Job: describe *when* a pool should run how much capacity and how it should place sessions,
in Azure Virtual Desktop's scaling-plan vocabulary.  A plan has a named IANA time zone and one
or more schedules; each schedule covers some days of the week and splits each of its days
into four phases that start at local wall-clock times::

    ramp_up.start < peak.start < ramp_down.start < off_peak.start      (all "HH:MM", same day)

Each phase carries a capacity threshold (percent of available seats in use above which the
autoscaler adds hosts), a minimum percent of the pool's hosts kept on (rounded up), and the
placement strategy (breadth-first spreads users while ramping up, depth-first packs them while
ramping down so hosts empty out).  Scale-in (draining and stopping hosts) happens only in the
ramp-down and off-peak phases, either when a drained host reaches zero sessions or, with
``force_logoff``, after users were warned and ``logoff_wait_min`` minutes passed.

A plan's ``mode`` is ``reactive`` (the default: the AVD rules above) or ``predictive``: the
autoscaler sizes the pool for forecast demand over the next boot time plus one evaluation,
with the safety margin of the plan's ``predictive`` settings, packs depth-first in every phase
and scales in whenever the forecast allows; the phases then contribute only their minimum
hosts and their scale-in mode (`broker.autoscale.policy` has the rules).

Phases wrap over midnight as in AVD: before a day's ``ramp_up.start`` the previous day's
off-peak phase is still running; a day no schedule covers is off-peak all day, continuing the
most recent covered day.  `phase_at` resolves all of that for one instant.

Concurrency model: none.  Everything here is pure: frozen values, no clock (`phase_at` takes
the instant), no I/O.  zoneinfo reads the tz database lazily (tzdata is a dependency); that is
a cached, read-only lookup, not a side effect a caller can observe.

Invariants (checked by `ScalingPlan.from_body`, assumed everywhere else):
  - the time zone resolves with zoneinfo;
  - every schedule has at least one day, and no weekday appears in two schedules;
  - a schedule's phase starts are strictly increasing within the day;
  - 0 < capacity_threshold_pct <= 100 and 0 <= min_hosts_pct <= 100;
  - ``mode`` is reactive or predictive; predictive settings are within their schema's bounds.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from enum import StrEnum
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from broker.errors import ValidationError
from broker.protocol import PlacementStrategy
from broker.validate import Field, to_json_schema, validate

DAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # index == datetime.weekday()
TIME_RE: Final = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")
MAX_SCHEDULES: Final = 7  # one per weekday at most
DEFAULT_LOGOFF_MESSAGE: Final = "This host is scaling in: save your work, your session ends in {minutes} minutes."


class PhaseName(StrEnum):
    """The four phases of a schedule day, in order."""

    RAMP_UP = "ramp_up"
    PEAK = "peak"
    RAMP_DOWN = "ramp_down"
    OFF_PEAK = "off_peak"


PHASE_ORDER: Final = (PhaseName.RAMP_UP, PhaseName.PEAK, PhaseName.RAMP_DOWN, PhaseName.OFF_PEAK)
SCALE_IN_PHASES: Final = frozenset({PhaseName.RAMP_DOWN, PhaseName.OFF_PEAK})


class PlanMode(StrEnum):
    """How the autoscaler decides capacity."""

    REACTIVE = "reactive"  # phase thresholds on live used capacity (Azure Virtual Desktop's rules)
    PREDICTIVE = "predictive"  # forecast demand over boot time + one interval, plus a safety margin


class ScaleInMode(StrEnum):
    """How ramp-down/off-peak stop a drained host that still has sessions."""

    ZERO_SESSIONS = "zero_sessions"  # wait until the last user leaves
    FORCE_LOGOFF = "force_logoff"  # warn users, wait logoff_wait_min, then end their sessions


@dataclass(frozen=True)
class PhaseSettings:
    """One phase of a schedule day: when it starts (local wall clock) and how it scales."""

    start: time
    strategy: str
    capacity_threshold_pct: float  # scale out when used seats / available seats exceeds this
    min_hosts_pct: float  # keep ceil(pct * total hosts / 100) hosts available


@dataclass(frozen=True)
class Schedule:
    """The phases of the days in ``days`` (0 = Monday ... 6 = Sunday, as ``datetime.weekday()``)."""

    name: str
    days: tuple[int, ...]
    ramp_up: PhaseSettings
    peak: PhaseSettings
    ramp_down: PhaseSettings
    off_peak: PhaseSettings
    scale_in_mode: str = ScaleInMode.ZERO_SESSIONS.value
    logoff_wait_min: int = 15
    logoff_message: str = DEFAULT_LOGOFF_MESSAGE

    def phase(self, name: PhaseName) -> PhaseSettings:
        settings: PhaseSettings = getattr(self, name.value)
        return settings


@dataclass(frozen=True)
class PredictiveSettings:
    """The predictive mode's knobs (used only when the plan's mode is predictive)."""

    margin_pct: float = 10.0  # capacity kept above forecast demand, percent of it
    margin_seats: int = 4  # and this many seats on top (quiet hours: a percentage of little is nothing)
    boot_s: int = 300  # expected start-to-ready time of a host: the forecast looks this far + one interval
    history_weeks: int = 4  # weeks of session history the forecast is fitted on

    def to_dict(self) -> dict[str, Any]:
        return {"margin_pct": self.margin_pct, "margin_seats": self.margin_seats, "boot_s": self.boot_s,
                "history_weeks": self.history_weeks}


@dataclass(frozen=True)
class ScalingPlan:
    """A pool's scaling plan: time zone, schedules, the anti-flapping knobs and the mode."""

    name: str
    time_zone: str
    schedules: tuple[Schedule, ...]
    scale_in_cooldown_min: int = 15  # no scale-in within this long after a scale-out
    undrain_hold_min: int = 30  # a host the autoscaler undrained is not drained again within this
    scale_in_margin_pct: float = 10.0  # scale in only if used capacity after it <= threshold - margin
    mode: str = PlanMode.REACTIVE.value
    predictive: PredictiveSettings = PredictiveSettings()

    @property
    def is_predictive(self) -> bool:
        return self.mode == PlanMode.PREDICTIVE

    @classmethod
    def from_body(cls, body: Any) -> ScalingPlan:
        """Validate a JSON body (see `PLAN_SCHEMA`); raises ValidationError naming the field."""
        return _parse_plan(body)

    def to_dict(self) -> dict[str, Any]:
        """The JSON body that `from_body` turns back into this plan."""
        return {
            "name": self.name,
            "time_zone": self.time_zone,
            "schedules": [_schedule_to_dict(s) for s in self.schedules],
            "scale_in_cooldown_min": self.scale_in_cooldown_min,
            "undrain_hold_min": self.undrain_hold_min,
            "scale_in_margin_pct": self.scale_in_margin_pct,
            "mode": self.mode,
            "predictive": self.predictive.to_dict(),
        }


@dataclass(frozen=True)
class Phase:
    """The phase running at one instant, with everything the autoscaler needs from the plan."""

    name: PhaseName
    schedule: str
    day: date  # the local date whose schedule this phase belongs to (yesterday while wrapping)
    starts_at: datetime  # aware, in the plan's time zone
    strategy: str
    capacity_threshold_pct: float
    min_hosts_pct: float
    scale_in: bool  # ramp-down and off-peak drain and stop hosts; ramp-up and peak never do
    force_logoff: bool
    logoff_wait_min: int
    logoff_message: str


# --- schema ---------------------------------------------------------------------------------

_STRATEGIES: Final = tuple(s.value for s in PlacementStrategy)


def _phase_schema(start: str, strategy: str, threshold: float, min_pct: float) -> dict[str, Field]:
    return {
        "start": Field("str", default=start, max_length=5, pattern_hint="HH:MM",
                       description="Local start time (24 h, HH:MM) in the plan's time zone"),
        "strategy": Field("str", default=strategy, choices=_STRATEGIES),
        "capacity_threshold_pct": Field("number", default=threshold, minimum=1, maximum=100,
                                        description="Percent of available seats in use above which hosts are added"),
        "min_hosts_pct": Field("number", default=min_pct, minimum=0, maximum=100,
                               description="Percent of the pool's hosts kept available (rounded up)"),
    }


PHASE_SCHEMAS: Final = {
    PhaseName.RAMP_UP: _phase_schema("07:00", PlacementStrategy.BREADTH_FIRST.value, 60, 20),
    PhaseName.PEAK: _phase_schema("09:00", PlacementStrategy.BREADTH_FIRST.value, 60, 20),
    PhaseName.RAMP_DOWN: _phase_schema("18:00", PlacementStrategy.DEPTH_FIRST.value, 90, 10),
    PhaseName.OFF_PEAK: _phase_schema("20:00", PlacementStrategy.DEPTH_FIRST.value, 90, 5),
}

SCHEDULE_SCHEMA: Final = {
    "name": Field("str", default="", max_length=64),
    "days": Field("array", required=True, items=Field("str", choices=DAYS), max_items=7,
                  description="Days of week this schedule covers (mon..sun); a day may be in one schedule only"),
    **{p.value: Field("object", default=None, nullable=True, schema=PHASE_SCHEMAS[p]) for p in PHASE_ORDER},
    "scale_in_mode": Field("str", default=ScaleInMode.ZERO_SESSIONS.value, choices=tuple(m.value for m in ScaleInMode),
                           description="zero_sessions: stop a drained host when empty; force_logoff: warn, wait, end"),
    "logoff_wait_min": Field("int", default=15, minimum=0, maximum=24 * 60,
                             description="Minutes between the warning and the forced logoff"),
    "logoff_message": Field("str", default=DEFAULT_LOGOFF_MESSAGE, max_length=500),
}

PREDICTIVE_SCHEMA: Final = {
    "margin_pct": Field("number", default=PredictiveSettings.margin_pct, minimum=0, maximum=200,
                        description="Capacity kept above forecast demand, percent of the forecast"),
    "margin_seats": Field("int", default=PredictiveSettings.margin_seats, minimum=0, maximum=100_000,
                          description="Seats kept free on top of the percentage"),
    "boot_s": Field("int", default=PredictiveSettings.boot_s, minimum=0, maximum=3600,
                    description="Expected seconds from a host start to its first session; the forecast "
                                "looks this far plus one autoscaler interval ahead"),
    "history_weeks": Field("int", default=PredictiveSettings.history_weeks, minimum=1, maximum=12,
                           description="Weeks of session history the forecast is fitted on"),
}

PLAN_SCHEMA: Final = {
    "name": Field("str", default="default", max_length=64),
    "time_zone": Field("str", default="UTC", max_length=64, description="IANA time zone, e.g. Europe/Paris"),
    "schedules": Field("array", required=True, items=Field("object", schema=SCHEDULE_SCHEMA),
                       max_items=MAX_SCHEDULES),
    "scale_in_cooldown_min": Field("int", default=15, minimum=0, maximum=24 * 60,
                                   description="No scale-in within this many minutes of a scale-out"),
    "undrain_hold_min": Field("int", default=30, minimum=0, maximum=24 * 60,
                              description="A host undrained by the autoscaler is not drained again within this"),
    "scale_in_margin_pct": Field("number", default=10.0, minimum=0, maximum=99,
                                 description="Scale in only while used capacity stays <= threshold - margin"),
    "mode": Field("str", default=PlanMode.REACTIVE.value, choices=tuple(m.value for m in PlanMode),
                  description="reactive: phase thresholds on live load; predictive: forecast demand from the "
                              "pool's history plus a safety margin (see predictive)"),
    "predictive": Field("object", default=None, nullable=True, schema=PREDICTIVE_SCHEMA,
                        description="Predictive mode settings (defaults when omitted)"),
}


def plan_json_schema() -> dict[str, Any]:
    """JSON Schema of a plan body (for the OpenAPI document)."""
    return to_json_schema(PLAN_SCHEMA)


def parse_time(value: str, field_path: str) -> time:
    """'HH:MM' (24 h) -> time; ValidationError naming ``field_path`` otherwise."""
    m = TIME_RE.match(value)
    if not m:
        raise ValidationError(f"{field_path}: must be a 24-hour time HH:MM (00:00-23:59)", field=field_path)
    return time(int(m.group(1)), int(m.group(2)))


def check_time_zone(value: str, field_path: str = "time_zone") -> str:
    """A zoneinfo-resolvable IANA name, else ValidationError on ``field_path``."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError(f"{field_path}: unknown time zone {value!r} (use an IANA name such as "
                              f"'Europe/Paris' or 'UTC')", field=field_path) from None
    return value


def _parse_schedule(data: dict[str, Any], path: str) -> Schedule:
    days_raw: list[str] = data["days"]
    if not days_raw:
        raise ValidationError(f"{path}.days: must list at least one day", field=f"{path}.days")
    if len(set(days_raw)) != len(days_raw):
        raise ValidationError(f"{path}.days: lists a day twice", field=f"{path}.days")
    phases: dict[PhaseName, PhaseSettings] = {}
    for p in PHASE_ORDER:
        raw = data[p.value]
        if raw is None:
            raw = validate({}, PHASE_SCHEMAS[p], prefix=f"{path}.{p.value}.")
        phases[p] = PhaseSettings(
            start=parse_time(raw["start"], f"{path}.{p.value}.start"),
            strategy=raw["strategy"],
            capacity_threshold_pct=float(raw["capacity_threshold_pct"]),
            min_hosts_pct=float(raw["min_hosts_pct"]),
        )
    for before, after in itertools.pairwise(PHASE_ORDER):
        if phases[after].start <= phases[before].start:
            f = f"{path}.{after.value}.start"
            raise ValidationError(f"{f}: must be later than {before.value}.start "
                                  f"({phases[before].start:%H:%M}); a day runs ramp_up < peak < ramp_down < "
                                  "off_peak", field=f)
    return Schedule(
        name=data["name"] or "+".join(days_raw),
        days=tuple(sorted(DAYS.index(d) for d in days_raw)),
        ramp_up=phases[PhaseName.RAMP_UP],
        peak=phases[PhaseName.PEAK],
        ramp_down=phases[PhaseName.RAMP_DOWN],
        off_peak=phases[PhaseName.OFF_PEAK],
        scale_in_mode=data["scale_in_mode"],
        logoff_wait_min=data["logoff_wait_min"],
        logoff_message=data["logoff_message"],
    )


def _parse_plan(body: Any) -> ScalingPlan:
    data = validate(body, PLAN_SCHEMA)
    check_time_zone(data["time_zone"])
    if not data["schedules"]:
        raise ValidationError("schedules: a plan needs at least one schedule", field="schedules")
    schedules = tuple(_parse_schedule(s, f"schedules[{i}]") for i, s in enumerate(data["schedules"]))
    owner: dict[int, int] = {}
    for i, s in enumerate(schedules):
        for d in s.days:
            if d in owner:
                raise ValidationError(f"schedules[{i}].days: {DAYS[d]} is already in schedules[{owner[d]}]",
                                      field=f"schedules[{i}].days")
            owner[d] = i
    raw = data["predictive"]
    if raw is None:
        raw = validate({}, PREDICTIVE_SCHEMA, prefix="predictive.")
    predictive = PredictiveSettings(margin_pct=float(raw["margin_pct"]), margin_seats=raw["margin_seats"],
                                    boot_s=raw["boot_s"], history_weeks=raw["history_weeks"])
    return ScalingPlan(name=data["name"], time_zone=data["time_zone"], schedules=schedules,
                       scale_in_cooldown_min=data["scale_in_cooldown_min"], undrain_hold_min=data["undrain_hold_min"],
                       scale_in_margin_pct=float(data["scale_in_margin_pct"]), mode=data["mode"],
                       predictive=predictive)


def _schedule_to_dict(s: Schedule) -> dict[str, Any]:
    out: dict[str, Any] = {"name": s.name, "days": [DAYS[d] for d in s.days]}
    for p in PHASE_ORDER:
        ps = s.phase(p)
        out[p.value] = {"start": f"{ps.start:%H:%M}", "strategy": ps.strategy,
                        "capacity_threshold_pct": ps.capacity_threshold_pct, "min_hosts_pct": ps.min_hosts_pct}
    out.update(scale_in_mode=s.scale_in_mode, logoff_wait_min=s.logoff_wait_min, logoff_message=s.logoff_message)
    return out


# --- default plan ---------------------------------------------------------------------------

DEFAULT_PLAN: Final = ScalingPlan.from_body({
    "name": "default",
    "time_zone": "UTC",
    "schedules": [
        {   # AVD's suggested pooled defaults: ramp-up 60 % / 20 % hosts, ramp-down 90 % / 10 % hosts
            "name": "weekdays",
            "days": ["mon", "tue", "wed", "thu", "fri"],
            "ramp_up": {"start": "07:00", "strategy": "breadth-first", "capacity_threshold_pct": 60,
                        "min_hosts_pct": 20},
            "peak": {"start": "09:00", "strategy": "breadth-first", "capacity_threshold_pct": 60,
                     "min_hosts_pct": 20},
            "ramp_down": {"start": "18:00", "strategy": "depth-first", "capacity_threshold_pct": 90,
                          "min_hosts_pct": 10},
            "off_peak": {"start": "20:00", "strategy": "depth-first", "capacity_threshold_pct": 90,
                         "min_hosts_pct": 5},
        },
        {
            "name": "weekend",
            "days": ["sat", "sun"],
            "ramp_up": {"start": "09:00", "strategy": "breadth-first", "capacity_threshold_pct": 60,
                        "min_hosts_pct": 5},
            "peak": {"start": "11:00", "strategy": "breadth-first", "capacity_threshold_pct": 60,
                     "min_hosts_pct": 5},
            "ramp_down": {"start": "17:00", "strategy": "depth-first", "capacity_threshold_pct": 90,
                          "min_hosts_pct": 5},
            "off_peak": {"start": "20:00", "strategy": "depth-first", "capacity_threshold_pct": 90,
                         "min_hosts_pct": 5},
        },
    ],
})


# --- phase_at -------------------------------------------------------------------------------


def _schedule_for(plan: ScalingPlan, weekday: int) -> Schedule | None:
    for s in plan.schedules:
        if weekday in s.days:
            return s
    return None


def _make_phase(s: Schedule, name: PhaseName, day: date, zone: ZoneInfo) -> Phase:
    ps = s.phase(name)
    force = s.scale_in_mode == ScaleInMode.FORCE_LOGOFF
    scale_in = name in SCALE_IN_PHASES
    return Phase(
        name=name, schedule=s.name, day=day, starts_at=datetime.combine(day, ps.start, tzinfo=zone),
        strategy=ps.strategy, capacity_threshold_pct=ps.capacity_threshold_pct, min_hosts_pct=ps.min_hosts_pct,
        scale_in=scale_in, force_logoff=scale_in and force, logoff_wait_min=s.logoff_wait_min,
        logoff_message=s.logoff_message.replace("{minutes}", str(s.logoff_wait_min)),
    )


def phase_at(plan: ScalingPlan, now_utc: datetime) -> Phase:
    """The phase running at ``now_utc`` (an aware datetime, any zone) under ``plan``.

    The local wall clock in ``plan.time_zone`` is compared with the day's phase starts; before
    the day's ramp-up (or on a day no schedule covers) the most recent covered day's off-peak
    phase is still running.  Raises ValueError for a naive datetime.
    """
    if now_utc.tzinfo is None or now_utc.utcoffset() is None:
        raise ValueError("phase_at needs an aware datetime (pass UTC)")
    zone = ZoneInfo(plan.time_zone)
    local = now_utc.astimezone(zone)
    today = local.date()
    wall = local.time().replace(tzinfo=None)
    s = _schedule_for(plan, today.weekday())
    if s is not None and wall >= s.ramp_up.start:
        current = PhaseName.RAMP_UP
        for p in PHASE_ORDER[1:]:
            if wall >= s.phase(p).start:
                current = p
        return _make_phase(s, current, today, zone)
    for back in range(1, 8):  # the wrap: yesterday's (or the last covered day's) off-peak
        day = today - timedelta(days=back)
        prev = _schedule_for(plan, day.weekday())
        if prev is not None:
            return _make_phase(prev, PhaseName.OFF_PEAK, day, zone)
    raise AssertionError("a validated plan covers at least one weekday")
