"""Autoscaler service: evaluate each pool's scaling plan and apply the decisions.

Job: the thin effectful layer around the pure policy `broker.autoscale.policy.decide`.  One pass per
pool (`Scaler.evaluate_pool`):

  1. take the pool's leader lock (``LiveStore.try_lock("autoscale:{pool}")``, TTL'd, re-entrant
     for this replica) -- only one replica acts on a pool; a replica that dies loses the lock
     when its TTL (max(10 s, 2 intervals)) runs out and another takes over;
  2. load the plan (SQL) and the autoscaler record (Redis ``P:autoscale:{pool}``: the
     `AutoscaleState`, hosts the provider is starting, the last evaluation; TTL a week,
     rewritten every pass, so any replica continues where the previous leader stopped);
  3. build a `PoolSnapshot` from Redis -- the source of truth for host state and emptiness --
     plus the provider's view of hosts it runs that have not registered yet ("starting"); for a
     predictive plan add the evaluation interval and the pool's demand forecast
     (`Scaler.forecast`: fitted from the last ``predictive.history_weeks`` of SQL session history
     in an executor thread, cached per pool and refitted at most every FORECAST_REFIT_S);
  4. ``decide(snapshot, now, plan, state)`` and apply each decision through the `Broker`
     service and the `HostProvider`; log every decision with its reason; record it in SQL
     (``autoscale_decisions``) with the numbers behind it (a predictive decision's ``facts``:
     forecast, correction, trend, actual, margin, target, capacity); persist the new state.

Safety rules enforced here, on top of the policy's own invariants:
  - StopHost (also right after a Drain of the same host in one pass, predictive plans): the
    provider is asked first whether it can remove exactly this host; then
    ``Broker.remove_host(force=False)`` re-checks atomically in Redis that the host has no
    session (a session that raced in makes it refuse: logged as ``lost_race``, nothing stops)
    and retires its id, so the node cannot register again before it is gone; only then is the
    provider told to stop it.  StartHosts un-retires the ids the provider returns.
  - WarnSessions / EndSessions act only on a host that is still ``draining`` (an admin who
    undrained it in between wins); ending uses ``EndReason.SCALE_IN`` and happens only when the
    policy says the announced wait is over.
  - SetStrategy re-reads the pool and writes only when the strategy differs.
Decisions the provider cannot carry out (a static inventory cannot start or stop hosts) are
``skipped``: shown in the last evaluation, not written to SQL every pass.

Also here: `Scaler.simulate`, the pool-sizing endpoint's service: it reads the pool's history
from SQL (or makes a synthetic weekly curve when history is thin) and runs the simulator and
the plan search (`broker.autoscale.simulate`) in an executor thread, never on the event loop,
and reports each plan's host-hours against the packing oracle and the lower bound
(`broker.autoscale.oracle`); a predictive plan is simulated with a forecast fitted on the
weeks before the simulated window.

Concurrency: one Scaler per process; its loop (``broker.app``) calls `run_once` every
``autoscale_interval_s``; request handlers call `status`, `put_plan`, `delete_plan` and
`simulate` concurrently with it.  Everything shared is in Redis/SQL; the per-pool lock
serialises evaluations across replicas.

Size: about 650 lines on purpose: one pass (lock, load, snapshot, decide, apply, record) whose steps share
the pass's state and safety rules; the policy, forecast, oracle and simulator it calls are their own modules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final
from zoneinfo import ZoneInfo

from broker.auth import Principal
from broker.autoscale.forecast import DemandForecast, forecast_from_sessions
from broker.autoscale.oracle import lower_bound, packing_oracle
from broker.autoscale.plans import DEFAULT_PLAN, PLAN_SCHEMA, Phase, PlanMode, ScalingPlan, phase_at
from broker.autoscale.policy import (
    HOST_STARTING,
    AutoscaleState,
    Decision,
    Drain,
    EndSessions,
    HostSnapshot,
    PoolSnapshot,
    SetStrategy,
    StartHosts,
    StopHost,
    Undrain,
    WarnSessions,
    decide,
)
from broker.autoscale.providers import HostProvider
from broker.autoscale.simulate import (
    Arrival,
    SimConfig,
    compare,
    demand_from_history,
    recommend,
    simulate,
    synthetic_demand,
)
from broker.errors import Conflict, NotFound, ValidationError
from broker.models import PoolConfig
from broker.placement import HostLoad
from broker.protocol import HostState, Role
from broker.service import Broker
from broker.settings import BrokerSettings
from broker.store.keys import AUTOSCALE_LOCK_MIN_TTL_S, AUTOSCALE_STATE_TTL_S, Keys
from broker.validate import Field, validate

log = logging.getLogger(__name__)

ACTOR: Final = Principal(Role.ADMIN, "autoscaler")  # how the autoscaler appears in the audit log
WARNING_CODE: Final = "scale_in"  # the warning code users see before a force-logoff
DAY_MS: Final = 86_400_000
WEEK_MS: Final = 7 * DAY_MS
FORECAST_REFIT_S: Final = 3600.0  # a pool's forecast is refitted from SQL history at most hourly
SIMULATIONS_AT_ONCE: Final = 2  # simulator runs per process (CPU-bound, in executor threads)
DEFAULT_DURATION_S: Final = 3600.0  # duration assumed for a historic request that never got a seat
DISABLED_REASON: Final = "autoscale_disabled"  # Undrain when a pool's plan is deleted
BOOT_TIMEOUT_REASON: Final = "boot_timeout"  # StopHost of a started host that never registered


class Outcome(StrEnum):
    APPLIED = "applied"
    LOST_RACE = "lost_race"  # Redis state changed under us (busy host, undrained, gone): normal
    SKIPPED = "skipped"  # nothing to do or the provider cannot (static inventory)
    FAILED = "failed"  # the provider or a backing service failed; retried next pass


KINDS: Final[Mapping[type, str]] = MappingProxyType({
    StartHosts: "start_hosts", Drain: "drain", Undrain: "undrain", StopHost: "stop_host",
    WarnSessions: "warn_sessions", EndSessions: "end_sessions", SetStrategy: "set_strategy",
})


@dataclass(frozen=True)
class Applied:
    """One decision and what applying it did."""

    kind: str
    reason: str
    detail: str
    outcome: str
    host: str | None = None
    count: int | None = None
    info: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "count": self.count, "reason": self.reason,
                "detail": self.detail, "outcome": self.outcome, **dict(self.info)}

    def row(self, pool: str, phase: str, ts_ms: int) -> dict[str, Any]:
        return {"ts_ms": ts_ms, "pool": pool, "phase": phase, "kind": self.kind, "host": self.host,
                "count": self.count, "reason": self.reason,
                "detail": {"detail": self.detail, "outcome": self.outcome, **dict(self.info)}}


@dataclass(frozen=True)
class Evaluation:
    pool: str
    ts_ms: int
    phase: str
    applied: tuple[Applied, ...]
    state: AutoscaleState


@dataclass(frozen=True)
class Record:
    """What the autoscaler keeps in Redis per pool between evaluations."""

    state: AutoscaleState = field(default_factory=AutoscaleState)
    starting: Mapping[str, int] = field(default_factory=dict)  # host id -> first seen unregistered (ms)
    last: Mapping[str, Any] | None = None  # the last evaluation, for GET .../autoscale

    def to_json(self) -> str:
        return json.dumps({"state": self.state.to_dict(), "starting": dict(self.starting),
                           "last": dict(self.last) if self.last is not None else None})

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> Record:
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(AutoscaleState.from_dict(data.get("state") or {}),
                   {str(k): int(v) for k, v in (data.get("starting") or {}).items()}, data.get("last"))


# --- pure helpers -----------------------------------------------------------------------------


def build_snapshot(cfg: PoolConfig, loads: Sequence[HostLoad], session_counts: Mapping[str, int],
                   provider_hosts: Sequence[str], pending: int, starting: Mapping[str, int], queued: int,
                   max_hosts: int, now_ms: int, boot_timeout_ms: int) -> tuple[PoolSnapshot, dict[str, int], list[str]]:
    """The policy's input from Redis and provider views: (snapshot, starting map, overdue host ids).

    A registered host's session count is the larger of its used seats and its session set
    (emptiness must hold in both).  A host the provider runs that Redis does not show up or
    draining is ``starting`` since it was first seen; past ``boot_timeout_ms`` it is overdue
    (returned for the caller to stop) and left out.
    """
    registered = {h.host_id for h in loads if h.state != HostState.DOWN}
    ours = set(provider_hosts)
    new_seats = max((h.seats for h in loads), default=0) or cfg.max_sessions_per_gpu
    hosts = [HostSnapshot(h.host_id, h.state, max(h.used, session_counts.get(h.host_id, 0)), h.seats)
             for h in loads if h.state != HostState.DOWN or h.host_id not in ours]
    new_starting = {h: int(starting.get(h, now_ms)) for h in provider_hosts if h not in registered}
    overdue = sorted(h for h, t0 in new_starting.items() if now_ms - t0 >= boot_timeout_ms)
    hosts += [HostSnapshot(h, HOST_STARTING, 0, new_seats) for h in sorted(new_starting) if h not in overdue]
    for h in overdue:
        del new_starting[h]
    snapshot = PoolSnapshot(cfg, tuple(hosts), max_hosts=max_hosts, pending_starts=pending, queued=queued,
                            new_host_seats=new_seats)
    return snapshot, new_starting, overdue


def phase_view(p: Phase) -> dict[str, Any]:
    return {"name": p.name.value, "schedule": p.schedule, "day": p.day.isoformat(),
            "starts_at": p.starts_at.isoformat(), "strategy": p.strategy,
            "capacity_threshold_pct": p.capacity_threshold_pct, "min_hosts_pct": p.min_hosts_pct,
            "scale_in": p.scale_in, "force_logoff": p.force_logoff, "logoff_wait_min": p.logoff_wait_min}


def history_demand(rows: Sequence[tuple[int, int | None, int | None]], start: datetime) -> tuple[Arrival, ...]:
    """(created_ms, seated_ms, ended_ms) rows -> arrivals; a request never seated gets the median duration."""
    known = [(e - s) / 1000.0 for _c, s, e in rows if s and e and e > s]
    fallback = statistics.median(known) if known else DEFAULT_DURATION_S
    pairs = [(datetime.fromtimestamp(c / 1000.0, UTC), (e - s) / 1000.0 if s and e and e > s else fallback)
             for c, s, e in rows]
    return demand_from_history(pairs, start)


def history_forecast(rows: Sequence[tuple[int, int | None, int | None]], start: datetime, weeks: int,
                     time_zone: str) -> DemandForecast | None:
    """A forecast from (created_ms, seated_ms, ended_ms) rows of ``weeks`` weeks from ``start``.

    Only whole weeks since the first request count (a pool younger than the window is not
    averaged with empty weeks); None under one week.  CPU-bound.
    """
    demand = history_demand(rows, start)
    week_s = WEEK_MS / 1000.0
    horizon = weeks * week_s
    have = int((horizon - demand[0].at_s) // week_s) if demand else 0
    if have < 1:
        return None
    return forecast_from_sessions(demand, start.timestamp(), horizon, time_zone=time_zone, weeks=min(weeks, have))


def sizing_report(demand: Sequence[Arrival], config: SimConfig, plan: ScalingPlan, plan_label: str,
                  with_recommendation: bool, target_pct: float,
                  forecast: DemandForecast | None = None) -> dict[str, Any]:
    """Always-on vs the plan (vs the cheapest plan meeting the wait target), with each plan's host-hours
    as a multiple of the packing oracle's and the lower bound's. CPU-bound: run in an executor.

    ``forecast`` is what a predictive plan sizes the pool with; the recommendation searches the
    reactive knobs of ``plan``'s schedules.
    """
    results = compare(demand, config, [("always-on", None), (plan_label, plan)], forecast=forecast)
    out: dict[str, Any] = {"arrivals": len(demand)}
    hours = {"always_on": results[0].host_hours, "plan": results[1].host_hours}
    if with_recommendation:
        base = dataclasses.replace(plan, mode=PlanMode.REACTIVE.value) if plan.is_predictive else plan
        rec = recommend(demand, config, base, target_over_60s_pct=target_pct)
        final = rec.result if not rec.result.aborted else simulate(demand, config, rec.plan)
        final = dataclasses.replace(final, label=f"recommended ({rec.params.label()})")
        results.append(final)
        hours["recommended"] = final.host_hours
        out.update(recommended_plan=rec.plan.to_dict(), recommended_params=dataclasses.asdict(rec.params),
                   meets_target=rec.meets_target, candidates_evaluated=len(rec.evaluated))
    base_hours = hours["always_on"]
    horizon = config.days * DAY_MS / 1000.0
    oracle = packing_oracle(demand, config.seats_per_host, config.boot_delay_s, horizon)
    bound = lower_bound(demand, config.seats_per_host, config.boot_delay_s, horizon)
    out["host_hours"] = hours
    out["savings_pct"] = {k: round(100.0 * (1 - v / base_hours), 2) if base_hours else 0.0 for k, v in hours.items()
                          if k != "always_on"}
    out["yardsticks"] = {"oracle_host_hours": round(oracle.host_hours, 3), "oracle_starts": oracle.starts,
                         "lower_bound_host_hours": round(bound, 3)}
    out["vs_oracle"] = {k: round(v / oracle.host_hours, 4) if oracle.host_hours else None for k, v in hours.items()}
    out["vs_lower_bound"] = {k: round(v / bound, 4) if bound else None for k, v in hours.items()}
    if plan.is_predictive:
        out["forecast"] = None if forecast is None else {
            "weeks": forecast.weeks, "trend_per_week": round(forecast.trend_per_week, 4), "method": forecast.method}
    out["results"] = [r.to_dict() for r in results]
    return out


SIMULATE_SCHEMA: Final = {
    "days": Field("number", default=7.0, minimum=1, maximum=28, description="Simulated days (history window)"),
    "source": Field("str", default="auto", choices=("auto", "history", "synthetic"),
                    description="auto: history when it has >= min_history_sessions requests, else synthetic"),
    "min_history_sessions": Field("int", default=50, minimum=0, maximum=1_000_000),
    "peak_concurrency": Field("int", default=None, nullable=True, minimum=0, maximum=100_000,
                              description="Synthetic curve's weekday peak; default 60% of max_hosts x seats"),
    "max_hosts": Field("int", default=None, nullable=True, minimum=1, maximum=10_000,
                       description="Hosts the pool may run; default: the provider's maximum"),
    "seats_per_host": Field("int", default=None, nullable=True, minimum=1, maximum=4096),
    "gpus_per_host": Field("int", default=None, nullable=True, minimum=1, maximum=64),
    "target_wait_pct": Field("number", default=1.0, minimum=0, maximum=100,
                             description="Recommendation: at most this % of requests may wait over 60 s"),
    "recommend": Field("bool", default=True),
    "price_per_host_hour": Field("number", default=1.0, minimum=0, maximum=1_000_000),
    "boot_delay_s": Field("int", default=300, minimum=0, maximum=DAY_MS // 1000),
    "tick_s": Field("int", default=300, minimum=30, maximum=DAY_MS // 1000,
                    description="Simulated autoscaler evaluation period"),
    "seed": Field("int", default=1, minimum=0, maximum=2**31),
    "plan": Field("object", default=None, nullable=True, schema=PLAN_SCHEMA,
                  description="A plan body to try instead of the stored one (same schema as PUT .../plan)"),
}


# --- the service ----------------------------------------------------------------------------


class Scaler:
    """Runs the autoscaler for every pool that has a scaling plan (see the module docstring)."""

    def __init__(self, broker: Broker, provider: HostProvider, settings: BrokerSettings | None = None,
                 owner: str | None = None) -> None:
        self.broker = broker
        self.live = broker.live
        self.repo = broker.repo
        self.settings = settings or broker.settings
        self.provider = provider
        self.owner = owner or uuid.uuid4().hex
        self._simulations = asyncio.Semaphore(SIMULATIONS_AT_ONCE)
        self._forecasts: dict[str, tuple[int, tuple[str, int], DemandForecast | None]] = {}  # pool -> fit

    @property
    def lock_ttl_ms(self) -> int:
        return int(max(AUTOSCALE_LOCK_MIN_TTL_S, 2 * self.settings.autoscale_interval_s) * 1000)

    def _now(self) -> tuple[int, datetime]:
        ms = self.broker.clock()
        return ms, datetime.fromtimestamp(ms / 1000.0, UTC)

    # ---- state in Redis ----------------------------------------------------------------------
    async def load_record(self, pool: str) -> Record:
        return Record.from_json(await self.live.redis.get(self.live.keys.autoscale(pool)))

    async def save_record(self, pool: str, record: Record) -> None:
        await self.live.redis.set(self.live.keys.autoscale(pool), record.to_json(), ex=AUTOSCALE_STATE_TTL_S)

    # ---- the loop step ---------------------------------------------------------------------
    async def run_once(self) -> list[Evaluation]:
        """Evaluate every pool with a plan (those whose lock another replica holds are skipped)."""
        out = []
        for pool, body in (await self.repo.list_plans()).items():
            try:
                ev = await self.evaluate_pool(pool, ScalingPlan.from_body(body))
            except Exception:  # one pool's failure must not stop the others: log, retry next pass
                log.exception("autoscaler pass for pool %s failed", pool)
                continue
            if ev is not None:
                out.append(ev)
        return out

    async def snapshot(self, cfg: PoolConfig, starting: Mapping[str, int],
                       now_ms: int) -> tuple[PoolSnapshot, dict[str, int], list[str]]:
        hosts = await self.live.get_hosts(await self.live.host_ids(cfg.name))
        loads = await self.live.host_loads(cfg)
        counts = {h["id"]: len(h["sessions"]) for h in hosts}
        provider_hosts = await self.provider.list_hosts(cfg.name)
        pending = await self.provider.pending(cfg.name)
        queued = await self.live.queue_length(cfg.name)
        max_hosts = self.settings.autoscale_max_hosts if self.provider.can_start else len(loads)
        return build_snapshot(cfg, loads, counts, provider_hosts, pending, starting, queued, max_hosts, now_ms,
                              int(self.settings.autoscale_boot_timeout_s * 1000))

    async def evaluate_pool(self, pool: str, plan: ScalingPlan | None = None) -> Evaluation | None:
        """One autoscaler pass for ``pool``; None when another replica leads it or it has no plan/pool."""
        if not await self.live.try_lock(Keys.autoscale_lock_name(pool), self.owner, self.lock_ttl_ms):
            return None
        if plan is None:
            row = await self.repo.get_plan(pool)
            if row is None:
                return None
            plan = ScalingPlan.from_body(row["plan"])
        cfg = await self.live.get_pool(pool)
        if cfg is None:
            return None
        record = await self.load_record(pool)
        now_ms, now = self._now()
        snap, starting, overdue = await self.snapshot(cfg, record.starting, now_ms)
        if plan.is_predictive:
            snap = dataclasses.replace(snap, interval_s=self.settings.autoscale_interval_s,
                                       forecast=await self.forecast(cfg.name, plan, now_ms))
        decisions, state = decide(snap, now, plan, record.state)
        applied: list[Applied] = []
        for host in overdue:
            applied.append(await self._stop_unregistered(pool, host))
        for d in decisions:
            a = await self.apply_decision(cfg, d)
            facts = getattr(d, "facts", ())
            if facts:  # the numbers behind a predictive decision go to the decision log with it
                a = dataclasses.replace(a, info={**dict(facts), **a.info})
            applied.append(a)
            if isinstance(d, StartHosts):
                starting.update({h: now_ms for h in a.info.get("hosts", ())})
            elif isinstance(d, Undrain) and a.outcome == Outcome.FAILED:
                # still draining and no longer in state.drained would strand it: keep it ours
                state = dataclasses.replace(state, drained=MappingProxyType(
                    {**state.drained, d.host_id: record.state.drained.get(d.host_id, now.timestamp())}))
        for a in applied:
            level = (logging.DEBUG if a.outcome == Outcome.SKIPPED else
                     logging.WARNING if a.outcome == Outcome.FAILED else logging.INFO)
            log.log(level, "autoscale %s [%s] %s %s: %s (%s) -> %s", pool, state.phase, a.kind,
                    a.host or a.count or "", a.reason, a.detail, a.outcome)
        last = {"ts_ms": now_ms, "phase": state.phase, "owner": self.owner,
                "hosts": [dataclasses.asdict(h) for h in snap.hosts], "pending_starts": snap.pending_starts,
                "queued": snap.queued, "max_hosts": snap.max_hosts,
                "decisions": [a.to_dict() for a in applied]}
        await self.save_record(pool, Record(state, starting, last))
        await self.repo.add_decisions([a.row(pool, state.phase, now_ms) for a in applied
                                       if a.outcome != Outcome.SKIPPED])
        return Evaluation(pool, now_ms, state.phase, tuple(applied), state)

    # ---- the demand forecast (predictive plans) -------------------------------------------------
    async def forecast(self, pool: str, plan: ScalingPlan, now_ms: int) -> DemandForecast | None:
        """The pool's forecast from its SQL history, refitted every FORECAST_REFIT_S (None under a week of it).

        Fitting is CPU-bound (a pass over every session of the window): it runs in an executor.
        """
        weeks = plan.predictive.history_weeks
        key = (plan.time_zone, weeks)
        cached = self._forecasts.get(pool)
        if cached is not None and cached[1] == key and now_ms - cached[0] < FORECAST_REFIT_S * 1000:
            return cached[2]
        since_ms = now_ms - weeks * WEEK_MS
        rows = await self.repo.pool_demand(pool, since_ms, now_ms)
        start = datetime.fromtimestamp(since_ms / 1000.0, UTC)
        work = functools.partial(history_forecast, rows, start, weeks, plan.time_zone)
        fc = await asyncio.get_running_loop().run_in_executor(None, work)
        self._forecasts[pool] = (now_ms, key, fc)
        return fc

    # ---- applying one decision ----------------------------------------------------------------
    async def apply_decision(self, cfg: PoolConfig, d: Decision) -> Applied:
        """Carry out one decision; never raises for a lost race or a provider failure."""
        kind = KINDS[type(d)]
        base = Applied(kind, d.reason, d.detail, Outcome.APPLIED, host=getattr(d, "host_id", None),
                       count=getattr(d, "count", None))
        if isinstance(d, SetStrategy):
            return await self._set_strategy(cfg.name, d, base)
        if isinstance(d, Drain | Undrain):
            state = HostState.DRAINING if isinstance(d, Drain) else HostState.UP
            try:
                await self.broker.set_host_state(ACTOR, d.host_id, state)
            except (NotFound, Conflict) as exc:
                return dataclasses.replace(base, outcome=Outcome.LOST_RACE, info={"error": exc.detail})
            return base
        if isinstance(d, StartHosts):
            return await self._start(cfg.name, d, base)
        if isinstance(d, StopHost):
            hosts = await self.live.get_hosts([d.host_id])
            if hosts and hosts[0]["state"] != HostState.DRAINING:  # undrained by an admin since the snapshot
                return dataclasses.replace(base, outcome=Outcome.LOST_RACE, info={"error": "host is not draining"})
            return await self._stop(cfg.name, d.host_id, base)
        if isinstance(d, WarnSessions | EndSessions):
            return await self._sessions(d, base)
        raise AssertionError(f"unknown decision {d!r}")

    async def _set_strategy(self, pool: str, d: SetStrategy, base: Applied) -> Applied:
        cur = await self.live.get_pool(pool)
        if cur is None:
            return dataclasses.replace(base, outcome=Outcome.LOST_RACE, info={"error": "pool is gone"})
        if cur.strategy == d.strategy:
            return dataclasses.replace(base, outcome=Outcome.SKIPPED, info={"error": "strategy already set"})
        body = {k: v for k, v in cur.to_dict().items() if k != "name"}
        body["strategy"] = d.strategy
        await self.broker.put_pool(ACTOR, pool, body)
        return dataclasses.replace(base, info={"from": cur.strategy, "to": d.strategy})

    async def _start(self, pool: str, d: StartHosts, base: Applied) -> Applied:
        if not self.provider.can_start:
            return dataclasses.replace(base, outcome=Outcome.SKIPPED,
                                       info={"error": f"the {self.provider.name} provider cannot start hosts"})
        try:
            ids = await self.provider.start_hosts(pool, d.count)
        except Exception as exc:  # provider boundary (subprocess, Kubernetes API): logged, retried next pass
            log.exception("provider %s could not start %d host(s) for %s", self.provider.name, d.count, pool)
            return dataclasses.replace(base, outcome=Outcome.FAILED, info={"error": str(exc)})
        # a provider may reuse the id of a host it stopped (a StatefulSet's ordinal): the new node is welcome
        await self.live.unretire(list(ids))
        return dataclasses.replace(base, info={"hosts": list(ids)})

    async def _stop(self, pool: str, host_id: str, base: Applied) -> Applied:
        try:
            if not await self.provider.can_stop(pool, host_id):
                return dataclasses.replace(base, outcome=Outcome.SKIPPED,
                                           info={"error": f"the {self.provider.name} provider keeps this host"})
        except Exception as exc:  # provider boundary
            log.exception("provider %s failed checking %s", self.provider.name, host_id)
            return dataclasses.replace(base, outcome=Outcome.FAILED, info={"error": str(exc)})
        try:
            await self.broker.remove_host(ACTOR, host_id, force=False)  # atomic: refuses a host with sessions
        except Conflict as exc:
            log.info("autoscale %s: not stopping %s, a session raced in (%s)", pool, host_id, exc.detail)
            return dataclasses.replace(base, outcome=Outcome.LOST_RACE, info={"error": exc.detail})
        except NotFound:
            pass  # already deregistered (admin, node): nothing can be seated on it; stop what still runs
        try:
            await self.provider.stop_host(pool, host_id)
        except Exception as exc:  # provider boundary; the host is deregistered, a later pass retries
            log.exception("provider %s could not stop %s", self.provider.name, host_id)
            return dataclasses.replace(base, outcome=Outcome.FAILED, info={"error": str(exc)})
        return base

    async def _stop_unregistered(self, pool: str, host_id: str) -> Applied:
        timeout = self.settings.autoscale_boot_timeout_s
        base = Applied("stop_host", BOOT_TIMEOUT_REASON, f"started but not registered after {timeout:g} s",
                       Outcome.APPLIED, host=host_id)
        return await self._stop(pool, host_id, base)

    async def _sessions(self, d: WarnSessions | EndSessions, base: Applied) -> Applied:
        hosts = await self.live.get_hosts([d.host_id])
        if not hosts or hosts[0]["state"] != HostState.DRAINING:
            return dataclasses.replace(base, outcome=Outcome.LOST_RACE, info={"error": "host is no longer draining"})
        sessions = await self.live.get_sessions(hosts[0]["sessions"])
        done: list[str] = []
        for s in sessions:
            if isinstance(d, WarnSessions):
                await self.broker.warn(s, WARNING_CODE, d.message, d.ends_in_s)
                done.append(s["id"])
            elif await self.broker.end_session_internal(s["id"], d.end_reason, d.detail) == "ended":
                done.append(s["id"])
        return dataclasses.replace(base, count=len(done), info={"sessions": done})

    # ---- plans (API service) ---------------------------------------------------------------
    async def put_plan(self, who: Principal, pool: str, body: Any) -> tuple[bool, dict[str, Any]]:
        """Validate and store a pool's plan (nothing is stored when it is invalid); audited."""
        cfg = await self.broker.get_pool(pool)
        plan = ScalingPlan.from_body(body)
        now_ms, now = self._now()
        created = await self.repo.save_plan(cfg.name, plan.to_dict(), now_ms)
        await self.repo.audit(now_ms, who.name, who.role, "plan.create" if created else "plan.update", cfg.name,
                              plan.to_dict())
        return created, {"pool": cfg.name, "plan": plan.to_dict(), "updated_ms": now_ms,
                         "phase": phase_view(phase_at(plan, now))}

    async def get_plan(self, pool: str) -> dict[str, Any]:
        row = await self.repo.get_plan(pool)
        if row is None:
            raise NotFound(f"pool {pool!r} has no scaling plan (PUT one to turn autoscaling on)", field="plan")
        plan = ScalingPlan.from_body(row["plan"])
        return {"pool": pool, "plan": plan.to_dict(), "updated_ms": row["updated_ms"],
                "phase": phase_view(phase_at(plan, self._now()[1]))}

    async def delete_plan(self, who: Principal, pool: str) -> list[Applied]:
        """Turn autoscaling off: drop the plan, undrain the hosts the autoscaler drained, forget its state."""
        if not await self.repo.delete_plan(pool):
            raise NotFound(f"pool {pool!r} has no scaling plan", field="plan")
        record = await self.load_record(pool)
        applied = []
        for host in sorted(record.state.drained):
            a = await self.apply_decision(PoolConfig(pool), Undrain(host, DISABLED_REASON, "scaling plan deleted"))
            applied.append(a)
        await self.live.redis.delete(self.live.keys.autoscale(pool))
        now_ms = self.broker.clock()
        await self.repo.add_decisions([a.row(pool, record.state.phase or "-", now_ms) for a in applied])
        await self.repo.audit(now_ms, who.name, who.role, "plan.delete", pool,
                              {"undrained": [a.host for a in applied if a.outcome == Outcome.APPLIED]})
        return applied

    async def status(self, pool: str, limit: int = 50) -> dict[str, Any]:
        """Plan phase now, persisted state, last evaluation and the latest recorded decisions."""
        row = await self.repo.get_plan(pool)
        plan = ScalingPlan.from_body(row["plan"]) if row else None
        record = await self.load_record(pool)
        return {
            "pool": pool, "enabled": plan is not None, "provider": self.provider.name,
            "interval_s": self.settings.autoscale_interval_s,
            "phase": phase_view(phase_at(plan, self._now()[1])) if plan else None,
            "state": record.state.to_dict(), "starting": dict(record.starting),
            "last_evaluation": record.last, "decisions": await self.repo.decisions(pool, limit),
        }

    # ---- pool sizing -----------------------------------------------------------------------
    async def simulate(self, who: Principal, pool: str, body: Any) -> dict[str, Any]:
        """Simulate always-on vs the pool's plan (vs a recommended plan) over history or a synthetic week."""
        data = validate(body, SIMULATE_SCHEMA)
        cfg = await self.broker.get_pool(pool)
        if data["plan"] is not None:
            try:
                plan = ScalingPlan.from_body(data["plan"])
            except ValidationError as exc:
                path = f"plan.{exc.field}" if exc.field else "plan"
                raise ValidationError(f"plan.{exc.detail}", field=path) from None
            label = f"proposed plan ({plan.name})"
        else:
            row = await self.repo.get_plan(pool)
            plan = ScalingPlan.from_body(row["plan"]) if row else DEFAULT_PLAN
            label = f"plan ({plan.name})" if row else "default plan"
        loads = await self.live.host_loads(cfg)
        biggest = max(loads, key=lambda h: (h.seats, len(h.gpus)), default=None)
        gpus = data["gpus_per_host"] or (1 if data["seats_per_host"] or not biggest or not biggest.gpus
                                         else len(biggest.gpus))
        per_gpu = max((g.seats for g in biggest.gpus), default=0) if biggest else 0
        seats = data["seats_per_host"] or (per_gpu or cfg.max_sessions_per_gpu) * gpus
        if seats % gpus:
            raise ValidationError("seats_per_host: must be a multiple of gpus_per_host", field="seats_per_host")
        max_hosts = data["max_hosts"] or (self.settings.autoscale_max_hosts if self.provider.can_start
                                          else max(1, len(loads)))
        now_ms, now = self._now()
        days = float(data["days"])
        rows = await self.repo.pool_demand(cfg.name, now_ms - int(days * DAY_MS), now_ms)
        use_history = data["source"] == "history" or (data["source"] == "auto"
                                                      and len(rows) >= data["min_history_sessions"])
        if use_history:
            start = now - timedelta(days=days)
            demand = history_demand(rows, start)
            peak = None
        else:  # a synthetic week whose t=0 is local midnight in the plan's time zone
            local = (now - timedelta(days=days)).astimezone(ZoneInfo(plan.time_zone))
            start = datetime.combine(local.date(), time(0), tzinfo=local.tzinfo)
            peak = data["peak_concurrency"] if data["peak_concurrency"] is not None else round(0.6 * max_hosts * seats)
            demand = synthetic_demand(peak, days, seed=data["seed"], start_weekday=start.weekday())
        config = SimConfig(cfg, hosts=max_hosts, seats_per_host=seats, gpus_per_host=gpus, start=start, days=days,
                           tick_s=data["tick_s"], boot_delay_s=data["boot_delay_s"],
                           price_per_host_hour=data["price_per_host_hour"])
        forecast = None
        if plan.is_predictive:  # fitted on the weeks before the simulated window, as the live loop would be
            weeks = plan.predictive.history_weeks
            start_ms = int(start.timestamp() * 1000)
            past = await self.repo.pool_demand(cfg.name, start_ms - weeks * WEEK_MS, start_ms)
            fit_start = datetime.fromtimestamp(start_ms / 1000.0 - weeks * WEEK_MS / 1000.0, UTC)
            forecast = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(history_forecast, past, fit_start, weeks, plan.time_zone))
        run = functools.partial(sizing_report, demand, config, plan, label, data["recommend"],
                                data["target_wait_pct"], forecast)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with self._simulations:
            report = await loop.run_in_executor(None, run)
        result = {"pool": cfg.name, "ts_ms": now_ms, "source": "history" if use_history else "synthetic",
                  "history_sessions": len(rows), "peak_concurrency": peak, "days": days, "max_hosts": max_hosts,
                  "seats_per_host": seats, "gpus_per_host": gpus, "plan": plan.to_dict(), **report,
                  "elapsed_s": round(loop.time() - t0, 3)}
        if data["recommend"]:
            await self.repo.save_recommendation(cfg.name, result, now_ms)
        await self.repo.audit(now_ms, who.name, who.role, "plan.simulate", cfg.name,
                              {"source": result["source"], "host_hours": result["host_hours"]})
        return result

    async def recommendation(self, pool: str) -> dict[str, Any]:
        row = await self.repo.get_recommendation(pool)
        if row is None:
            raise NotFound(f"no recommendation for pool {pool!r} yet (POST .../simulate)", field="pool")
        result: dict[str, Any] = row["result"]
        return result
