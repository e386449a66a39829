"""Repository of live state in Redis: pools, hosts, seats, sessions, queues.

Every change that touches more than one key runs as one Lua script (see
``lua/``), so any number of broker replicas sharing a Redis never over-seat a
GPU, seat a session twice or leak a seat.  Losing a race is a normal result
(``already_ended``, ``alive``), not an error.

Concurrency: one ``redis.asyncio.Redis`` connection pool per process, shared by
all handlers and loops.  Scripts are loaded by SHA and re-sent on NOSCRIPT
(redis-py's ``Script`` does this), so a Redis restart is survived.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from broker.models import Gpu, PoolConfig
from broker.placement import GpuLoad, HostLoad, gpu_seats
from broker.protocol import HostState, SessionState
from broker.store.keys import DOWN_HOST_TTL_S, RETIRED_HOST_TTL_S, Keys

SCRIPT_NAMES = (
    "create_session", "end_session", "session_state", "touch_session", "register_host", "heartbeat",
    "host_down", "host_state", "remove_host", "put_pool", "delete_pool",
)

_INT_FIELDS = ("created_ms", "seated_ms", "started_ms", "last_active_ms", "disconnected_ms", "ended_ms")


def _load_scripts() -> dict[str, str]:
    base = resources.files("broker.store") / "lua"
    prelude = (base / "prelude.lua").read_text()
    return {name: prelude + "\n" + (base / f"{name}.lua").read_text() for name in SCRIPT_NAMES}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def decode_session(raw: dict[Any, Any], session_id: str) -> dict[str, Any] | None:
    """A session hash as typed JSON-ready values (None if the hash is empty)."""
    if not raw:
        return None
    d = {_s(k): _s(v) for k, v in raw.items()}
    if "state" not in d:
        return None
    out: dict[str, Any] = {"id": session_id}
    out.update(d)
    for f in _INT_FIELDS:
        out[f] = int(float(d.get(f) or 0))
    out["gpu"] = int(d["gpu"]) if d.get("gpu") not in (None, "") else None
    out["host"] = d.get("host") or None
    out["profile"] = json.loads(d["profile"]) if d.get("profile") else None
    out["end_reason"] = d.get("end_reason") or None
    return out


def host_load(h: dict[str, Any], pool: PoolConfig) -> HostLoad:
    """A host record (``LiveStore.get_hosts``) as a placement input under ``pool``'s seat rules.

    A host whose lease has run out counts as down even before the reaper marks it.
    """
    state = h["state"] if h["alive"] or h["state"] == HostState.DOWN else HostState.DOWN.value
    gpus = tuple(GpuLoad(g["index"], gpu_seats(g["vram_mb"], g.get("encoder_session_limit"), pool.max_sessions_per_gpu,
                                               pool.vram_per_session_mb, pool.vram_headroom), g["used"])
                 for g in h["gpus"])
    return HostLoad(h["id"], state, gpus)


@dataclass(frozen=True)
class CreateResult:
    status: str  # seated | queued | existing
    session_id: str
    queue_position: int | None = None
    session: dict[str, Any] | None = None  # the session record as stored right after the step


class LiveStore:
    """Typed access to the broker's live state for one key prefix."""

    def __init__(self, redis: aioredis.Redis, prefix: str = "rb") -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self._scripts = {name: redis.register_script(src) for name, src in _load_scripts().items()}

    async def _run(self, name: str, *args: Any) -> Any:
        return await self._scripts[name](keys=[], args=[self.keys.prefix, *args])

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # ---- pools ---------------------------------------------------------------------
    async def put_pool(self, cfg: PoolConfig, now_ms: int) -> tuple[bool, list[str]]:
        """Create or replace a pool; returns (created, session ids seated from its queue)."""
        flat: list[Any] = []
        for k, v in cfg.to_dict().items():
            if k == "name":
                continue
            flat += [k, json.dumps(v) if isinstance(v, bool) else v]
        res = await self._run("put_pool", cfg.name, now_ms, *flat)
        return _s(res[0]) == "created", [_s(x) for x in res[1:]]

    async def get_pool(self, name: str) -> PoolConfig | None:
        raw = await self.redis.hgetall(self.keys.pool(name))
        if not raw:
            return None
        d: dict[str, Any] = {_s(k): _s(v) for k, v in raw.items()}
        typed: dict[str, Any] = {"name": name}
        for f, default in PoolConfig.__dataclass_fields__.items():
            if f == "name" or f not in d:
                continue
            dv = default.default
            if isinstance(dv, bool):
                typed[f] = d[f] in ("true", "1")
            elif isinstance(dv, int):
                typed[f] = int(float(d[f]))
            elif isinstance(dv, float):
                typed[f] = float(d[f])
            else:
                typed[f] = d[f]
        return PoolConfig(**typed)

    async def list_pools(self) -> list[str]:
        return sorted(_s(p) for p in await self.redis.smembers(self.keys.pools))

    async def delete_pool(self, name: str) -> str:
        return _s(await self._run("delete_pool", name))

    # ---- sessions ------------------------------------------------------------------
    async def create_session(self, session_id: str, user: str, pool: str, profile: dict[str, Any],
                             now_ms: int) -> CreateResult | str:
        """Seat, queue or return the user's existing session; a str result is an error code."""
        res = await self._run("create_session", session_id, user, pool, json.dumps(profile), now_ms)
        status = _s(res[0])
        if status in ("unknown_pool", "queue_full"):
            return status
        sid = _s(res[1])
        # LPOS is 0-based for 'existing'; RPUSH's length is already the 1-based position
        raw_pos = _s(res[2])
        pos = None if raw_pos == "" else int(raw_pos) + (1 if status == "existing" else 0)
        flat = res[3:]
        record = decode_session(dict(zip(flat[::2], flat[1::2], strict=True)), sid)
        if record is not None:
            record["queue_position"] = pos if record["state"] == SessionState.QUEUED else None
        return CreateResult(status, sid, pos, record)

    async def end_session(self, session_id: str, reason: str, now_ms: int) -> tuple[str, list[str]]:
        """End a session (idempotent); returns (status, ids seated from the queue as a result)."""
        res = await self._run("end_session", session_id, reason, now_ms)
        return _s(res[0]), [_s(x) for x in res[1:]]

    async def set_session_state(self, session_id: str, host_id: str, state: str, now_ms: int) -> str:
        return _s(await self._run("session_state", session_id, host_id, state, now_ms))

    async def touch(self, session_id: str, last_active_ms: int) -> bool:
        return bool(await self._run("touch_session", session_id, last_active_ms))

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        return decode_session(await self.redis.hgetall(self.keys.session(session_id)), session_id)

    async def get_sessions(self, ids: list[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.hgetall(self.keys.session(sid))
            raws = await pipe.execute()
        return [s for sid, raw in zip(ids, raws, strict=True) if (s := decode_session(raw, sid))]

    async def live_session_ids(self) -> list[str]:
        return sorted(_s(x) for x in await self.redis.smembers(self.keys.live))

    async def queue_position(self, pool: str, session_id: str) -> int | None:
        pos = await self.redis.lpos(self.keys.pool_queue(pool), session_id)
        return None if pos is None else int(pos) + 1

    async def queue_length(self, pool: str) -> int:
        return int(await self.redis.llen(self.keys.pool_queue(pool)))

    async def queue_ids(self, pool: str) -> list[str]:
        return [_s(x) for x in await self.redis.lrange(self.keys.pool_queue(pool), 0, -1)]

    # ---- hosts ---------------------------------------------------------------------
    async def register_host(self, host_id: str, pool: str, address: str, gpus: list[Gpu], now_ms: int,
                            lease_ttl_ms: int, version: str = "") -> tuple[str, list[str]]:
        gpus_json = json.dumps([g.__dict__ for g in gpus])
        res = await self._run("register_host", host_id, pool, address, gpus_json, now_ms, lease_ttl_ms, version)
        return _s(res[0]), [_s(x) for x in res[1:]]

    async def heartbeat(self, host_id: str, now_ms: int, lease_ttl_ms: int,
                        telemetry: dict[str, Any]) -> tuple[str, list[str]]:
        res = await self._run("heartbeat", host_id, now_ms, lease_ttl_ms, json.dumps(telemetry))
        return _s(res[0]), [_s(x) for x in res[1:]]

    async def host_down(self, host_id: str, now_ms: int) -> tuple[str, list[str]]:
        res = await self._run("host_down", host_id, now_ms, DOWN_HOST_TTL_S)
        return _s(res[0]), [_s(x) for x in res[1:]]

    async def set_host_state(self, host_id: str, state: HostState, now_ms: int) -> tuple[str, list[str]]:
        res = await self._run("host_state", host_id, state.value, now_ms)
        return _s(res[0]), [_s(x) for x in res[1:]]

    async def remove_host(self, host_id: str, force: bool, reason: str, now_ms: int,
                          retire: bool = False) -> tuple[str, list[str]]:
        """Deregister a host; with ``retire`` its id is refused for ``RETIRED_HOST_TTL_S`` (status ``retired``)."""
        res = await self._run("remove_host", host_id, "1" if force else "0", reason, now_ms,
                              RETIRED_HOST_TTL_S if retire else 0)
        return _s(res[0]), [_s(x) for x in res[1:]]

    async def unretire(self, host_ids: list[str]) -> None:
        """Accept these ids again (a provider starts new hosts under them, e.g. a StatefulSet ordinal)."""
        if host_ids:
            await self.redis.delete(*(self.keys.host_retired(h) for h in host_ids))

    async def host_ids(self, pool: str | None = None) -> list[str]:
        key = self.keys.pool_hosts(pool) if pool else self.keys.hosts
        return sorted(_s(x) for x in await self.redis.smembers(key))

    async def get_hosts(self, ids: list[str]) -> list[dict[str, Any]]:
        """Host records with lease liveness, GPUs, used seats and sessions."""
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for h in ids:
                pipe.hgetall(self.keys.host(h))
                pipe.pttl(self.keys.host_lease(h))
                pipe.smembers(self.keys.host_sessions(h))
            raw = await pipe.execute()
        out = []
        for i, h in enumerate(ids):
            rec, ttl, sessions = raw[3 * i], raw[3 * i + 1], raw[3 * i + 2]
            if not rec:
                continue
            d = {_s(k): _s(v) for k, v in rec.items()}
            gpus = json.loads(d.get("gpus", "[]"))
            for g in gpus:
                g["used"] = int(d.get(f"u:{g['index']}", 0))
            state = d.get("state", HostState.DOWN.value)
            out.append({
                "id": h, "pool": d.get("pool"), "address": d.get("address"), "state": state,
                "lease_ttl_ms": max(int(ttl), 0), "alive": int(ttl) > 0,
                "registered_ms": int(float(d.get("registered_ms", 0))),
                "heartbeat_ms": int(float(d.get("heartbeat_ms", 0))),
                "version": d.get("version", ""), "gpus": gpus,
                "telemetry": json.loads(d["telemetry"]) if d.get("telemetry") else None,
                "sessions": sorted(_s(s) for s in sessions),
            })
        return out

    async def host_loads(self, pool: PoolConfig) -> list[HostLoad]:
        """The pool's hosts as placement inputs (a down or lease-less host counts as down)."""
        return [host_load(h, pool) for h in await self.get_hosts(await self.host_ids(pool.name))]

    async def pool_summary(self, pool: PoolConfig) -> dict[str, Any]:
        """Live seats used/free/total, queue length and sessions by state for one pool."""
        hosts = await self.get_hosts(await self.host_ids(pool.name))
        loads = [host_load(h, pool) for h in hosts]
        up = [h for h in loads if h.state == HostState.UP]
        by_state = {s.value: 0 for s in SessionState if s != SessionState.ENDED}
        ids = [sid for h in hosts for sid in h["sessions"]]
        queue = await self.queue_ids(pool.name)
        for s in await self.get_sessions(ids + queue):
            if s["state"] in by_state:
                by_state[s["state"]] += 1
        return {
            "seats_total": sum(h.seats for h in up),
            "seats_used": sum(h.used for h in loads if h.state != HostState.DOWN),
            "seats_free": sum(h.free for h in up),
            "queue_length": len(queue),
            "hosts": {st.value: sum(1 for h in loads if h.state == st) for st in HostState},
            "sessions": by_state,
        }

    # ---- outbox (live -> SQL) --------------------------------------------------------
    async def outbox_take(self, limit: int = 100) -> list[bytes]:
        """Move up to ``limit`` records to the processing list and return them (one round trip)."""
        n = min(limit, int(await self.redis.llen(self.keys.outbox)))
        if n == 0:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for _ in range(n):
                pipe.lmove(self.keys.outbox, self.keys.outbox_processing, "LEFT", "RIGHT")
            moved = await pipe.execute()
        return [rec for rec in moved if rec is not None]

    async def outbox_done(self, records: list[bytes]) -> None:
        if not records:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for rec in records:
                pipe.lrem(self.keys.outbox_processing, 1, rec)
            await pipe.execute()

    async def outbox_orphans(self) -> list[bytes]:
        """Records stuck in processing (a replica died mid-write); callers re-write them idempotently."""
        return list(await self.redis.lrange(self.keys.outbox_processing, 0, 99))

    async def try_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        """A TTL'd leader lock for once-per-cluster work; re-entrant for the same owner."""
        key = self.keys.lock(name)
        if await self.redis.set(key, owner, nx=True, px=ttl_ms):
            return True
        cur = await self.redis.get(key)
        if cur is not None and _s(cur) == owner:
            await self.redis.pexpire(key, ttl_ms)
            return True
        return False
