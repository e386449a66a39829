"""Benchmark: one simulated week of a 1,000-host pool under a diurnal demand curve, against perfect foresight.

Runs, on the same seeded demand: (a) always-on peak capacity (every host up all week),
(a') always-on right-sized to the observed peak concurrency, (b) the default scaling plan,
(c) the plan `broker.autoscale.simulate.recommend` finds (reactive), (d) the default plan's
schedules in predictive mode, sizing the pool from a forecast fitted on four weeks of history
before the benchmark week; prints host-hours, cost, queue-wait percentiles, the share of requests
waiting over 60 s, sessions force-ended, each plan's host-hours as a multiple of the zero-wait
depth-first packing oracle's and of the strict lower bound's (`broker.autoscale.oracle`), and how
long each simulation took (wall clock, measured here: the simulator itself never reads a clock).

Then: the forecast's error on the benchmark week (seasonal-naive baseline, the time-of-week
profile with trend, and the profile with the recent-error correction the autoscaler applies), and
the surprise weeks (`broker.autoscale.scenarios`): the reactive recommended plan (c) and the
predictive plan (d), unchanged, on weeks the history did not foresee.

Targets checked at the end: (c) uses >= 40 % fewer host-hours than (a) with <= 1 % of requests
waiting over 60 s; (d) uses <= 1.08x the oracle's host-hours with <= 1 % waiting over 60 s and no
session force-ended; on every surprise week (d) has no larger share waiting over 60 s than (c); a
week of one plan simulates in under 30 s.

    .venv/bin/python bench/bench_autoscale.py [--hosts 1000 --peak-concurrency 3500 --seed 7]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.autoscale.forecast import BIN_S, concurrency_series, corrected_errors, fit, plain_errors
from broker.autoscale.oracle import lower_bound, packing_oracle
from broker.autoscale.plans import DEFAULT_PLAN, PlanMode, PredictiveSettings, ScalingPlan
from broker.autoscale.scenarios import SCENARIOS, SURPRISES, VARIANTS, build
from broker.autoscale.simulate import (
    DAY_S,
    SimConfig,
    SimResult,
    format_table,
    recommend,
    simulate,
    synthetic_demand,
)
from broker.models import PoolConfig

HOST_HOURS_SAVING_TARGET_PCT = 40.0
WAIT_TARGET_PCT = 1.0  # at most this share of requests may wait over 60 s
ORACLE_TARGET = 1.08  # predictive host-hours / oracle host-hours
WEEK_SIM_BUDGET_S = 30.0


def predictive_plan(base: ScalingPlan, settings: PredictiveSettings) -> ScalingPlan:
    """``base``'s schedules (minimums, scale-in mode) in predictive mode."""
    return replace(base, name=f"{base.name}-predictive", mode=PlanMode.PREDICTIVE.value, predictive=settings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--seats-per-host", type=int, default=4)
    parser.add_argument("--peak-concurrency", type=int, default=3500)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--price", type=float, default=1.20, help="price per host-hour")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--mean-duration-min", type=float, default=60.0)
    parser.add_argument("--boot-delay-s", type=int, default=300)
    parser.add_argument("--tick-s", type=int, default=300, help="autoscaler evaluation period")
    parser.add_argument("--history-weeks", type=int, default=4, help="history the forecast is fitted on")
    parser.add_argument("--margin-pct", type=float, default=PredictiveSettings.margin_pct)
    parser.add_argument("--margin-seats", type=int, default=PredictiveSettings.margin_seats)
    parser.add_argument("--scenarios", default=",".join(SURPRISES + VARIANTS),
                        help=f"surprise weeks to replay (of {', '.join(SCENARIOS)}; empty: none)")
    args = parser.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}")

    pool = PoolConfig("bench", max_sessions_per_gpu=args.seats_per_host, max_queue=1_000_000, queue_timeout_s=600)
    config = SimConfig(pool, hosts=args.hosts, seats_per_host=args.seats_per_host, days=args.days,
                       tick_s=args.tick_s, boot_delay_s=args.boot_delay_s, price_per_host_hour=args.price)
    mean_s = args.mean_duration_min * 60
    horizon = args.days * DAY_S
    t0 = time.perf_counter()
    demand = synthetic_demand(args.peak_concurrency, args.days, seed=args.seed, mean_duration_s=mean_s,
                              start_weekday=config.start.weekday())
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    normal = build(SCENARIOS["normal"], config, args.peak_concurrency, seed=args.seed,
                   history_weeks=args.history_weeks, mean_duration_s=mean_s)
    assert normal.week == demand  # the scenario's normal week is the benchmark week itself
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    oracle = packing_oracle(demand, args.seats_per_host, args.boot_delay_s, horizon)
    bound = lower_bound(demand, args.seats_per_host, args.boot_delay_s, horizon)
    yard_s = time.perf_counter() - t0
    packed_h = sum(min(a.at_s + a.duration_s, horizon) - a.at_s for a in demand) / args.seats_per_host / 3600
    print(f"demand: {len(demand):,} session requests over {args.days:g} days (generated in {gen_s:.1f} s); "
          f"{args.hosts} hosts x {args.seats_per_host} seats; boot {args.boot_delay_s} s; checks every "
          f"{args.tick_s} s; price {args.price:g}/host-hour")
    print(f"yardsticks ({yard_s:.1f} s): packing oracle {oracle.host_hours:,.0f} host-hours ({oracle.starts:,} "
          f"starts, peak {oracle.peak_hosts_on} hosts); lower bound {bound:,.0f}; seat-seconds / seats "
          f"{packed_h:,.0f}")
    print(f"forecast: fitted on {args.history_weeks} week(s) of history (seed {args.seed + 1}) in {fit_s:.1f} s")

    rows: list[SimResult] = []
    timings: list[tuple[str, float]] = []

    def timed(label: str, cfg: SimConfig, plan: ScalingPlan | None, week: object = None,
              forecast: object = None, keep: bool = True) -> SimResult:
        t = time.perf_counter()
        r = simulate(week if week is not None else demand, cfg, plan, label=label,  # type: ignore[arg-type]
                     forecast=forecast)  # type: ignore[arg-type]
        timings.append((label, time.perf_counter() - t))
        if keep:
            rows.append(r)
        return r

    always = timed("(a) always-on peak capacity", config, None)
    sized = math.ceil(always.peak_concurrency / args.seats_per_host)
    timed(f"(a') always-on, {sized} hosts", replace(config, hosts=sized), None)
    timed("(b) default plan", config, DEFAULT_PLAN)
    t = time.perf_counter()
    rec = recommend(demand, config, target_over_60s_pct=WAIT_TARGET_PCT)
    search_s = time.perf_counter() - t
    reactive = timed(f"(c) recommended: {rec.params.label()}", config, rec.plan)
    settings = PredictiveSettings(margin_pct=args.margin_pct, margin_seats=args.margin_seats,
                                  boot_s=args.boot_delay_s, history_weeks=args.history_weeks)
    pplan = predictive_plan(DEFAULT_PLAN, settings)
    pred = timed(f"(d) predictive: margin {args.margin_pct:g}% + {args.margin_seats}", config, pplan,
                 forecast=normal.forecast)

    print()
    print(format_table(rows, baseline_host_hours=always.host_hours, oracle_host_hours=oracle.host_hours,
                       bound_host_hours=bound))
    print()
    for label, secs in timings:
        print(f"  simulated {args.days:g} days in {secs:5.1f} s  {label}")
    print(f"  recommend(): {len(rec.evaluated)} candidates in {search_s:.1f} s "
          f"({sum(1 for _, r in rec.evaluated if r.aborted)} aborted early)")
    for params, r in rec.evaluated:
        verdict = "aborted" if r.aborted else f"{r.waited_over_60s_pct:.2f}% >60s"
        print(f"    {params.label():<32} {r.host_hours:>10,.0f} host-h  {verdict}")

    # --- the forecast's error on the benchmark week -------------------------------------------------
    if normal.forecast is not None:
        start = config.start.timestamp()
        actual = concurrency_series(demand, horizon, BIN_S)
        naive = fit(normal.history, normal.history_start_s, weeks=1, trend=False)
        lookahead = args.boot_delay_s + args.tick_s
        errors = [plain_errors(naive, actual, start, "seasonal-naive (same bin last week)"),
                  plain_errors(normal.forecast, actual, start, f"profile ({args.history_weeks} week(s), trend "
                                                                f"x{normal.forecast.trend_per_week:.3f}/week)"),
                  corrected_errors(normal.forecast, actual, start, lookahead,
                                   f"profile + recent-error correction, {lookahead} s ahead")]
        print()
        print(f"forecast error on the benchmark week (mean concurrency per {BIN_S} s bin, "
              f"mean {sum(actual) / len(actual):,.0f} sessions):")
        print(f"  {'forecaster':<56} {'MAE':>7} {'MAPE':>7} {'bias':>7} {'max under':>10}")
        for e in errors:
            print(f"  {e.label:<56} {e.mae:7.1f} {e.mape_pct:6.2f}% {e.bias:+7.1f} {e.max_under:10.1f}")

    # --- surprise weeks ------------------------------------------------------------------------------
    surprise_rows: list[tuple[str, SimResult, SimResult, float]] = []
    for name in names:
        built = build(SCENARIOS[name], config, args.peak_concurrency, seed=args.seed,
                      history_weeks=args.history_weeks, mean_duration_s=mean_s)
        o = packing_oracle(built.week, args.seats_per_host, args.boot_delay_s, horizon).host_hours
        r_res = timed(f"{name}: reactive (c)", config, rec.plan, week=built.week, keep=False)
        p_res = timed(f"{name}: predictive (d)", config, pplan, week=built.week, forecast=built.forecast,
                      keep=False)
        surprise_rows.append((name, r_res, p_res, o))
    if surprise_rows:
        print()
        print("surprise weeks (plans (c) and (d) unchanged; the forecast fitted on ordinary history):")
        print(f"  {'week':<11} {'plan':<11} {'host-h':>8} {'x oracle':>8} {'>60s %':>7} {'p95 s':>6} {'p99 s':>6} "
              f"{'forced':>6}  description")
        for name, r_res, p_res, o in surprise_rows:
            for kind, r in (("reactive", r_res), ("predictive", p_res)):
                print(f"  {name:<11} {kind:<11} {r.host_hours:8,.0f} {r.host_hours / o:8.3f} "
                      f"{r.waited_over_60s_pct:7.2f} {r.wait_p95_s:6.0f} {r.wait_p99_s:6.0f} {r.force_ended:6d}  "
                      f"{SCENARIOS[name].description if kind == 'reactive' else ''}")

    saving = 100.0 * (1 - reactive.host_hours / always.host_hours)
    ratio = pred.host_hours / oracle.host_hours
    slowest = max(s for _, s in timings)
    checks = [
        (f"recommended saves >= {HOST_HOURS_SAVING_TARGET_PCT:g}% host-hours vs always-on ({saving:.1f}%)",
         saving >= HOST_HOURS_SAVING_TARGET_PCT),
        (f"recommended: <= {WAIT_TARGET_PCT:g}% wait over 60 s ({reactive.waited_over_60s_pct:.2f}%)",
         reactive.waited_over_60s_pct <= WAIT_TARGET_PCT),
        (f"predictive: <= {ORACLE_TARGET:g}x the oracle's host-hours ({ratio:.3f}x)", ratio <= ORACLE_TARGET),
        (f"predictive: <= {WAIT_TARGET_PCT:g}% wait over 60 s ({pred.waited_over_60s_pct:.2f}%), "
         f"none force-ended ({pred.force_ended})",
         pred.waited_over_60s_pct <= WAIT_TARGET_PCT and pred.force_ended == 0),
        *((f"{name}: predictive waits no worse than reactive ({p.waited_over_60s_pct:.2f}% vs "
           f"{r.waited_over_60s_pct:.2f}% over 60 s)", p.waited_over_60s_pct <= r.waited_over_60s_pct)
          for name, r, p, _ in surprise_rows),
        (f"one plan's week simulates in < {WEEK_SIM_BUDGET_S:g} s (slowest {slowest:.1f} s)",
         slowest < WEEK_SIM_BUDGET_S),
    ]
    print()
    for text, ok in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
