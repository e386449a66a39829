"""The pool-sizing simulator: hand-computable scenarios, determinism, the placement index
against `broker.placement.place`, and the plan comparison / recommendation on small pools."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from broker.autoscale.plans import DEFAULT_PLAN, ScalingPlan
from broker.autoscale.simulate import (
    Arrival,
    Fleet,
    PlanParams,
    SimConfig,
    apply_params,
    compare,
    demand_from_history,
    format_table,
    main,
    percentile,
    recommend,
    simulate,
    synthetic_demand,
    weekly_shape,
)
from broker.models import PoolConfig
from broker.placement import place

POOL = PoolConfig("sim", max_queue=10_000, queue_timeout_s=900)


def config(hosts: int, seats: int = 4, days: float = 1.0, **kw: object) -> SimConfig:
    return SimConfig(POOL, hosts=hosts, seats_per_host=seats, days=days, **kw)  # type: ignore[arg-type]


# --- hand-computable -----------------------------------------------------------------------


def test_one_seat_two_arrivals_second_waits_for_the_first() -> None:
    demand = [Arrival(0.0, 600.0), Arrival(0.0, 600.0)]
    r = simulate(demand, config(1, seats=1, days=1 / 24), None)
    assert (r.served, r.abandoned, r.rejected) == (2, 0, 0)
    assert (r.wait_p50_s, r.wait_p99_s) == (0.0, 600.0)
    assert r.waited_over_60s_pct == 50.0
    assert r.peak_concurrency == 1
    assert r.host_hours == 1.0  # one host for the one simulated hour


def test_queue_timeout_abandons_and_a_full_queue_rejects() -> None:
    demand = [Arrival(0.0, 600.0), Arrival(0.0, 600.0), Arrival(1.0, 600.0)]
    short = replace(POOL, queue_timeout_s=300, max_queue=1)
    r = simulate(demand, SimConfig(short, hosts=1, seats_per_host=1, days=1 / 24), None)
    assert (r.served, r.abandoned, r.rejected) == (1, 1, 1)
    assert r.wait_p99_s == 300.0  # the abandoned request waited the full timeout
    assert r.waited_over_60s_pct == pytest.approx(200 / 3)  # abandoned and rejected both count


def test_host_hours_and_cost() -> None:
    r = simulate([], config(3, days=2, price_per_host_hour=0.5), None)
    assert (r.host_hours, r.cost) == (144.0, 72.0)


def test_autoscaler_boots_hosts_with_delay_and_bills_the_boot() -> None:
    plan = ScalingPlan.from_body({"schedules": [{
        "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        **{p: {"start": s, "capacity_threshold_pct": 100, "min_hosts_pct": 0}
           for p, s in (("ramp_up", "06:00"), ("peak", "09:00"), ("ramp_down", "17:00"), ("off_peak", "20:00"))},
    }]})
    # no host is on at 00:00; one request at 00:01 is seen by the 00:05 evaluation; boot takes 300 s
    demand = [Arrival(60.0, 1200.0)]
    r = simulate(demand, config(2, seats=1, days=1 / 24, tick_s=300, boot_delay_s=300), plan)
    assert r.served == 1 and r.wait_p50_s == 540.0  # 00:01 -> 00:10
    # off-peak allows scale-in: the 00:30 evaluation drains the empty host, the 00:35 one stops it;
    # it is billed from the start request (00:05) to the stop (00:35)
    assert r.host_hours == 0.5
    assert r.actions == 3  # StartHosts, Drain, StopHost


# --- determinism and baselines ----------------------------------------------------------------


def test_synthetic_demand_is_seeded_and_follows_the_curve() -> None:
    a = synthetic_demand(200, 2, seed=3)
    assert a == synthetic_demand(200, 2, seed=3)
    assert a != synthetic_demand(200, 2, seed=4)
    assert all(x.at_s < y.at_s for x, y in itertools.pairwise(a))
    assert all(60 <= x.duration_s <= 8 * 3600 for x in a)
    night = sum(1 for x in a if 2 * 3600 <= x.at_s < 4 * 3600)
    noon = sum(1 for x in a if 11 * 3600 <= x.at_s < 13 * 3600)
    assert noon > 8 * night
    assert weekly_shape(10 * 3600) > 0.9 and weekly_shape(5 * 86_400 + 10 * 3600) < 0.3  # Saturday


def test_simulation_is_deterministic() -> None:
    demand = synthetic_demand(120, 1, seed=9)
    cfg = config(40)
    assert simulate(demand, cfg, DEFAULT_PLAN) == simulate(demand, cfg, DEFAULT_PLAN)


def test_always_on_peak_capacity_has_no_waits() -> None:
    demand = synthetic_demand(150, 2, seed=1)
    r = simulate(demand, config(50, days=2), None)
    assert r.peak_concurrency < 200 and r.served == r.arrivals
    assert (r.waited_over_60s_pct, r.wait_p99_s, r.actions) == (0.0, 0.0, 0)


def test_plans_save_host_hours_against_always_on() -> None:
    demand = synthetic_demand(150, 2, seed=1)
    always, default = compare(demand, config(50, days=2), [("always-on", None), ("default", DEFAULT_PLAN)])
    assert default.host_hours < 0.7 * always.host_hours
    assert default.waited_over_60s_pct < 5.0
    table = format_table([always, default])
    assert "always-on" in table and "default" in table


# --- the placement index equals place() ----------------------------------------------------------


@pytest.mark.parametrize(("gpus", "seats_per_gpu"), [(1, 4), (2, 2), (3, 1)])
def test_fleet_index_agrees_with_place_on_random_operations(gpus: int, seats_per_gpu: int) -> None:
    rng = random.Random(gpus * 100 + seats_per_gpu)
    fleet = Fleet(12, gpus, seats_per_gpu)
    for i in range(12):
        fleet.set_state(i, "up" if i % 3 else "down")
    seated: list[tuple[int, int, int]] = []
    for sid in range(1500):
        op = rng.random()
        strategy = rng.choice(["breadth-first", "depth-first"])
        expected = place(fleet.loads(), strategy)
        got = fleet.pick(strategy)
        assert (None if got is None else (fleet.ids[got[0]], got[1])) == (
            None if expected is None else (expected.host_id, expected.gpu_index))
        if op < 0.55 and got is not None:
            fleet.seat(got[0], got[1], sid)
            seated.append((got[0], got[1], sid))
        elif op < 0.85 and seated:
            i, g, s = seated.pop(rng.randrange(len(seated)))
            fleet.unseat(i, g, s)
        else:
            i = rng.randrange(12)
            new = rng.choice(["up", "draining", "starting"] + (["down"] if fleet.used[i] == 0 else []))
            fleet.set_state(i, new)


def test_a_whole_run_places_exactly_like_place() -> None:
    force = replace(DEFAULT_PLAN, schedules=tuple(replace(s, scale_in_mode="force_logoff", logoff_wait_min=5)
                                                  for s in DEFAULT_PLAN.schedules))
    demand = synthetic_demand(60, 1, seed=2)
    r = simulate(demand, config(20), force, check_placement=True)  # asserts on every placement
    assert r.served > 0


def test_force_logoff_plan_ends_sessions_and_saves_hours() -> None:
    demand = synthetic_demand(120, 2, seed=4, mean_duration_s=4 * 3600)
    base = apply_params(DEFAULT_PLAN, PlanParams(80, 90, 5, 0))
    force = replace(base, schedules=tuple(replace(s, scale_in_mode="force_logoff", logoff_wait_min=10)
                                          for s in base.schedules))
    gentle, forced = compare(demand, config(40, days=2), [("zero", base), ("force", force)])
    assert gentle.force_ended == 0 < forced.force_ended
    assert forced.host_hours < gentle.host_hours


# --- recommend and the CLI ------------------------------------------------------------------------


def test_recommend_finds_a_cheaper_plan_meeting_the_target() -> None:
    demand = synthetic_demand(100, 2, seed=6)
    cfg = config(30, days=2)
    rec = recommend(demand, cfg, target_over_60s_pct=1.0, refine_rounds=1)
    assert rec.meets_target and not rec.result.aborted
    assert rec.result.waited_over_60s_pct <= 1.0
    always = simulate(demand, cfg, None)
    assert rec.result.host_hours < always.host_hours
    assert all(rec.result.host_hours <= r.host_hours for p, r in rec.evaluated
               if not r.aborted and r.waited_over_60s_pct <= 1.0)
    assert simulate(demand, cfg, rec.plan) == replace(rec.result, label="")  # the plan reproduces its result
    assert ScalingPlan.from_body(rec.plan.to_dict()) == rec.plan


def test_recommend_reports_an_impossible_target() -> None:
    demand = [Arrival(0.0, 600.0)] * 3  # one seat, three simultaneous requests: 2/3 must wait
    rec = recommend(demand, config(1, seats=1, days=1 / 24), target_over_60s_pct=1.0)
    assert not rec.meets_target


def test_demand_from_history() -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [(start + timedelta(seconds=30), 100.0), (start - timedelta(seconds=5), 50.0), (start, 10.0)]
    assert demand_from_history(rows, start) == (Arrival(0.0, 10.0), Arrival(30.0, 100.0))


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([], 50) == 0.0 and percentile([7.0], 99) == 7.0


def test_main_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "20", "--peak-concurrency", "50", "--days", "1", "--seed", "3", "--json",
                 "--no-recommend"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in out["results"]] == ["always-on", "default plan"]
    assert out["results"][0]["host_hours"] == 480.0


def test_main_prints_a_table_with_a_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "20", "--peak-concurrency", "50", "--days", "1", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "always-on" in out and "default plan" in out and "recommended" in out
