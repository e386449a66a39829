"""Benchmark: one simulated week of a 1,000-host pool under a diurnal demand curve.

Runs, on the same seeded demand: (a) always-on peak capacity (every host up all week),
(a') always-on right-sized to the observed peak concurrency, (b) the default scaling plan,
(c) the plan `broker.autoscale.simulate.recommend` finds; prints host-hours, cost, queue-wait
percentiles, the share of requests waiting over 60 s, sessions force-ended, and how long
each simulation took (wall clock, measured here: the simulator itself never reads a clock).

Targets checked at the end: (c) uses >= 40 % fewer host-hours than (a) with <= 1 % of requests
waiting over 60 s, and a week of one plan simulates in under 30 s.

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

from broker.autoscale.plans import DEFAULT_PLAN
from broker.autoscale.simulate import SimConfig, SimResult, format_table, recommend, simulate, synthetic_demand
from broker.models import PoolConfig

HOST_HOURS_SAVING_TARGET_PCT = 40.0
WAIT_TARGET_PCT = 1.0  # at most this share of requests may wait over 60 s
WEEK_SIM_BUDGET_S = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--seats-per-host", type=int, default=4)
    parser.add_argument("--peak-concurrency", type=int, default=3500)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--price", type=float, default=1.20, help="price per host-hour")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    pool = PoolConfig("bench", max_sessions_per_gpu=args.seats_per_host, max_queue=1_000_000, queue_timeout_s=600)
    config = SimConfig(pool, hosts=args.hosts, seats_per_host=args.seats_per_host, days=args.days,
                       price_per_host_hour=args.price)
    t0 = time.perf_counter()
    demand = synthetic_demand(args.peak_concurrency, args.days, seed=args.seed, start_weekday=config.start.weekday())
    gen_s = time.perf_counter() - t0
    packed_h = sum(a.duration_s for a in demand) / args.seats_per_host / 3600
    print(f"demand: {len(demand):,} session requests over {args.days:g} days (generated in {gen_s:.1f} s); "
          f"{args.hosts} hosts x {args.seats_per_host} seats; price {args.price:g}/host-hour; "
          f"perfect-packing lower bound {packed_h:,.0f} host-hours")

    rows: list[SimResult] = []
    timings: list[tuple[str, float]] = []

    def timed(label: str, cfg: SimConfig, plan: object) -> SimResult:
        t = time.perf_counter()
        r = simulate(demand, cfg, plan, label=label)  # type: ignore[arg-type]
        timings.append((label, time.perf_counter() - t))
        rows.append(r)
        return r

    always = timed("(a) always-on peak capacity", config, None)
    sized = math.ceil(always.peak_concurrency / args.seats_per_host)
    timed(f"(a') always-on, {sized} hosts", replace(config, hosts=sized), None)
    timed("(b) default plan", config, DEFAULT_PLAN)
    t = time.perf_counter()
    rec = recommend(demand, config, target_over_60s_pct=WAIT_TARGET_PCT)
    search_s = time.perf_counter() - t
    best = timed(f"(c) recommended: {rec.params.label()}", config, rec.plan)

    print()
    print(format_table(rows, baseline_host_hours=always.host_hours))
    print()
    for label, secs in timings:
        print(f"  simulated {args.days:g} days in {secs:5.1f} s  {label}")
    print(f"  recommend(): {len(rec.evaluated)} candidates in {search_s:.1f} s "
          f"({sum(1 for _, r in rec.evaluated if r.aborted)} aborted early)")
    for params, r in rec.evaluated:
        verdict = "aborted" if r.aborted else f"{r.waited_over_60s_pct:.2f}% >60s"
        print(f"    {params.label():<32} {r.host_hours:>10,.0f} host-h  {verdict}")

    saving = 100.0 * (1 - best.host_hours / always.host_hours)
    slowest = max(s for _, s in timings)
    checks = [
        (f"recommended saves >= {HOST_HOURS_SAVING_TARGET_PCT:g}% host-hours vs always-on ({saving:.1f}%)",
         saving >= HOST_HOURS_SAVING_TARGET_PCT),
        (f"recommended: <= {WAIT_TARGET_PCT:g}% wait over 60 s ({best.waited_over_60s_pct:.2f}%)",
         best.waited_over_60s_pct <= WAIT_TARGET_PCT),
        (f"one plan's week simulates in < {WEEK_SIM_BUDGET_S:g} s (slowest {slowest:.1f} s)",
         slowest < WEEK_SIM_BUDGET_S),
    ]
    print()
    for text, ok in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
