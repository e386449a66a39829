"""Table tests for the pure autoscaling policy on a fake clock (plain datetimes, no sleeps).

The plan used here runs every day: ramp-up 06:00, peak 09:00, ramp-down 17:00, off-peak 20:00
(UTC), so PEAK = 10:00 and RAMP_DOWN = 18:00 on Monday 2024-01-01.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.autoscale.plans import ScalingPlan
from broker.autoscale.policy import (
    AutoscaleState,
    Decision,
    Drain,
    EndSessions,
    HostSnapshot,
    PoolSnapshot,
    Reason,
    SetStrategy,
    StartHosts,
    StopHost,
    Undrain,
    WarnSessions,
    decide,
    min_hosts,
    seats_for,
    used_pct,
)
from broker.models import PoolConfig
from broker.placement import GpuLoad, HostLoad

PEAK = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
RAMP_DOWN = datetime(2024, 1, 1, 18, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def make_plan(threshold: float = 30, min_pct: float = 10, *, force: bool = False, wait_min: int = 15,
              margin: float = 10, cooldown_min: int = 15, hold_min: int = 30) -> ScalingPlan:
    def phase(start: str, strategy: str) -> dict[str, Any]:
        return {"start": start, "strategy": strategy, "capacity_threshold_pct": threshold, "min_hosts_pct": min_pct}

    return ScalingPlan.from_body({
        "time_zone": "UTC",
        "scale_in_margin_pct": margin, "scale_in_cooldown_min": cooldown_min, "undrain_hold_min": hold_min,
        "schedules": [{
            "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
            "ramp_up": phase("06:00", "breadth-first"), "peak": phase("09:00", "breadth-first"),
            "ramp_down": phase("17:00", "depth-first"), "off_peak": phase("20:00", "depth-first"),
            "scale_in_mode": "force_logoff" if force else "zero_sessions", "logoff_wait_min": wait_min,
        }],
    })


def pool(strategy: str = "breadth-first") -> PoolConfig:
    return PoolConfig("p", strategy=strategy, max_sessions_per_gpu=5)


def snap(*hosts: tuple[str, str, int], total: int = 6, seats: int = 5, pending: int = 0, queued: int = 0,
         strategy: str = "breadth-first") -> PoolSnapshot:
    """Hosts as (id, state, sessions); ``total`` is max_hosts (down hosts need not be listed)."""
    return PoolSnapshot(pool(strategy), tuple(HostSnapshot(h, st, n, seats) for h, st, n in hosts), max_hosts=total,
                        pending_starts=pending, queued=queued, new_host_seats=seats)


def scaling(decisions: tuple[Decision, ...]) -> list[Decision]:
    """Decisions other than SetStrategy (tests set the pool's strategy to the phase's anyway)."""
    return [d for d in decisions if not isinstance(d, SetStrategy)]


def kinds(decisions: tuple[Decision, ...]) -> list[tuple[str, str]]:
    return [(type(d).__name__, getattr(d, "host_id", str(getattr(d, "count", "")))) for d in scaling(decisions)]


# --- arithmetic --------------------------------------------------------------------------------


@pytest.mark.parametrize(("pct", "total", "expected"),
                         [(10, 6, 1), (20, 6, 2), (0, 6, 0), (50, 6, 3), (100, 6, 6), (1, 1000, 10),
                          (0.1, 1000, 1), (33.4, 3, 2)])
def test_min_hosts_rounds_up(pct: float, total: int, expected: int) -> None:
    assert min_hosts(pct, total) == expected


def test_used_capacity_arithmetic() -> None:
    assert used_pct(3, 10) == 30.0
    assert used_pct(0, 0) == 0.0
    assert used_pct(1, 0) == float("inf")
    assert seats_for(3, 30) == 10  # exactly at the threshold is enough
    assert seats_for(4, 30) == 14


# --- scale out ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sessions", "started"),
    [
        (0, 0),
        (3, 0),  # 3 / 10 = 30 %: at the threshold, holds
        (4, 1),  # 4 / 10 = 40 % > 30 %: a third host -> 4 / 15 = 26.7 %
        (5, 2),  # 5 / 15 = 33 % still over, so two -> 5 / 20 = 25 %
        (6, 2),  # 6 / 20 = 30 %
        (10, 4),  # would need 34 seats (7 hosts), only 4 more hosts exist
    ],
)
def test_avd_worked_example_scale_out(sessions: int, started: int) -> None:
    """AVD: 6 hosts, 5 sessions per host, capacity threshold 30 %, 2 hosts on."""
    a, b = (sessions + 1) // 2, sessions // 2
    decisions, state = decide(snap(("h1", "up", a), ("h2", "up", b)), PEAK, make_plan(), AutoscaleState())
    if started:
        assert scaling(decisions) == [StartHosts(started, Reason.ABOVE_THRESHOLD, scaling(decisions)[0].detail)]
        assert state.last_scale_out_s == PEAK.timestamp()
    else:
        assert scaling(decisions) == []
        assert state.last_scale_out_s is None


@pytest.mark.parametrize(("min_pct", "started"), [(10, 1), (20, 2), (0, 0), (50, 3)])
def test_minimum_hosts_round_up(min_pct: float, started: int) -> None:
    decisions, _ = decide(snap(), PEAK, make_plan(min_pct=min_pct), AutoscaleState())
    expected = [("StartHosts", str(started))] if started else []
    assert kinds(decisions) == expected
    if started:
        assert scaling(decisions)[0].reason == Reason.BELOW_MIN_HOSTS


def test_starting_and_pending_hosts_count_as_coming_capacity() -> None:
    plan = make_plan()
    booting = snap(("h1", "up", 2), ("h2", "up", 2), ("h3", "starting", 0))
    assert scaling(decide(booting, PEAK, plan, AutoscaleState())[0]) == []  # 4 / 15 once h3 is up
    pending = snap(("h1", "up", 2), ("h2", "up", 2), pending=1)
    assert scaling(decide(pending, PEAK, plan, AutoscaleState())[0]) == []
    more = snap(("h1", "up", 3), ("h2", "up", 3), ("h3", "starting", 0))  # 6 needs 20 seats: 15 coming
    assert kinds(decide(more, PEAK, plan, AutoscaleState())[0]) == [("StartHosts", "1")]


def test_queued_requests_count_as_demand() -> None:
    decisions, _ = decide(snap(queued=3), PEAK, make_plan(min_pct=0), AutoscaleState())
    assert kinds(decisions) == [("StartHosts", "2")]  # no seats, 3 waiting: 10 seats keep them <= 30 %
    decisions, _ = decide(snap(queued=3), PEAK, make_plan(min_pct=0, threshold=60), AutoscaleState())
    assert kinds(decisions) == [("StartHosts", "1")]  # 3 / 5 = 60 %


def test_never_more_hosts_than_the_provider_maximum() -> None:
    full = snap(("h1", "up", 5), ("h2", "up", 5), ("h3", "draining", 1), total=3)
    assert scaling(decide(full, PEAK, make_plan(), AutoscaleState())[0]) == []


def test_undrain_own_drained_hosts_before_starting_new_ones() -> None:
    state = AutoscaleState(drained={"h3": 0.0, "h4": 0.0})
    s = snap(("h1", "up", 2), ("h2", "up", 2), ("h3", "draining", 0), ("h4", "draining", 4), ("h5", "draining", 0))
    decisions, new = decide(s, PEAK, make_plan(), state)
    # 4 / 10 > 30 %: h3 (empty, ours) is undrained; h4 is nearly full (would not help); h5 is an admin's
    assert kinds(decisions) == [("Undrain", "h3")]
    assert decisions[0].reason == Reason.ABOVE_THRESHOLD
    assert "h3" not in new.drained and "h3" in new.undrained
    assert new.last_scale_out_s == PEAK.timestamp()


def test_admin_drained_hosts_are_left_alone() -> None:
    s = snap(("h1", "up", 0), ("h2", "draining", 0), ("h3", "draining", 3))
    decisions, _ = decide(s, RAMP_DOWN, make_plan(force=True, min_pct=10), AutoscaleState())
    assert [k for k in kinds(decisions) if k[1] in ("h2", "h3")] == []


# --- scale in ----------------------------------------------------------------------------------


def test_no_scale_in_during_ramp_up_or_peak() -> None:
    s = snap(*[(f"h{i}", "up", 0) for i in range(1, 7)])
    assert scaling(decide(s, PEAK, make_plan(), AutoscaleState())[0]) == []


def test_ramp_down_drains_least_loaded_first_while_under_threshold_minus_margin() -> None:
    s = snap(("h1", "up", 3), ("h2", "up", 1), ("h3", "up", 0), ("h4", "up", 2), total=4)
    decisions, state = decide(s, RAMP_DOWN, make_plan(threshold=90, min_pct=10), AutoscaleState())
    # demand 6: without h3 6/15 = 40 %, without h2 too 6/10 = 60 % <= 80 %; a third would be 120 %
    assert kinds(decisions) == [("Drain", "h3"), ("Drain", "h2")]
    assert all(d.reason == Reason.SCALE_IN for d in scaling(decisions))
    assert set(state.drained) == {"h2", "h3"}
    assert state.last_scale_in_s == RAMP_DOWN.timestamp()


@pytest.mark.parametrize(("min_pct", "drained"), [(10, 2), (50, 2), (75, 1), (100, 0)])
def test_scale_in_never_goes_below_the_minimum(min_pct: float, drained: int) -> None:
    s = snap(("h1", "up", 3), ("h2", "up", 1), ("h3", "up", 0), ("h4", "up", 2), total=4)
    decisions, _ = decide(s, RAMP_DOWN, make_plan(threshold=90, min_pct=min_pct), AutoscaleState())
    assert len(scaling(decisions)) == drained


def test_margin_is_hysteresis_against_the_scale_out_line() -> None:
    s = snap(("h1", "up", 2), ("h2", "up", 1), ("h3", "up", 0))
    # without h3: 3 / 10 = 30 %: at the scale-out line (30 %), above the scale-in line (20 %)
    assert scaling(decide(s, RAMP_DOWN, make_plan(threshold=30), AutoscaleState())[0]) == []
    assert kinds(decide(s, RAMP_DOWN, make_plan(threshold=30, margin=0), AutoscaleState())[0]) == [("Drain", "h3")]


def test_stop_only_empty_hosts_we_drained_and_not_in_the_same_evaluation() -> None:
    plan = make_plan(threshold=90, min_pct=10)
    state = AutoscaleState(drained={"h2": 0.0, "h3": 0.0})
    s = snap(("h1", "up", 1), ("h2", "draining", 0), ("h3", "draining", 2), ("h4", "up", 0))
    decisions, state = decide(s, RAMP_DOWN, plan, state)
    # h2: drained + empty -> stop; h3: has sessions, zero-sessions mode -> wait; h4: drained now, stopped later
    assert kinds(decisions) == [("Drain", "h4"), ("StopHost", "h2")]
    assert decisions[-1].reason == Reason.DRAINED_EMPTY
    later = snap(("h1", "up", 1), ("h3", "draining", 0), ("h4", "draining", 0))
    decisions, state = decide(later, RAMP_DOWN + 5 * MIN, plan, state)
    assert kinds(decisions) == [("StopHost", "h3"), ("StopHost", "h4")]
    gone = snap(("h1", "up", 1))
    decisions, state = decide(gone, RAMP_DOWN + 10 * MIN, plan, state)
    assert scaling(decisions) == [] and dict(state.drained) == {}


def test_force_logoff_warns_then_waits_then_ends_then_stops() -> None:
    plan = make_plan(threshold=90, min_pct=10, force=True, wait_min=15)
    s = snap(("h1", "up", 3), ("h2", "up", 1), total=2)
    decisions, state = decide(s, RAMP_DOWN, plan, AutoscaleState())
    assert kinds(decisions) == [("Drain", "h2"), ("WarnSessions", "h2")]
    warn = scaling(decisions)[1]
    assert isinstance(warn, WarnSessions)
    assert (warn.ends_in_s, warn.reason) == (900, Reason.FORCE_LOGOFF_WARNING)
    assert "15 minutes" in warn.message
    drained = snap(("h1", "up", 3), ("h2", "draining", 1), total=2)
    for minutes in (5, 10, 14):
        decisions, state = decide(drained, RAMP_DOWN + minutes * MIN, plan, state)
        assert scaling(decisions) == [], minutes  # warned once; the wait is not over
    decisions, state = decide(drained, RAMP_DOWN + 15 * MIN, plan, state)
    (end,) = scaling(decisions)
    assert isinstance(end, EndSessions)
    assert (end.host_id, end.reason, end.end_reason) == ("h2", Reason.FORCE_LOGOFF, "scale_in")
    empty = snap(("h1", "up", 3), ("h2", "draining", 0), total=2)
    decisions, state = decide(empty, RAMP_DOWN + 20 * MIN, plan, state)
    assert kinds(decisions) == [("StopHost", "h2")]


def test_pending_warnings_are_dropped_outside_force_logoff_phases() -> None:
    plan = make_plan(threshold=90, min_pct=0, force=True, wait_min=15)
    state = AutoscaleState(drained={"h2": 0.0}, warned={"h2": RAMP_DOWN.timestamp()})
    s = snap(("h1", "up", 1), ("h2", "draining", 2), total=2)
    morning = datetime(2024, 1, 2, 7, 0, tzinfo=UTC)  # ramp-up: no force-logoff
    decisions, state = decide(s, morning, plan, state)
    assert scaling(decisions) == [] and dict(state.warned) == {}
    evening = datetime(2024, 1, 2, 18, 0, tzinfo=UTC)  # force-logoff again: a fresh warning first
    decisions, state = decide(s, evening, plan, state)
    assert kinds(decisions) == [("WarnSessions", "h2")]


def test_no_scale_in_within_the_cooldown_after_a_scale_out() -> None:
    plan = make_plan(threshold=90, min_pct=0, cooldown_min=15)
    state = AutoscaleState(last_scale_out_s=(RAMP_DOWN - 10 * MIN).timestamp())
    s = snap(("h1", "up", 1), ("h2", "up", 0))
    assert scaling(decide(s, RAMP_DOWN, plan, state)[0]) == []
    assert kinds(decide(s, RAMP_DOWN + 5 * MIN, plan, state)[0]) == [("Drain", "h2")]


def test_no_scale_in_while_requests_queue() -> None:
    s = snap(("h1", "up", 0), ("h2", "up", 0), queued=1)
    assert scaling(decide(s, RAMP_DOWN, make_plan(threshold=90, min_pct=0), AutoscaleState())[0]) == []


def test_a_host_just_undrained_is_not_drained_again_right_away() -> None:
    plan = make_plan(threshold=80, min_pct=0, cooldown_min=0, hold_min=30)
    state = AutoscaleState(undrained={"h2": RAMP_DOWN.timestamp()})
    s = snap(("h1", "up", 4), ("h2", "up", 0), ("h3", "up", 0))  # one empty host may go: 4 / 10 = 40 % <= 70 %
    decisions, held = decide(s, RAMP_DOWN + 10 * MIN, plan, state)
    assert kinds(decisions) == [("Drain", "h3")]  # h2 is the first candidate by id, but held
    assert "h2" in held.undrained
    decisions, released = decide(s, RAMP_DOWN + 30 * MIN, plan, state)
    assert kinds(decisions) == [("Drain", "h2")]
    assert dict(released.undrained) == {}


def test_set_strategy_follows_the_phase() -> None:
    s = snap(("h1", "up", 0), total=1)
    decisions, state = decide(s, RAMP_DOWN, make_plan(), AutoscaleState())
    assert decisions[0] == SetStrategy("depth-first", Reason.PHASE_STRATEGY, decisions[0].detail)
    assert state.phase == "ramp_down"
    s = replace(s, pool=pool("depth-first"))
    assert not any(isinstance(d, SetStrategy) for d in decide(s, RAMP_DOWN, make_plan(), AutoscaleState())[0])


def test_state_round_trips_through_a_dict() -> None:
    state = AutoscaleState(phase="peak", last_scale_out_s=1.5, drained={"a": 2.0}, warned={"a": 3.0},
                           undrained={"b": 4.0})
    assert AutoscaleState.from_dict(state.to_dict()) == state
    assert AutoscaleState.from_dict({}) == AutoscaleState()


def test_host_snapshot_from_a_placement_load() -> None:
    load = HostLoad("h1", "up", (GpuLoad(0, 4, 3), GpuLoad(1, 4, 1)))
    assert HostSnapshot.from_load(load) == HostSnapshot("h1", "up", 4, 8)


# --- dynamics: a small fake fleet driven on a fake clock -----------------------------------------


class FakeFleet:
    """Applies decisions like the service would; starting hosts come up at the next evaluation."""

    def __init__(self, total: int, up: int, seats: int = 5) -> None:
        self.total, self.seats = total, seats
        self.state = {f"h{i}": ("up" if i < up else "down") for i in range(total)}
        self.sessions = dict.fromkeys(self.state, 0)
        self.strategy = "breadth-first"
        self.actions: list[Decision] = []

    def set_load(self, n: int) -> None:
        """Spread ``n`` sessions: keep what fits on draining hosts, the rest on up hosts."""
        up = sorted(h for h, st in self.state.items() if st == "up")
        for h in self.sessions:
            if self.state[h] != "draining":
                self.sessions[h] = 0
        left = max(0, n - sum(self.sessions.values()))
        for h in up:
            take = min(self.seats, left)
            self.sessions[h] = take
            left -= take

    def snapshot(self) -> PoolSnapshot:
        hosts = tuple(HostSnapshot(h, st, self.sessions[h], self.seats) for h, st in self.state.items() if st != "down")
        return PoolSnapshot(PoolConfig("p", strategy=self.strategy), hosts, max_hosts=self.total,
                            new_host_seats=self.seats)

    def apply(self, decisions: tuple[Decision, ...]) -> None:
        for h, st in self.state.items():
            if st == "starting":
                self.state[h] = "up"
        for d in decisions:
            if isinstance(d, SetStrategy):
                self.strategy = d.strategy
                continue
            self.actions.append(d)
            if isinstance(d, StartHosts):
                for h in [h for h, st in self.state.items() if st == "down"][: d.count]:
                    self.state[h] = "starting"
            elif isinstance(d, Drain):
                self.state[d.host_id] = "draining"
            elif isinstance(d, Undrain):
                self.state[d.host_id] = "up"
            elif isinstance(d, StopHost):
                assert self.state[d.host_id] == "draining" and self.sessions[d.host_id] == 0
                self.state[d.host_id] = "down"
            elif isinstance(d, EndSessions):
                self.sessions[d.host_id] = 0


@pytest.mark.parametrize("start", [PEAK, RAMP_DOWN])
def test_load_oscillating_around_the_threshold_does_not_flap(start: datetime) -> None:
    fleet = FakeFleet(total=6, up=2)
    plan = make_plan(threshold=30, min_pct=10)
    state = AutoscaleState()
    for step in range(13):  # an hour, evaluated every 5 minutes, load 3, 4, 3, 4, ...
        fleet.set_load(3 + step % 2)
        decisions, state = decide(fleet.snapshot(), start + step * 5 * MIN, plan, state)
        fleet.apply(decisions)
    assert [type(d).__name__ for d in fleet.actions] == ["StartHosts"]


def test_without_margin_cooldown_and_hold_the_same_load_flaps() -> None:
    """The anti-flapping knobs are what keep the previous test quiet."""
    fleet = FakeFleet(total=6, up=2)
    plan = make_plan(threshold=30, min_pct=10, margin=0, cooldown_min=0, hold_min=0)
    state = AutoscaleState()
    for step in range(13):
        fleet.set_load(3 + step % 2)
        decisions, state = decide(fleet.snapshot(), RAMP_DOWN + step * 5 * MIN, plan, state)
        fleet.apply(decisions)
    assert len(fleet.actions) >= 8


def test_noisy_load_near_the_threshold_takes_few_actions() -> None:
    rng = random.Random(5)
    fleet = FakeFleet(total=20, up=6)
    plan = make_plan(threshold=60, min_pct=10, cooldown_min=15)
    state = AutoscaleState()
    for step in range(12 * 3):  # three hours of ramp-down, every 5 minutes, load 60 % +- 10 % of 30 seats
        fleet.set_load(18 + rng.randint(-3, 3))
        decisions, state = decide(fleet.snapshot(), RAMP_DOWN + step * 5 * MIN, plan, state)
        fleet.apply(decisions)
    assert len(fleet.actions) <= 8, [type(d).__name__ for d in fleet.actions]


def test_invariants_hold_on_random_walks() -> None:
    """StopHost only for empty draining hosts, EndSessions only after warning + wait, never above max."""
    rng = random.Random(11)
    for trial in range(30):
        force = trial % 2 == 0
        plan = make_plan(threshold=rng.choice([30, 60, 90]), min_pct=rng.choice([0, 10, 30]), force=force,
                         wait_min=10)
        fleet = FakeFleet(total=12, up=rng.randint(0, 12))
        state = AutoscaleState()
        warned_at: dict[str, datetime] = {}
        now = datetime(2024, 1, 1, rng.randint(0, 23), tzinfo=UTC)
        for _ in range(40):
            fleet.set_load(rng.randint(0, 60))
            snapshot = fleet.snapshot()
            decisions, state = decide(snapshot, now, plan, state)
            by_id = {h.host_id: h for h in snapshot.hosts}
            for d in decisions:
                if isinstance(d, StopHost):
                    assert by_id[d.host_id].state == "draining" and by_id[d.host_id].sessions == 0
                if isinstance(d, WarnSessions):
                    warned_at[d.host_id] = now
                if isinstance(d, EndSessions):
                    assert now - warned_at[d.host_id] >= 10 * MIN
                if isinstance(d, Undrain):
                    warned_at.pop(d.host_id, None)
            fleet.apply(decisions)
            assert sum(st != "down" for st in fleet.state.values()) <= fleet.total
            now += 5 * MIN
