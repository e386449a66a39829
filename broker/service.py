"""The broker's service layer: validates input, calls the live store and SQL, logs reasons.

Handlers stay thin and call this; background loops (reaper, outbox recorder,
sampler) call it too.  Policies (placement, timeouts) are pure modules; this
layer performs their effects.  ``now_ms`` comes from an injected clock so
integration tests can run the reaper at any instant.

Concurrency: one Broker per process, shared by every request task.  Every
state change is a single Lua step in Redis, so concurrent calls here (and in
other replicas) cannot interleave halfway; SQL writes follow from the Redis
outbox and are idempotent.

Size: about 650 lines on purpose for now: one class that every route and background loop calls,
its methods grouped by what they act on (pools, hosts, sessions, background steps); each method is
a validation, one Lua step and its logging.  The background steps (reaper, outbox, recovery after a
Redis loss) are the first to move into their own module when it grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from broker.auth import Principal, turn_credentials
from broker.db.repository import Repository
from broker.errors import Conflict, Forbidden, HostRetired, NotFound, QueueFull, Unavailable, ValidationError
from broker.lifecycle import (
    STATE_LOST,
    SessionClock,
    Timeouts,
    grace_gap_ms,
    lease_expiry,
    reap,
    warn_before_end,
)
from broker.models import (
    SESSION_SCHEMA,
    SESSION_STATE_SCHEMA,
    USER_RE,
    PoolConfig,
    Profile,
    check_name,
    parse_host,
    validate_heartbeat,
)
from broker.protocol import API_PREFIX, EndReason, HostState, NodeCommand, Role, SessionState
from broker.settings import BrokerSettings
from broker.store.keys import REAP_CLAIM_MS, RECOVERY_TTL_S, RETIRED_HOST_TTL_S
from broker.store.live import LiveStore, host_load
from broker.validate import validate

log = logging.getLogger(__name__)

Clock = Callable[[], int]
REAP_BATCH = 200  # deadlines one Lua step takes at a time (bounds how long a step holds Redis)
SESSION_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Stats:
    """Counters the metrics endpoint exports (process-local)."""

    allocations: int = 0
    sessions_ended: int = 0
    hosts_lost: int = 0
    outbox_written: int = 0
    recoveries: int = 0  # times this process found Redis's live state lost and restored it
    sessions_adopted: int = 0  # sessions re-adopted from re-registering nodes
    sessions_lost: int = 0  # sessions ended state_lost in SQL (nobody re-claimed them)
    lease_graces: int = 0  # reaper passes that found a gap and renewed every live lease


class Broker:
    def __init__(self, settings: BrokerSettings, live: LiveStore, repo: Repository,
                 clock: Clock = wall_clock_ms, observe_allocation: Callable[[float], None] | None = None,
                 *, on_start_timeout: Callable[[str], None] | None = None) -> None:
        """``observe_allocation(seconds)`` sees each seat-or-queue step's latency; ``on_start_timeout(pool)``
        each session this process ended because its node never made it ready (the metrics' counters)."""
        self.settings = settings
        self.live = live
        self.repo = repo
        self.clock = clock
        self.stats = Stats()
        self._observe_allocation = observe_allocation or (lambda _s: None)
        self._on_start_timeout = on_start_timeout or (lambda _pool: None)
        self._loop_late_s = 0.0  # how late the reaper's last tick fired (see note_loop_lag)
        self._orphans_seen: set[bytes] = set()
        self.epoch: str | None = None  # the live-state generation this process works on (see state_check)
        self.recovering = False  # True while restoring Redis's lost state (readyz says not ready)

    # ---- pools ---------------------------------------------------------------------------
    async def put_pool(self, who: Principal, name: str, body: Any) -> tuple[bool, dict[str, Any]]:
        cfg = PoolConfig.from_body(name, body)
        now = self.clock()
        created, seated = await self.live.put_pool(cfg, now)
        await self.repo.save_pool(cfg.name, {k: v for k, v in cfg.to_dict().items() if k != "name"}, now)
        await self.repo.audit(now, who.name, who.role, "pool.create" if created else "pool.update", name,
                              cfg.to_dict())
        if seated:
            log.info("pool %s change seated %d queued sessions", name, len(seated))
        return created, await self.pool_view(cfg)

    async def pool_view(self, cfg: PoolConfig) -> dict[str, Any]:
        return {**cfg.to_dict(), **await self.live.pool_summary(cfg)}

    async def get_pool(self, name: str) -> PoolConfig:
        cfg = await self.live.get_pool(name)
        if cfg is None:
            raise NotFound(f"no pool named {name!r}", field="pool")
        return cfg

    async def list_pools(self) -> list[dict[str, Any]]:
        out = []
        for name in await self.live.list_pools():
            cfg = await self.live.get_pool(name)
            if cfg is not None:
                out.append(await self.pool_view(cfg))
        return out

    async def delete_pool(self, who: Principal, name: str) -> None:
        status = await self.live.delete_pool(name)
        if status == "not_found":
            raise NotFound(f"no pool named {name!r}", field="pool")
        if status == "busy":
            raise Conflict(f"pool {name!r} still has hosts or queued sessions", field="pool")
        await self.repo.delete_pool(name)
        await self.repo.audit(self.clock(), who.name, who.role, "pool.delete", name)

    async def restore_pools(self) -> int:
        """Copy pool configs from SQL into Redis where Redis lost them (e.g. a fresh Redis)."""
        restored = 0
        for row in await self.repo.load_pools():
            if await self.live.get_pool(row["name"]) is None:
                await self.live.put_pool(PoolConfig.from_dict(row), self.clock())
                restored += 1
        return restored

    # ---- hosts ---------------------------------------------------------------------------
    async def register_host(self, body: Any) -> dict[str, Any]:
        """Register (or re-register) a host; sessions the node says it still streams are re-adopted.

        The view carries ``adopted`` (session ids now live on this host) and ``stop`` (ids the node
        must stop: ended, elsewhere, or refused).  See ``_adopt``.
        """
        data, gpus = parse_host(body)
        for i, c in enumerate(data["sessions"]):
            if not SESSION_ID_RE.fullmatch(c["id"]):
                raise ValidationError(f"sessions[{i}].id: must match {SESSION_ID_RE.pattern}",
                                      field=f"sessions[{i}].id")
            if not USER_RE.fullmatch(c["user"]):
                raise ValidationError(f"sessions[{i}].user: must match {USER_RE.pattern}",
                                      field=f"sessions[{i}].user")
        if await self.live.get_pool(data["pool"]) is None:
            await self._no_pool(data["pool"])
        now = self.clock()
        status, _seated = await self.live.register_host(data["id"], data["pool"], data["address"], gpus, now,
                                                        self.settings.lease_ttl_ms, data["version"])
        if status == "retired":
            raise self._retired(data["id"])
        if status == "wrong_pool":
            raise Conflict(f"host {data['id']!r} has live sessions in another pool", field="pool")
        if status == "unknown_pool":
            await self._no_pool(data["pool"])
        await self.repo.audit(now, data["id"], Role.NODE, "host.register", data["id"],
                              {"pool": data["pool"], "address": data["address"], "gpus": len(gpus),
                               "sessions": len(data["sessions"])})
        adopted, stop = await self._adopt(data["id"], data["pool"], data["sessions"], now)
        view = await self.get_host(data["id"])
        view["adopted"], view["stop"] = adopted, stop
        return view

    async def _no_pool(self, name: str) -> NoReturn:
        """Raise for a pool Redis does not have: 503 while Redis's live state is lost (not restored
        yet: the pool comes back from SQL within a reaper pass), else 404."""
        if self.epoch is not None and await self.live.get_epoch() != self.epoch:
            raise Unavailable(f"live state is being restored (Redis lost it); pool {name!r} returns shortly")
        raise NotFound(f"no pool named {name!r}", field="pool")

    async def _adopt(self, host_id: str, pool: str, claims: list[dict[str, Any]],
                     now: int) -> tuple[list[str], list[str]]:
        """Re-adopt the sessions a re-registering node still streams; returns (adopted or kept, stop).

        SQL is the judge where it knows the session: one it recorded as ended is stopped, one it has
        live for another user, pool or host is refused (stopped); its created/seated times are kept.
        A claim SQL has never heard of (its records were still in Redis's outbox when Redis lost
        them) is adopted on the node's word, bound to this host's own credential, and audited as
        unverified.  Redis then rebuilds each on this host and GPU when the seat is free.
        """
        if not claims:
            return [], []
        ids = [c["id"] for c in claims]
        ended = await self.repo.ended_ids(ids)
        known = await self.repo.live_rows(ids)
        accepted: list[dict[str, Any]] = []
        refused: list[str] = []
        unverified: list[str] = []
        for c in claims:
            row = known.get(c["id"])
            if c["id"] in ended or (row is not None and (
                    row["user"] != c["user"] or row["pool"] != pool or (row["host"] or host_id) != host_id)):
                refused.append(c["id"])
                continue
            if row is None:
                unverified.append(c["id"])
            accepted.append({**c, "pool": pool, "created_ms": row["created_ms"] if row else 0,
                             "seated_ms": (row["seated_ms"] or 0) if row else 0})
        result = await self.live.adopt_sessions(host_id, now, accepted)
        adopted = [sid for sid, st in result.items() if st in ("adopted", "kept")]
        stop = refused + [sid for sid, st in result.items() if st == "stop"]
        fresh = [sid for sid, st in result.items() if st == "adopted"]
        self.stats.sessions_adopted += len(fresh)
        if fresh or stop:
            log.warning("host %s re-registered with %d session(s): %d re-adopted, %d already live, %d to stop "
                        "(%d unverified by SQL)", host_id, len(claims), len(fresh), len(adopted) - len(fresh),
                        len(stop), len(unverified))
            await self.repo.audit(now, host_id, Role.NODE, "host.adopt", host_id,
                                  {"adopted": fresh, "stop": stop, "unverified": unverified})
        return adopted, stop

    async def get_host(self, host_id: str) -> dict[str, Any]:
        hosts = await self.live.get_hosts([host_id])
        if not hosts:
            raise NotFound(f"no host {host_id!r}", field="host")
        return (await self._with_seats(hosts))[0]

    async def list_hosts(self, pool: str | None = None) -> list[dict[str, Any]]:
        return await self._with_seats(await self.live.get_hosts(await self.live.host_ids(pool)))

    async def _with_seats(self, hosts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Host records plus seat counts under their pool's rules (each pool config read once)."""
        configs: dict[str, PoolConfig | None] = {}
        for host in hosts:
            name = host["pool"]
            if name and name not in configs:
                configs[name] = await self.live.get_pool(name)
            cfg = configs.get(name) if name else None
            if cfg is None:
                continue
            load = host_load(host, cfg)
            host["seats_total"] = load.seats
            host["seats_used"] = load.used
            for g, gl in zip(host["gpus"], load.gpus, strict=True):
                g["seats"] = gl.seats
        return hosts

    async def heartbeat(self, host_id: str, body: Any) -> dict[str, Any]:
        """Renew the host's lease and reconcile its sessions in one Lua step.

        The lease runs from the heartbeat's arrival (the clock is read before anything else), so
        time this broker spends on the request never eats into it.  A session the node left out is
        ended only when it was reported running before the previous heartbeat arrived (see
        ``store/lua/heartbeat.lua``): a heartbeat built before the node reported it never ends it.
        """
        now = self.clock()
        data = validate_heartbeat(body)
        res = await self.live.heartbeat(host_id, now, self.settings.lease_ttl_ms, data)
        if res.status == "retired":
            raise self._retired(host_id)
        if res.status == "unknown":
            raise NotFound(f"host {host_id!r} is not registered (or was declared down): register again",
                           field="host", extra={"reregister": True})
        for sid in res.ended:
            self.stats.sessions_ended += 1
            log.info("session %s ended: %s (node no longer runs it)", sid, EndReason.NODE_ENDED)
        # host_state: the node's watchdog compares it with its own (an operator's undrain releases a hold)
        return {"status": "ok", "start": [self.session_command(s) for s in res.start], "stop": res.stop,
                "lease_ttl_s": self.settings.host_lease_ttl_s, "host_state": res.host_state}

    async def set_host_state(self, who: Principal, host_id: str, state: HostState,
                             reason: str = "") -> dict[str, Any]:
        """Drain (no new sessions) or undrain a host; ``reason`` goes into the audit record."""
        status, _ = await self.live.set_host_state(host_id, state, self.clock())
        if status == "not_found":
            raise NotFound(f"no host {host_id!r}", field="host")
        if status == "down":
            raise Conflict(f"host {host_id!r} is down", field="host")
        action = "host.drain" if state == HostState.DRAINING else "host.undrain"
        await self.repo.audit(self.clock(), who.name, who.role, action, host_id, {"reason": reason} if reason else None)
        return await self.get_host(host_id)

    @staticmethod
    def _retired(host_id: str) -> HostRetired:
        return HostRetired(f"host {host_id!r} was removed by an admin or the autoscaler; its node must stop "
                           f"(the id is refused for up to {RETIRED_HOST_TTL_S} s)", field="host",
                           extra={"retired": True})

    async def remove_host(self, who: Principal, host_id: str, force: bool) -> list[str]:
        """Deregister a host (its sessions end only with ``force``); returns the ended session ids.

        A removal by an admin or the autoscaler retires the id (``RETIRED_HOST_TTL_S``): the node,
        still running until its provider stops it, is refused on its next heartbeat instead of
        registering again and taking sessions.  A node deregistering itself (shutdown) is not
        retired, so a restart under the same id registers at once.
        """
        reason = EndReason.ADMIN if who.role == Role.ADMIN else EndReason.NODE_ENDED
        status, ended = await self.live.remove_host(host_id, force, reason, self.clock(),
                                                    retire=who.role == Role.ADMIN)
        if status == "not_found":
            raise NotFound(f"no host {host_id!r}", field="host")
        if status == "busy":
            raise Conflict(f"host {host_id!r} still has {ended[0]} live session(s); drain it or force=true",
                           field="force")
        await self.repo.audit(self.clock(), who.name, who.role, "host.remove", host_id,
                              {"ended": ended, "retired": who.role == Role.ADMIN})
        return ended

    # ---- sessions ------------------------------------------------------------------------
    async def create_session(self, who: Principal, body: Any) -> tuple[bool, dict[str, Any]]:
        """Seat or queue a new session, or return the user's live one: (created, session view)."""
        if who.role != Role.USER:
            raise Forbidden("sessions are requested with a user token")
        data = validate(body, SESSION_SCHEMA)
        check_name(data["pool"], "pool")
        profile = Profile.from_body(data["profile"])
        t0 = time.perf_counter()
        res = await self.live.create_session(uuid.uuid4().hex, who.name, data["pool"], profile.__dict__,
                                             self.clock())
        self._observe_allocation(time.perf_counter() - t0)
        if res == "unknown_pool":
            await self._no_pool(data["pool"])
        if res == "queue_full":
            raise QueueFull(f"pool {data['pool']!r} is full and its queue is at its limit; try later",
                            field="pool")
        assert not isinstance(res, str)
        self.stats.allocations += res.status != "existing"
        if res.status == "queued" and res.session is not None:
            await self._record_queued(res.session)
        return res.status != "existing", await self.session_view(res.session_id, res.session)

    async def _record_queued(self, session: dict[str, Any]) -> None:
        """Write a new queued session's live row to SQL now, not only through the outbox's next pass.

        A queued session has no node that could re-claim it: were Redis to lose everything before the
        outbox reached SQL, it would vanish without a record.  With the row, recovery ends it ``state_lost``
        (``finish_recovery``).  Seated sessions need no such write (their node re-claims them).  Best effort:
        SQL down leaves it to the outbox, as before; the record is idempotent."""
        try:
            await self.repo.record_batch([("queued", session, self.clock())])
        except Exception as exc:  # SQL unavailable: the outbox still carries the record
            log.warning("queued session %s: SQL write deferred to the outbox (%s)", session.get("id"), exc)

    async def _load_session(self, sid: str) -> dict[str, Any]:
        s = await self.live.get_session(sid)
        if s is None:
            hist = await self.repo.get_history(sid)
            if hist is None:
                if await self.repo.live_rows([sid]):  # SQL has it live, Redis lost it: being restored
                    raise Unavailable(f"session {sid!r} is being restored (Redis lost its live state); its node "
                                      "re-registers it, or it ends state_lost, within a lease: retry shortly")
                raise NotFound(f"no session {sid!r}", field="session")
            return {**hist, "state": SessionState.ENDED.value}
        return s

    async def get_session(self, who: Principal, sid: str) -> dict[str, Any]:
        s = await self._load_session(sid)
        self.check_owner(who, s)
        return await self.session_view(sid, s)

    @staticmethod
    def check_owner(who: Principal, s: dict[str, Any]) -> None:
        if who.role == Role.ADMIN:
            return
        if who.role != Role.USER or who.name != s["user"]:
            raise NotFound(f"no session {s['id']!r}", field="session")  # do not reveal others' ids

    async def session_view(self, sid: str, s: dict[str, Any] | None = None) -> dict[str, Any]:
        s = s or await self._load_session(sid)
        view = {k: s.get(k) for k in ("id", "user", "pool", "kind", "state", "host", "gpu", "profile",
                                        "created_ms", "seated_ms", "started_ms", "ended_ms", "end_reason")}
        if s["state"] != SessionState.QUEUED:
            view["queue_position"] = None
        elif "queue_position" in s:  # fresh from the seating step
            view["queue_position"] = s["queue_position"]
        else:
            view["queue_position"] = await self.live.queue_position(s["pool"], sid)
        if s["state"] in (SessionState.STARTING, SessionState.RUNNING, SessionState.DISCONNECTED):
            view["signaling"] = {"url": f"{API_PREFIX}/sessions/{sid}/signal", "ice_servers": self.ice_servers(sid)}
        view["events_url"] = f"{API_PREFIX}/sessions/{sid}/events"
        return view

    def ice_servers(self, sid: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.settings.stun_urls:
            out.append({"urls": list(self.settings.stun_urls)})
        if self.settings.turn_urls:
            entry: dict[str, Any] = {"urls": list(self.settings.turn_urls)}
            if self.settings.turn_secret:
                user, pw = turn_credentials(self.settings.turn_secret, sid, self.clock() / 1000,
                                            self.settings.turn_ttl_s)
                entry.update(username=user, credential=pw)
            out.append(entry)
        return out

    def session_command(self, s: dict[str, Any]) -> dict[str, Any]:
        """The ``start`` payload a node needs to run a session."""
        return {"cmd": NodeCommand.START.value, "session": {
            "id": s["id"], "user": s["user"], "pool": s["pool"], "kind": s.get("kind"), "gpu": s.get("gpu"),
            "profile": s.get("profile"), "ice_servers": self.ice_servers(s["id"]),
            "staged": not s.get("user")}}  # a staged session is nobody's (its record state is STAGED_STATE)

    async def end_session(self, who: Principal, sid: str) -> dict[str, Any]:
        s = await self._load_session(sid)
        self.check_owner(who, s)
        reason = EndReason.ADMIN if who.role == Role.ADMIN else (
            EndReason.CANCELLED if s["state"] == SessionState.QUEUED else EndReason.USER)
        now = self.clock()
        status = await self.end_session_internal(sid, reason, f"ended by {who.role}", now)
        if who.role == Role.ADMIN:
            await self.repo.audit(self.clock(), who.name, who.role, "session.end", sid, {"user": s["user"]})
        if status == "ended":  # the step wrote exactly these fields: no second read of the record
            return await self.session_view(sid, {**s, "state": SessionState.ENDED.value, "ended_ms": now,
                                                 "end_reason": str(reason)})
        return await self.session_view(sid)

    async def end_session_internal(self, sid: str, reason: EndReason | str, why: str,
                                   now_ms: int | None = None) -> str:
        status, seated = await self.live.end_session(sid, str(reason), self.clock() if now_ms is None else now_ms)
        if status == "ended":
            self.stats.sessions_ended += 1
            log.info("session %s ended: %s (%s); seated from queue: %s", sid, reason, why, seated or "none")
        return status

    async def node_session_state(self, host_id: str, sid: str, body: Any) -> dict[str, Any]:
        data = validate(body, SESSION_STATE_SCHEMA)
        if data["state"] == "ended":
            s = await self.live.get_session(sid)
            if s is None or s.get("host") != host_id:
                raise NotFound(f"no session {sid!r} on host {host_id!r}", field="session")
            reason = data["reason"] if data["reason"] in {r.value for r in EndReason} else EndReason.NODE_ENDED
            await self.end_session_internal(sid, reason, "reported by node")
            return {"status": "ended"}
        status = await self.live.set_session_state(sid, host_id, data["state"], self.clock())
        if status in ("not_found", "wrong_host"):
            raise NotFound(f"no session {sid!r} on host {host_id!r}", field="session")
        if status == "illegal":
            raise Conflict(f"session {sid!r} cannot become {data['state']}", field="state")
        return {"status": status}

    async def leave_session(self, who: Principal, sid: str, tab: str) -> dict[str, Any]:
        """The viewer's tab is closing on purpose: once disconnected, the session ends after the pool's
        ``close_grace_s`` (not ``disconnect_timeout_s``).  Ignored while another tab holds the viewer."""
        s = await self._load_session(sid)
        self.check_owner(who, s)
        result = await self.live.leave_session(sid, tab, self.clock())
        return {"id": sid, "left": result == 1,
                "reason": {1: "left", 0: "not_seated", -1: "another_tab"}.get(result, "unknown")}

    async def touch_session(self, sid: str) -> None:
        await self.live.touch(sid, self.clock())

    # ---- live-state generation (Redis losing everything) -----------------------------------
    async def state_check(self) -> bool:
        """Detect a Redis that lost its live state and restore what SQL is the source of truth for.

        ``P:epoch`` is written when a broker starts on a Redis (or restores one); it has no TTL, so
        its absence means the data went (restarted empty, a failover that lost writes), and a value
        other than this process's means another replica already restored it.  Restoring: pool
        configs from SQL, the indexes, a new epoch (the first replica to write it also records the
        recovery: ``P:recovery``, whose window of one lease lets nodes re-register with their
        sessions; ``finish_recovery`` ends the rest).  ``recovering`` is set meanwhile (readyz 503).
        Returns True when it restored.  Idempotent across replicas: every step is.
        """
        epoch = await self.live.get_epoch()
        if epoch is not None and self.epoch in (None, epoch):
            self.epoch = epoch  # a process starting on a live Redis joins its generation
            return False
        self.recovering = True
        try:
            now = self.clock()
            restored = await self.restore_pools()
            await self.ensure_indexes()
            candidate = uuid.uuid4().hex
            won = await self.live.claim_epoch(candidate)
            if won == candidate:
                until = now + self.settings.lease_ttl_ms
                await self.live.redis.set(self.live.keys.recovery, json.dumps(
                    {"epoch": won, "at_ms": now, "until_ms": until}), ex=RECOVERY_TTL_S)
            first = self.epoch is None
            self.epoch = won
            self.stats.recoveries += 0 if first else 1
            log.log(logging.INFO if first else logging.WARNING,
                    "live state generation %s (%s): %d pool config(s) restored from SQL; nodes re-register "
                    "with their sessions within one lease (%.1f s)", won,
                    "started" if first else ("Redis lost its state" if epoch is None else "restored by a peer"),
                    restored, self.settings.host_lease_ttl_s)
            return True
        finally:
            self.recovering = False

    async def finish_recovery(self) -> int:
        """After a recovery's window (one lease), end in SQL (``state_lost``) the sessions SQL still
        counts live that Redis does not have: nobody re-claimed them, or they were queued.  Exactly
        one replica does it (it takes ``P:recovery``).  Returns how many were ended."""
        raw = await self.live.redis.get(self.live.keys.recovery)
        if raw is None:
            return 0
        rec = json.loads(raw)
        now = self.clock()
        if now < int(rec["until_ms"]) or await self.live.redis.getdel(self.live.keys.recovery) is None:
            return 0
        rows = await self.repo.live_rows()
        ids = sorted(rows)
        gone: list[dict[str, Any]] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            async with self.live.redis.pipeline(transaction=False) as pipe:
                for sid in chunk:
                    pipe.exists(self.live.keys.session(sid))
                present = await pipe.execute()
            gone += [rows[sid] for sid, n in zip(chunk, present, strict=True) if not n]
        ended = await self.repo.end_lost(gone, now, STATE_LOST)
        self.stats.sessions_lost += ended
        if gone:
            log.warning("recovery %s: %d session(s) SQL had live were not re-claimed within a lease: ended %s "
                        "in SQL (%s)", rec["epoch"], ended, STATE_LOST, ", ".join(r["id"] for r in gone[:20]))
        return ended

    # ---- background steps (each is one pass; loops live in broker.app) -------------------
    def note_loop_lag(self, late_s: float) -> None:
        """Record how late this process's reaper tick fired (its event loop was busy that long)."""
        self._loop_late_s = late_s

    async def ensure_indexes(self) -> bool:
        """Build the live store's indexes from the records once (an upgrade from an index-less layout)."""
        built = await self.live.ensure_indexes(self.clock(), uuid.uuid4().hex)
        if built:
            log.info("built the placement indexes, counters and deadlines from the live records")
        return built

    async def reap_once(self) -> list[tuple[str, str]]:
        """End hosts past their lease and sessions past their timeouts; returns (id, reason) ended.

        The pass starts by stamping itself in Redis: after a gap (Redis, or every broker, away for more
        than ``lifecycle.grace_gap_ms``) every lease alive before the gap is renewed for a full lease,
        so nodes whose heartbeats could not get through have a lease to come back in.

        Reads only what is due (sorted sets of deadlines), so a pass costs what expired, not the
        fleet; replicas share the work (a lease expiry is one Lua step, a session deadline is claimed
        before it is handled).  How many due leases a pass expires is ``lifecycle.lease_expiry``'s
        decision: none while this process's event loop lags (heartbeats may be waiting in its own
        queue), a trickle when a large share of the fleet is due at once (a stalled broker or Redis
        looks like that): a slow broker must not declare live hosts lost.
        """
        await self.state_check()
        await self.finish_recovery()
        now = self.clock()
        ended: list[tuple[str, str]] = []
        gap, granted = await self.live.reaper_pass(
            now, grace_gap_ms(self.settings.host_lease_ttl_s, self.settings.reaper_interval_s),
            self.settings.lease_ttl_ms)
        if gap >= 0:
            self.stats.lease_graces += 1
            log.warning("no reaper pass reached Redis for %.1f s (Redis or every broker was away): %d live "
                        "host lease(s) renewed for %.1f s of grace", gap / 1000, granted,
                        self.settings.host_lease_ttl_s)
        due = await self.live.lease_due_count(now)
        plan = lease_expiry(due, await self.live.lease_count() if due else 0, self._loop_late_s,
                            self.settings.host_lease_ttl_s)
        if plan.limit < due:
            log.warning("lease expiry held back: %s", plan.reason)
        left = plan.limit
        while left > 0:
            batch = await self.live.expire_hosts(now, min(REAP_BATCH, left))
            for host_id, lost in batch:
                self.stats.hosts_lost += 1
                self.stats.sessions_ended += len(lost)
                log.warning("host %s lease expired: down, %d session(s) ended host_lost", host_id, len(lost))
                ended += [(s, EndReason.HOST_LOST.value) for s in lost]
            left -= REAP_BATCH
            if len(batch) < REAP_BATCH:
                break
        await self.live.purge_hosts(now, REAP_BATCH)
        pools: dict[str, PoolConfig | None] = {}

        async def timeouts(name: str) -> Timeouts | None:
            if name not in pools:
                pools[name] = await self.live.get_pool(name)
            cfg = pools[name]
            if cfg is None:
                return None
            return Timeouts(cfg.queue_timeout_s, cfg.idle_timeout_s, cfg.disconnect_timeout_s, cfg.max_duration_s,
                            close_grace_s=cfg.close_grace_s)

        while True:
            ids = await self.live.claim_due_sessions(now, REAP_BATCH, REAP_CLAIM_MS)
            sessions = await self.live.get_sessions(ids)
            keep = sorted(set(ids) - {s["id"] for s in sessions})  # records gone: their deadlines go too
            for s in sessions:
                t = await timeouts(s["pool"])
                if t is None or s["state"] == SessionState.ENDED:
                    keep.append(s["id"])
                    continue
                d = reap(_session_clock(s), t, now)
                if d.end and d.reason is not None:
                    if await self.end_session_internal(s["id"], d.reason, d.detail) == "ended":
                        ended.append((s["id"], d.reason.value))
                        if d.reason == EndReason.START_FAILED:  # the node never reported it running in time
                            self._on_start_timeout(s["pool"])
                else:
                    keep.append(s["id"])
            if keep and await self.live.reschedule(keep, now):
                log.warning("timeout deadlines disagreed with the policy for some of %s; re-checking in 1 s", keep)
            if len(ids) < REAP_BATCH:
                break
        warn_s = self.settings.warn_before_end_s
        candidates = await self.live.warn_candidates(now + warn_s * 1000, REAP_BATCH)
        sessions = await self.live.get_sessions(candidates)
        await self.live.reschedule(sorted(set(candidates) - {s["id"] for s in sessions}), now)
        for s in sessions:
            t = await timeouts(s["pool"])
            if t is None or not s["host"]:
                continue
            left = warn_before_end(_session_clock(s), t, now, warn_s)
            if left is not None and await self.live.take_warning(s["id"], now):
                await self.warn(s, "ending_soon", f"session reaches its maximum duration in {left} s", left)
        return ended

    async def warn(self, s: dict[str, Any], code: str, detail: str, ends_in_s: int) -> None:
        """Tell the viewer (events stream) and the node (data channel) that the session will end."""
        msg = {"type": "warning", "session_id": s["id"], "code": code, "detail": detail, "ends_in_s": ends_in_s}
        await self.live.redis.publish(self.live.keys.chan_session(s["id"]), json.dumps(msg))
        if s.get("host"):
            await self.live.redis.publish(self.live.keys.chan_node(s["host"]), json.dumps(
                {"cmd": NodeCommand.WARN.value, "session_id": s["id"], "code": code, "detail": detail,
                 "ends_in_s": ends_in_s}))

    async def drain_outbox(self) -> int:
        """Write session start/end records from Redis to SQL; returns how many were written."""
        records = await self.live.outbox_take(500)
        orphans = [r for r in await self.live.outbox_orphans() if r in self._orphans_seen and r not in records]
        self._orphans_seen = set(await self.live.outbox_orphans()) - set(records)
        batch = []
        for rec in records + orphans:
            item = json.loads(rec)
            s = {k: (v if v != "" else None) for k, v in item["session"].items()}
            batch.append((item["kind"], s, int(item["ts_ms"])))
        await self.repo.record_batch(batch)
        written = len(batch)
        await self.live.outbox_done(records + orphans)
        self.stats.outbox_written += written
        return written

    async def sample_once(self) -> int:
        """Record one utilization sample per pool (for charts and pool sizing)."""
        now = self.clock()
        rows = []
        for p in await self.list_pools():
            rows.append({"ts_ms": now, "pool": p["name"], "sessions": sum(p["sessions"].values())
                         - p["sessions"].get("queued", 0), "seats_used": p["seats_used"],
                         "seats_total": p["seats_total"], "queue_length": p["queue_length"],
                         "hosts_up": p["hosts"].get("up", 0)})
        await self.repo.add_samples(rows)
        return len(rows)


def _session_clock(s: dict[str, Any]) -> SessionClock:
    return SessionClock(SessionState(s["state"]), s["created_ms"], s["seated_ms"], s["last_active_ms"],
                        s["disconnected_ms"], s.get("left_ms", 0))


async def run_every(interval_s: float, step: Callable[[], Any], name: str, stop: asyncio.Event,
                    on_late: Callable[[float], None] | None = None) -> None:
    """Run ``step`` every ``interval_s`` until ``stop`` is set; failures are logged and retried.

    ``on_late`` gets, before each step, how many seconds later than asked the loop woke up (the
    event loop was busy that long): the reaper uses it to hold lease expiry while it lags.

    Shutdown is signalled by the event rather than by cancellation alone: some client
    libraries swallow a CancelledError that lands inside their I/O, which would leave a
    cancelled loop sleeping forever.
    """
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:  # task boundary: log and retry on the next tick
            log.exception("%s failed; retrying in %.1f s", name, interval_s)
        asked = loop.time() + interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        if on_late is not None:
            on_late(max(0.0, loop.time() - asked))
