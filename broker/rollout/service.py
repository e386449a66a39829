"""Canary rollout service: the admin API's effects and the leader-locked loop that applies the judge.

Job: the thin effectful layer around the pure `broker.rollout.policy`.  State:

- SQL ``rollouts`` (system of record): the policy, ``state`` (active | rolled_back), when the
  judging window started, the latest evaluation.  A promotion deletes the row.
- Redis ``P:pool:{pool}:rollout`` (the seating split: candidate version, share, counter) and the
  per-class placement indexes the Lua steps keep while it exists (``LiveStore.set_rollout``).
  Each pass rewrites it from SQL when it disagrees (a Redis loss, a replica that died between
  the two writes), so SQL wins.

One pass per pool with a rollout (`Rollouts.evaluate_pool`), like the autoscaler:

  1. take the pool's leader lock (``rollout:{pool}``, TTL'd) -- one replica judges a pool;
  2. reconcile the Redis split with SQL;
  3. active: gather the window's session outcomes (SQL history with the host version each ran
     on, plus the live sessions of the pool's hosts and their last heartbeat's freeze / encoder
     error counts and time to first frame where nodes report them), ``judge``, then apply: rollback = drain every up
     host of the candidate version with the reason (each drain audited as ``host.drain``), share
     0 (seatings avoid the candidate), state rolled_back, ``rollout.rollback`` audited, the
     ``render_broker_rollout_rolled_back`` gauge (alert ``RenderBrokerCanaryRolledBack``);
     promote = clear the split and delete the row, ``rollout.promote`` audited; hold = record;
  4. rolled_back: keep draining candidate hosts that come up (a node restarted on the bad image).

Every replica's loop also refreshes the rollout gauges from SQL before it tries the lock, so
every replica exports the same view.  Sessions already running on candidate hosts are never
ended by a rollback: a drain only stops new seatings.

Concurrency: one `Rollouts` per process; its loop (``broker.app``) calls `run_once` every
``rollout_interval_s`` (a broker setting, 15 s by default); request handlers call `put`, `get`,
`delete` and `admin_decision` concurrently with it.  Shared state is in Redis/SQL; the per-pool lock serialises passes.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from enum import StrEnum
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from broker.auth import Principal
from broker.db.rollouts import RolloutRepository
from broker.errors import Conflict, NotFound, ValidationError
from broker.protocol import HostState, Role
from broker.rollout.policy import (
    Action,
    Reason,
    RolloutPolicy,
    SessionOutcome,
    Verdict,
    judge,
    split_health,
)
from broker.service import Broker

log = logging.getLogger(__name__)

ACTOR: Final = Principal(Role.ADMIN, "rollout")  # how the rollout loop appears in the audit log
ROLLOUT_INTERVAL_S: Final = 15.0  # seconds between judging passes (the default of ``rollout_interval_s``)


class State(StrEnum):
    ACTIVE = "active"
    ROLLED_BACK = "rolled_back"


def _lock_name(pool: str) -> str:
    return f"rollout:{pool}"


class RolloutMetrics:
    """Gauges every replica refreshes from SQL, and the decisions this process applied."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry or CollectorRegistry()
        self.active = Gauge("render_broker_rollout_active", "1 while the pool's canary rollout is being judged",
                            ["pool"], registry=r)
        self.rolled_back = Gauge("render_broker_rollout_rolled_back",
                                 "1 while the pool's canary rollout stands rolled back (candidate hosts drained)",
                                 ["pool"], registry=r)
        self.decisions = Counter("render_broker_rollout_decisions_total",
                                 "Canary promotions and rollbacks applied by this replica", ["pool", "action"],
                                 registry=r)

    def refresh(self, rows: list[dict[str, Any]]) -> None:
        self.active.clear()
        self.rolled_back.clear()
        for row in rows:
            self.active.labels(row["pool"]).set(1 if row["state"] == State.ACTIVE else 0)
            self.rolled_back.labels(row["pool"]).set(1 if row["state"] == State.ROLLED_BACK else 0)


class Rollouts:
    """Canary rollouts of every pool (see the module docstring)."""

    def __init__(self, broker: Broker, registry: CollectorRegistry | None = None, owner: str | None = None,
                 interval_s: float = ROLLOUT_INTERVAL_S) -> None:
        self.broker = broker
        # the pool's leader lock outlives two passes, so a leader keeps it while it runs
        self.lock_ttl_ms = int(max(10.0, 2 * interval_s) * 1000)
        self.live = broker.live
        self.repo = RolloutRepository(broker.repo.engine)
        self.metrics = RolloutMetrics(registry)
        self.owner = owner or uuid.uuid4().hex

    # ---- API service -------------------------------------------------------------------------
    async def put(self, who: Principal, pool: str, body: Any) -> tuple[bool, dict[str, Any]]:
        """Start (or restart, with a fresh judging window) a pool's rollout; validated, stored, audited."""
        cfg = await self.broker.get_pool(pool)
        policy = RolloutPolicy.from_body(body)
        now = self.broker.clock()
        created = await self.repo.save(cfg.name, policy.to_dict(), State.ACTIVE, now, now)
        await self.live.set_rollout(cfg.name, policy.candidate_version, policy.share_pct)
        await self.broker.repo.audit(now, who.name, who.role, "rollout.create" if created else "rollout.update",
                                     cfg.name, policy.to_dict())
        log.info("rollout %s: %s of new sessions prefer version %r", cfg.name, f"{policy.share_pct} %",
                 policy.candidate_version)
        return created, await self.get(cfg.name)

    async def _row(self, pool: str) -> dict[str, Any]:
        row = await self.repo.get(pool)
        if row is None:
            raise NotFound(f"pool {pool!r} has no rollout (PUT one to start a canary)", field="rollout")
        return row

    async def get(self, pool: str) -> dict[str, Any]:
        """The policy, state, Redis split (seatings counted) and the hosts of each version class."""
        await self.broker.get_pool(pool)
        row = await self._row(pool)
        policy = RolloutPolicy.from_body(row["policy"])
        hosts = await self.live.get_hosts(await self.live.host_ids(pool))
        cand = sorted(h["id"] for h in hosts if h["version"] == policy.candidate_version)
        return {"pool": pool, "policy": policy.to_dict(), "state": row["state"], "started_ms": row["started_ms"],
                "updated_ms": row["updated_ms"], "last": row["last"], "split": await self.live.rollout_split(pool),
                "candidate_hosts": cand, "stable_hosts": sorted(h["id"] for h in hosts if h["id"] not in cand)}

    async def delete(self, who: Principal, pool: str) -> None:
        """Stop the rollout without a verdict: the split goes, drained hosts stay as they are."""
        await self.broker.get_pool(pool)
        await self._row(pool)
        await self.live.set_rollout(pool, "", 0)
        await self.repo.delete(pool)
        await self.broker.repo.audit(self.broker.clock(), who.name, who.role, "rollout.delete", pool)

    async def admin_decision(self, who: Principal, pool: str, action: str, body: Any) -> dict[str, Any]:
        """An admin's promote or rollback (``body.reason`` optional, audited)."""
        await self.broker.get_pool(pool)
        row = await self._row(pool)
        reason = (body or {}).get("reason", "") if isinstance(body, dict) else ""
        if not isinstance(reason, str) or len(reason) > 200:
            raise ValidationError("reason: must be a string of at most 200 characters", field="reason")
        policy = RolloutPolicy.from_body(row["policy"])
        detail = reason or f"{action} by {who.name}"
        if action == Action.PROMOTE:
            await self._promote(who, pool, policy, Verdict(Action.PROMOTE, Reason.ADMIN, detail))
            return {"pool": pool, "promoted": policy.candidate_version}
        if row["state"] == State.ROLLED_BACK:
            raise Conflict(f"the rollout of {policy.candidate_version!r} in {pool!r} is already rolled back",
                           field="rollout")
        drained = await self._rollback(who, pool, policy, Verdict(Action.ROLLBACK, Reason.ADMIN, detail))
        return {**await self.get(pool), "drained": drained}

    # ---- effects -----------------------------------------------------------------------------
    async def _drain_candidates(self, who: Principal, pool: str, policy: RolloutPolicy, why: str) -> list[str]:
        drained = []
        for h in await self.live.get_hosts(await self.live.host_ids(pool)):
            if h["version"] != policy.candidate_version or h["state"] != HostState.UP:
                continue
            try:
                await self.broker.set_host_state(who, h["id"], HostState.DRAINING, why)
            except (NotFound, Conflict):  # gone or down meanwhile: nothing to drain
                continue
            drained.append(h["id"])
        return drained

    async def _rollback(self, who: Principal, pool: str, policy: RolloutPolicy, v: Verdict) -> list[str]:
        now = self.broker.clock()
        why = f"canary rollback of {policy.candidate_version}: {v.reason.value}: {v.detail}"[:500]
        # seatings avoid the candidate first, then its hosts stop taking sessions
        await self.live.set_rollout(pool, policy.candidate_version, 0)
        drained = await self._drain_candidates(who, pool, policy, why)
        await self.repo.update(pool, now, state=State.ROLLED_BACK, last={"ts_ms": now, **v.to_dict()})
        await self.broker.repo.audit(now, who.name, who.role, "rollout.rollback", pool,
                                     {"version": policy.candidate_version, **v.to_dict(), "drained": drained})
        self.metrics.decisions.labels(pool, Action.ROLLBACK.value).inc()
        self.metrics.rolled_back.labels(pool).set(1)
        self.metrics.active.labels(pool).set(0)
        log.warning("rollout %s: rolled back %r (%s: %s); drained %s", pool, policy.candidate_version,
                    v.reason, v.detail, drained or "none")
        return drained

    async def _promote(self, who: Principal, pool: str, policy: RolloutPolicy, v: Verdict) -> None:
        now = self.broker.clock()
        await self.live.set_rollout(pool, "", 0)
        await self.repo.delete(pool)
        await self.broker.repo.audit(now, who.name, who.role, "rollout.promote", pool,
                                     {"version": policy.candidate_version, **v.to_dict()})
        self.metrics.decisions.labels(pool, Action.PROMOTE.value).inc()
        with contextlib.suppress(KeyError):  # the pool's rollout gauges go with its rollout
            self.metrics.active.remove(pool)
        log.info("rollout %s: promoted %r (%s: %s)", pool, policy.candidate_version, v.reason, v.detail)

    # ---- the loop step -----------------------------------------------------------------------
    async def run_once(self) -> list[tuple[str, Verdict | None]]:
        """Refresh the gauges, then judge every pool whose lock this replica holds (others skip)."""
        rows = await self.repo.all()
        self.metrics.refresh(rows)
        out = []
        for row in rows:
            try:
                out.append((row["pool"], await self.evaluate_pool(row)))
            except Exception:  # one pool's failure must not stop the others: log, retry next pass
                log.exception("rollout pass for pool %s failed", row["pool"])
        return out

    async def outcomes(self, pool: str, since_ms: int) -> list[SessionOutcome]:
        """The window's seated sessions: ended ones from SQL, live ones from Redis with node-reported counts."""
        out = [SessionOutcome(r["host_version"] or "", int(r["seated_ms"] or 0), int(r["started_ms"] or 0),
                              int(r["ended_ms"] or 0), r["end_reason"] or "")
               for r in await self.repo.outcomes(pool, since_ms)]
        hosts = await self.live.get_hosts(await self.live.host_ids(pool))
        reported: dict[str, dict[str, Any]] = {}
        ids: list[str] = []
        for h in hosts:
            ids += h["sessions"]
            for rep in (h.get("telemetry") or {}).get("sessions", []):
                reported[rep.get("id", "")] = rep
        for s in await self.live.get_sessions(ids):
            if s["state"] == "ended" or s["seated_ms"] < since_ms:
                continue
            rep = reported.get(s["id"], {})
            out.append(SessionOutcome(s.get("host_version", ""), s["seated_ms"], s["started_ms"], 0, "",
                                      rep.get("freezes"), rep.get("encoder_errors"), rep.get("first_frame_ms")))
        return out

    async def evaluate_pool(self, row: dict[str, Any]) -> Verdict | None:
        """One pass for one pool; None when another replica leads it or nothing was judged."""
        pool = row["pool"]
        if not await self.live.try_lock(_lock_name(pool), self.owner, self.lock_ttl_ms):
            return None
        policy = RolloutPolicy.from_body(row["policy"])
        share = policy.share_pct if row["state"] == State.ACTIVE else 0
        split = await self.live.rollout_split(pool)
        if split is None or split["version"] != policy.candidate_version or split["share_pct"] != share:
            if await self.live.set_rollout(pool, policy.candidate_version, share) == "unknown_pool":
                return None
            log.info("rollout %s: seating split restored from SQL (version %r, %d %%)", pool,
                     policy.candidate_version, share)
        if row["state"] == State.ROLLED_BACK:
            why = f"canary rollback of {policy.candidate_version} stands (host came up on the candidate version)"
            drained = await self._drain_candidates(ACTOR, pool, policy, why)
            if drained:
                log.warning("rollout %s: drained candidate host(s) %s that came up after the rollback", pool, drained)
            return None
        now = self.broker.clock()
        cand, stable = split_health(await self.outcomes(pool, int(row["started_ms"])), policy.candidate_version, now)
        v = judge(policy, cand, stable, (now - int(row["started_ms"])) / 1000.0)
        last = {"ts_ms": now, **v.to_dict(), "candidate": cand.to_dict(), "stable": stable.to_dict()}
        cur = await self.repo.get(pool)
        if cur is None or cur["started_ms"] != row["started_ms"] or cur["state"] != row["state"]:
            log.info("rollout %s: changed by an admin during the pass; verdict %s dropped", pool, v.action)
            return None  # an admin replaced, deleted or decided it meanwhile: their word wins
        if v.action == Action.ROLLBACK:
            await self._rollback(ACTOR, pool, policy, v)
            await self.repo.update(pool, now, last=last)
        elif v.action == Action.PROMOTE:
            await self._promote(ACTOR, pool, policy, v)
        else:
            await self.repo.update(pool, now, last=last)
        return v
