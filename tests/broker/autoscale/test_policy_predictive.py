"""Predictive mode of the pure autoscaling policy: exact sizing from a forecast, the recent-error
correction and the live trend, scale-in by stopping empty hosts, and the safety invariants."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from broker.autoscale.forecast import BIN_S, WEEK_S, DemandForecast
from broker.autoscale.plans import PlanMode, PredictiveSettings, ScalingPlan
from broker.autoscale.policy import (
    AutoscaleState,
    Decision,
    Drain,
    HostSnapshot,
    PoolSnapshot,
    Reason,
    SetStrategy,
    StartHosts,
    StopHost,
    Undrain,
    decide,
    size_pool,
)
from broker.models import PoolConfig

MONDAY = datetime(2024, 1, 1, tzinfo=UTC)
PER_WEEK = WEEK_S // BIN_S


def plan(min_pct: float = 0, margin_pct: float = 10, margin_seats: int = 2, hold_min: int = 30) -> ScalingPlan:
    phase = {"capacity_threshold_pct": 60, "min_hosts_pct": min_pct}
    return ScalingPlan.from_body({
        "time_zone": "UTC", "mode": "predictive", "undrain_hold_min": hold_min,
        "predictive": {"margin_pct": margin_pct, "margin_seats": margin_seats, "boot_s": 300},
        "schedules": [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                       "ramp_up": {"start": "06:00", **phase}, "peak": {"start": "09:00", **phase},
                       "ramp_down": {"start": "17:00", **phase}, "off_peak": {"start": "20:00", **phase}}],
    })


def flat(value: float) -> DemandForecast:
    return DemandForecast(tuple([value] * PER_WEEK), BIN_S, "UTC", 1.0, MONDAY.timestamp(), 1, "profile")


RAMP = DemandForecast(tuple(float(k) for k in range(PER_WEEK)), BIN_S, "UTC", 1.0, MONDAY.timestamp(), 1,
                      "profile")  # bin k (Monday 00:00 + k * 5 min) expects k sessions


def snap(hosts: list[tuple[str, str, int]], forecast: DemandForecast | None, *, total: int = 40, queued: int = 0,
         strategy: str = "depth-first") -> PoolSnapshot:
    return PoolSnapshot(PoolConfig("p", strategy=strategy, max_sessions_per_gpu=4),
                        tuple(HostSnapshot(h, st, n, 4) for h, st, n in hosts), max_hosts=total, queued=queued,
                        new_host_seats=4, interval_s=300.0, forecast=forecast)


def full_hosts(n: int, sessions: int = 4, prefix: str = "h") -> list[tuple[str, str, int]]:
    return [(f"{prefix}{i:02d}", "up", sessions) for i in range(n)]


def only(decisions: tuple[Decision, ...], kind: type) -> list[Decision]:
    return [d for d in decisions if isinstance(d, kind)]


def test_hosts_start_for_the_forecast_peak_over_boot_plus_one_interval() -> None:
    now = MONDAY + timedelta(seconds=100.5 * BIN_S)  # bin 100's centre: 100 expected, 100 on hosts
    decisions, state = decide(snap(full_hosts(25), RAMP), now, plan(), AutoscaleState())
    # the forecast peaks at the look-ahead's end (now + 300 s boot + 300 s interval: bin 102's centre): 102;
    # target ceil(102 * 1.10 + 2) = 115 seats; 100 seats up: 15 missing -> 4 hosts of 4 seats
    [start] = only(decisions, StartHosts)
    assert (start.count, start.reason) == (4, Reason.FORECAST)
    facts = dict(start.facts)
    assert facts == {"actual": 100, "capacity": 100, "lookahead_s": 600.0, "forecast": 102.0, "correction": 1.0,
                     "trend": 100.0, "margin_pct": 10.0, "margin_seats": 2, "target": 115}
    assert "forecast 102" in start.detail and "target 115" in start.detail
    assert state.forecast_ratio == 1.0 and (state.last_demand, state.last_demand_s) == (100.0, now.timestamp())
    assert only(decisions, Drain) == [] and only(decisions, SetStrategy) == []


def test_the_recent_error_correction_scales_the_forecast_and_the_larger_bound_wins() -> None:
    now = MONDAY + timedelta(hours=10)
    # 140 sessions where 100 were expected: pseudo-count 5, raw (145 / 105), half-way from 1.0 -> 1.190...
    decisions, state = decide(snap(full_hosts(35), flat(100.0)), now, plan(), AutoscaleState())
    assert state.forecast_ratio == pytest.approx(1 + 0.5 * (145 / 105 - 1))
    [start] = only(decisions, StartHosts)
    # corrected forecast 119 < actual 140: the live demand bounds the target, ceil(140 * 1.1 + 2) = 156
    assert (start.count, start.reason) == (4, Reason.ACTUAL)
    assert dict(start.facts)["forecast"] == pytest.approx(119.0, abs=0.1) and dict(start.facts)["target"] == 156
    # the next evaluation starts from the kept ratio
    _, state2 = decide(snap(full_hosts(35), flat(100.0)), now + timedelta(minutes=5), plan(), state)
    assert state2.forecast_ratio > state.forecast_ratio


def test_without_a_forecast_the_live_trend_is_extrapolated_over_the_look_ahead() -> None:
    now = MONDAY + timedelta(hours=8)
    before = AutoscaleState(last_demand=100.0, last_demand_s=(now - timedelta(minutes=5)).timestamp())
    decisions, state = decide(snap(full_hosts(30), None, total=60), now, plan(), before)
    # 120 now, 100 five minutes ago: +20 per 300 s, over 600 s -> 160; ceil(160 * 1.1 + 2) = 178 seats,
    # 120 up: 58 missing -> 15 hosts
    [start] = only(decisions, StartHosts)
    assert (start.count, start.reason) == (15, Reason.ACTUAL)
    assert "forecast" not in dict(start.facts) and dict(start.facts)["trend"] == 160.0
    assert state.forecast_ratio == 1.0
    # a stale last demand (over three intervals old) is not extrapolated from
    stale = AutoscaleState(last_demand=0.0, last_demand_s=(now - timedelta(hours=1)).timestamp())
    [start] = only(decide(snap(full_hosts(30), None), now, plan(), stale)[0], StartHosts)
    assert dict(start.facts)["target"] == 134  # ceil(120 * 1.1 + 2)


def test_surplus_stops_empty_hosts_in_the_same_evaluation_and_never_drains_a_busy_one() -> None:
    now = MONDAY + timedelta(hours=21)
    hosts = [("h0", "up", 4), ("h1", "up", 3), ("h2", "up", 0), ("h3", "up", 0), ("h4", "up", 0)]
    decisions, state = decide(snap(hosts, flat(7.0), strategy="breadth-first"), now, plan(), AutoscaleState())
    # target ceil(7 * 1.1 + 2) = 10 seats of 20: h2 and h3 go (20 -> 12), h4 stays (12 - 4 < 10); h1 keeps
    # its free seat
    assert decisions == (
        SetStrategy("depth-first", Reason.PREDICTIVE_STRATEGY, "predictive plans pack depth-first"),
        *decisions[1:],
    )
    assert [(type(d).__name__, getattr(d, "host_id", ""), d.reason) for d in decisions[1:]] == [
        ("Drain", "h2", Reason.FORECAST_SURPLUS), ("StopHost", "h2", Reason.DRAINED_EMPTY),
        ("Drain", "h3", Reason.FORECAST_SURPLUS), ("StopHost", "h3", Reason.DRAINED_EMPTY)]
    assert set(state.drained) == {"h2", "h3"}
    # the same snapshot with a request queued: no scale-in at all
    queued = decide(snap(hosts, flat(7.0), queued=1), now, plan(), AutoscaleState())[0]
    assert only(queued, Drain) == [] and only(queued, StopHost) == []


def test_the_phase_minimum_and_the_undrain_hold_keep_hosts() -> None:
    now = MONDAY + timedelta(hours=21)
    hosts = [("h0", "up", 1), ("h1", "up", 0), ("h2", "up", 0), ("h3", "up", 0)]
    kept = decide(snap(hosts, flat(1.0), total=6), now, plan(min_pct=50), AutoscaleState())[0]
    assert [d.host_id for d in only(kept, StopHost)] == ["h1"]  # 50 % of 6 hosts = 3 stay available
    held = AutoscaleState(undrained={"h1": (now - timedelta(minutes=10)).timestamp()})
    kept = decide(snap(hosts, flat(1.0), total=6), now, plan(), held)[0]
    assert [d.host_id for d in only(kept, StopHost)] == ["h2", "h3"]  # h1 was undrained 10 min ago


def test_hosts_we_drained_are_undrained_before_any_start() -> None:
    now = MONDAY + timedelta(hours=9)
    hosts = [*full_hosts(4), ("d0", "draining", 1), ("d1", "draining", 2)]
    previous = AutoscaleState(drained={"d0": 0.0, "d1": 0.0})
    # actual 19 = forecast (ratio 1): target ceil(19 * 1.1 + 2) = 23; capacity 16 up + 3 on draining = 19
    decisions, state = decide(snap(hosts, flat(19.0)), now, plan(), previous)
    undrains = only(decisions, Undrain)
    assert [(d.host_id, d.reason) for d in undrains] == [("d0", Reason.FORECAST), ("d1", Reason.FORECAST)]
    assert only(decisions, StartHosts) == []  # 3 + 2 free seats cover the 4 missing
    assert set(state.drained) == set() and set(state.undrained) == {"d0", "d1"}
    # a drained host that emptied is stopped when not needed (8 sessions, target 11 of 16 seats) ...
    quiet = decide(snap([*full_hosts(4, sessions=2), ("d0", "draining", 0)], flat(8.0)), now, plan(),
                   AutoscaleState(drained={"d0": 0.0}))[0]
    assert [(d.host_id, d.reason) for d in only(quiet, StopHost)] == [("d0", Reason.DRAINED_EMPTY)]
    # ... and undrained instead when it is (16 sessions: target 20 of 16 seats)
    busy = decide(snap([*full_hosts(4), ("d0", "draining", 0)], flat(16.0)), now, plan(),
                  AutoscaleState(drained={"d0": 0.0}))[0]
    assert only(busy, StopHost) == [] and [d.host_id for d in only(busy, Undrain)] == ["d0"]


def test_starts_never_pass_max_hosts() -> None:
    decisions, _ = decide(snap(full_hosts(10), flat(400.0), total=12), MONDAY + timedelta(hours=10), plan(),
                          AutoscaleState(forecast_ratio=1.0))
    [start] = only(decisions, StartHosts)
    assert start.count == 2


def test_size_pool_is_the_rule() -> None:
    settings = PredictiveSettings(margin_pct=20, margin_seats=0, boot_s=600)
    sizing, ratio = size_pool(settings, None, 1000.0, 60.0, 50, 40, AutoscaleState())
    assert (sizing.lookahead_s, sizing.target, sizing.bound, ratio) == (660.0, 60, Reason.ACTUAL, 1.0)
    assert "no forecast" in sizing.text()


def test_plan_mode_round_trips_and_reactive_plans_are_unchanged() -> None:
    p = plan()
    assert p.is_predictive and p.mode == PlanMode.PREDICTIVE
    assert ScalingPlan.from_body(p.to_dict()) == p
    reactive = replace(p, mode=PlanMode.REACTIVE.value)
    decisions, state = decide(snap(full_hosts(2), flat(100.0)), MONDAY + timedelta(hours=10), reactive,
                              AutoscaleState())
    assert all(not d.facts for d in only(decisions, StartHosts)) and state.forecast_ratio == 1.0


@pytest.mark.parametrize("seed", range(6))
def test_invariants_on_random_snapshots(seed: int) -> None:
    rng = random.Random(seed)
    state = AutoscaleState()
    now = MONDAY
    for _ in range(150):
        now += timedelta(minutes=rng.choice([1, 5, 30]))
        hosts = []
        for i in range(rng.randint(0, 12)):
            st = rng.choice(["up", "up", "up", "draining", "starting"])
            hosts.append((f"h{i:02d}", st, 0 if st == "starting" else rng.randint(0, 4)))
        total = len(hosts) + rng.randint(0, 4)
        fc = rng.choice([None, flat(rng.uniform(0, 40)), RAMP])
        s = snap(hosts, fc, total=total, queued=rng.choice([0, 0, 3]))
        decisions, state = decide(s, now, plan(min_pct=rng.choice([0, 20])), state)
        by_id = {h.host_id: h for h in s.hosts}
        drained_now: set[str] = set()
        for d in decisions:
            if isinstance(d, Drain):
                assert by_id[d.host_id].sessions == 0 and by_id[d.host_id].state == "up"
                drained_now.add(d.host_id)
            elif isinstance(d, StopHost):
                h = by_id[d.host_id]
                assert h.sessions == 0 and (h.state == "draining" or h.host_id in drained_now)
            elif isinstance(d, StartHosts):
                assert d.count > 0 and len([h for h in s.hosts if h.state != "down"]) + d.count <= total
        assert 0.25 <= state.forecast_ratio <= 4.0
        assert AutoscaleState.from_dict(state.to_dict()) == state
