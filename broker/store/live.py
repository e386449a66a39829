"""Repository of live state in Redis: pools, hosts, seats, sessions, queues, deadlines.

Every change that touches more than one key runs as one Lua script (see
``lua/``), so any number of broker replicas sharing a Redis never over-seat a
GPU, seat a session twice or leak a seat.  Losing a race is a normal result
(``already_ended``, ``alive``), not an error.

Work follows change, not fleet size: the same Lua steps keep per-pool indexes
(a sorted set of hosts with a free seat, ordered for the pool's strategy, and
counters) and sorted sets of deadlines (host leases, session timeouts,
max-duration warnings, down-host purges).  A seating reads the head of its
pool's index; a heartbeat is one step over its own host's sessions; the reaper
takes only what is due (``expire_hosts``, ``claim_due_sessions``); a pool
summary reads counters.  ``ensure_indexes`` builds the indexes once from the
records (an upgrade) and ``reindex_pool`` rebuilds one pool (a repair).

Losing Redis: ``reaper_pass`` renews every live lease after a gap in reaper
passes (an outage), ``get_epoch``/``claim_epoch`` tell a Redis that lost its
state from one that did not, and ``adopt_sessions`` rebuilds the sessions a
re-registering node still streams (``broker.service`` drives all three).

Concurrency: one ``redis.asyncio.Redis`` connection pool per process, shared by
all handlers and loops.  Scripts are loaded by SHA and re-sent on NOSCRIPT
(redis-py's ``Script`` does this), so a Redis restart is survived.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from broker.lifecycle import CLOSE_GRACE_DEFAULT_S, START_TIMEOUT_MS
from broker.models import Gpu, PoolConfig
from broker.placement import GpuLoad, HostLoad, gpu_seats
from broker.protocol import HostState, SessionState
from broker.store.keys import (
    CONTROL_TTL_MS,
    DOWN_HOST_TTL_S,
    ENDED_SESSION_TTL_S,
    INDEX_VERSION,
    QUEUE_WAIT_BUCKETS_S,
    REAPER_PASS_TTL_S,
    RETIRED_HOST_TTL_S,
    SHARE_VIEWER_TTL_MS,
    VIEWER_TAB_TTL_MS,
    Keys,
)

SCRIPT_NAMES = (
    "create_session", "end_session", "session_state", "touch_session", "register_host", "heartbeat",
    "host_down", "host_state", "remove_host", "put_pool", "delete_pool", "expire_hosts", "purge_hosts",
    "claim_sessions", "reschedule", "take_warning", "reindex_pool", "set_rollout", "reaper_pass", "adopt_sessions",
    "viewer_tab", "leave_session", "share",
)

_INT_FIELDS = ("created_ms", "seated_ms", "started_ms", "last_active_ms", "disconnected_ms", "ended_ms", "state_ms",
               "warned_ms", "left_ms")
_START_FIELDS = ("id", "user", "pool", "kind", "gpu", "profile")  # heartbeat.lua's start records


def _load_scripts() -> dict[str, str]:
    base = resources.files("broker.store") / "lua"
    # constants whose home is Python, so Lua and Python cannot drift apart
    header = (f"local ENDED_TTL_S = {ENDED_SESSION_TTL_S}\n"
              f"local START_TIMEOUT_MS = {START_TIMEOUT_MS}\n"
              f"local REAPER_PASS_TTL_S = {REAPER_PASS_TTL_S}\n"
              f"local CLOSE_GRACE_DEFAULT_S = {CLOSE_GRACE_DEFAULT_S}\n"
              f"local QUEUE_WAIT_BUCKETS_MS = {{{', '.join(str(round(b * 1000)) for b in QUEUE_WAIT_BUCKETS_S)}}}\n")
    prelude = header + (base / "prelude.lua").read_text()
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
class HeartbeatResult:
    """What one heartbeat step did: ``status`` ok | unknown | retired."""

    status: str
    host_state: str = ""  # up | draining, as the step found the host (ok only)
    stop: list[str] = field(default_factory=list)  # sessions the node runs that the broker does not
    ended: list[str] = field(default_factory=list)  # sessions the node dropped: ended node_ended
    start: list[dict[str, Any]] = field(default_factory=list)  # sessions still starting (to send again)


@dataclass(frozen=True)
class QueueWaits:
    """A pool's queue wait histogram: seatings per bucket of ``QUEUE_WAIT_BUCKETS_S`` (not cumulative; the
    last entry counts the waits over the last bound) and the waits' sum in ms."""

    counts: tuple[int, ...]
    sum_ms: int


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

    async def set_rollout(self, pool: str, version: str, share_pct: int) -> str:
        """Start/change (``version`` non-empty) or stop a pool's canary split; ok | unknown_pool.

        While it stands, each seating prefers the candidate class by the pool's counter (see
        ``create_session.lua``) and the Lua steps keep ``avail:c``/``avail:s`` equal to a split of avail.
        """
        return _s(await self._run("set_rollout", pool, version, share_pct))

    async def rollout_split(self, pool: str) -> dict[str, Any] | None:
        """The pool's rollout as Redis holds it: version, share_pct, seatings counted (None = none)."""
        raw = await self.redis.hgetall(self.keys.pool_rollout(pool))
        if not raw:
            return None
        d = {_s(k): _s(v) for k, v in raw.items()}
        return {"version": d.get("version", ""), "share_pct": int(float(d.get("share_pct") or 0)),
                "seatings": int(d.get("n") or 0)}

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

    async def user_session_ids(self, user: str, pool: str | None = None) -> list[str]:
        """A user's live session ids (in one pool, or in every pool): reads the user's own sets, not P:live."""
        pools = [pool] if pool else await self.list_pools()
        if not pools:
            return []
        keys = [self.keys.user_sessions(user, p) for p in pools]
        members = await (self.redis.smembers(keys[0]) if len(keys) == 1 else self.redis.sunion(keys))
        return sorted(_s(x) for x in members)

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

    async def adopt_sessions(self, host_id: str, now_ms: int, claims: list[dict[str, Any]]) -> dict[str, str]:
        """Re-adopt sessions a re-registering node still runs (see ``lua/adopt_sessions.lua``).

        Each claim: id, user, pool, kind, gpu, profile (dict or None), state, created_ms, seated_ms,
        started_ms (0: unknown).  Returns session id -> adopted | kept | stop.
        """
        if not claims:
            return {}
        args: list[Any] = [host_id, now_ms, len(claims)]
        for c in claims:
            args += [c["id"], c["user"], c["pool"], c.get("kind") or "", int(c["gpu"]),
                     json.dumps(c["profile"]) if c.get("profile") else "", c["state"],
                     int(c.get("created_ms") or 0), int(c.get("seated_ms") or 0), int(c.get("started_ms") or 0)]
        res = [_s(x) for x in await self._run("adopt_sessions", *args)]
        return dict(zip(res[::2], res[1::2], strict=True))

    # ---- epoch (live-state generation) ---------------------------------------------------
    async def get_epoch(self) -> str | None:
        """This Redis's live-state generation; None when the state was lost (or never initialised)."""
        v = await self.redis.get(self.keys.epoch)
        return None if v is None else _s(v)

    async def claim_epoch(self, candidate: str) -> str:
        """Write ``candidate`` as the epoch unless one exists; returns the epoch now in force."""
        await self.redis.set(self.keys.epoch, candidate, nx=True)
        return await self.get_epoch() or candidate

    async def heartbeat(self, host_id: str, now_ms: int, lease_ttl_ms: int,
                        telemetry: dict[str, Any]) -> HeartbeatResult:
        """Renew the lease from ``now_ms`` (the arrival), store ``telemetry`` and reconcile its sessions.

        ``telemetry`` is the validated heartbeat body; its ``sessions`` entries (id, state,
        last_input_ms) are what the node runs.  One Lua step, one round trip.
        """
        args: list[Any] = [host_id, now_ms, lease_ttl_ms, json.dumps(telemetry, separators=(",", ":")),
                           len(telemetry.get("sessions", ()))]
        for rep in telemetry.get("sessions", ()):
            last = rep.get("last_input_ms")
            args += [rep["id"], rep.get("state") or "", "" if not last else int(last)]
        res = await self._run("heartbeat", *args)
        status = _s(res[0])
        if status != "ok":
            return HeartbeatResult(status)
        i = 2
        lists: list[list[str]] = []
        for _ in range(2):
            n = int(res[i])
            lists.append([_s(x) for x in res[i + 1:i + 1 + n]])
            i += 1 + n
        n = int(res[i])
        flat = [_s(x) for x in res[i + 1:]]
        start = []
        width = len(_START_FIELDS)
        for k in range(n):
            rec = dict(zip(_START_FIELDS, flat[k * width:(k + 1) * width], strict=True))
            start.append({**rec, "gpu": int(rec["gpu"]) if rec["gpu"] else None,
                          "kind": rec["kind"] or None,
                          "profile": json.loads(rec["profile"]) if rec["profile"] else None})
        return HeartbeatResult(status, _s(res[1]), lists[0], lists[1], start)

    async def host_down(self, host_id: str, now_ms: int) -> tuple[str, list[str]]:
        """Mark one host down if its lease is due at ``now_ms`` (status down | alive | already | not_found)."""
        res = await self._run("host_down", host_id, now_ms, DOWN_HOST_TTL_S)
        return _s(res[0]), [_s(x) for x in res[1:]]

    # ---- deadlines (the reaper's inputs; each call reads only what is due) ------------------
    async def reaper_pass(self, now_ms: int, gap_ms: int, lease_ttl_ms: int) -> tuple[int, int]:
        """Stamp this reaper pass; after a gap over ``gap_ms`` (nobody reached Redis), give every lease
        that was alive at the previous pass a full one from ``now_ms``.  Returns (gap ms or -1, hosts granted)."""
        res = await self._run("reaper_pass", now_ms, gap_ms, lease_ttl_ms)
        return int(res[0]), int(res[1])

    async def expire_hosts(self, now_ms: int, limit: int) -> list[tuple[str, list[str]]]:
        """Mark down up to ``limit`` hosts whose lease is due; returns (host, ended session ids) each."""
        res = await self._run("expire_hosts", now_ms, limit, DOWN_HOST_TTL_S)
        out = []
        i = 1
        for _ in range(int(res[0])):
            host, n = _s(res[i]), int(res[i + 1])
            out.append((host, [_s(x) for x in res[i + 2:i + 2 + n]]))
            i += 2 + n
        return out

    async def lease_due_count(self, now_ms: int) -> int:
        """How many host leases are due at ``now_ms`` (not yet expired by a reaper)."""
        return int(await self.redis.zcount(self.keys.due_leases, "-inf", now_ms))

    async def lease_count(self) -> int:
        """How many hosts hold a lease (up or draining, not yet expired)."""
        return int(await self.redis.zcard(self.keys.due_leases))

    async def purge_hosts(self, now_ms: int, limit: int) -> list[str]:
        """Drop the records of hosts down for ``DOWN_HOST_TTL_S``; returns their ids."""
        return [_s(x) for x in await self._run("purge_hosts", now_ms, limit)]

    async def claim_due_sessions(self, now_ms: int, limit: int, claim_ms: int) -> list[str]:
        """Claim up to ``limit`` sessions whose timeout deadline is due (another replica will not take them
        for ``claim_ms``); the caller ends each or calls ``reschedule``."""
        return [_s(x) for x in await self._run("claim_sessions", now_ms, limit, claim_ms)]

    async def reschedule(self, session_ids: list[str], now_ms: int) -> int:
        """Recompute deadlines from the records; returns how many had to be clamped ahead of ``now_ms``."""
        if not session_ids:
            return 0
        return int(await self._run("reschedule", now_ms, *session_ids))

    async def warn_candidates(self, until_ms: int, limit: int) -> list[str]:
        """Seated, not yet warned sessions whose max-duration end is at or before ``until_ms``."""
        return [_s(x) for x in await self.redis.zrangebyscore(self.keys.due_warn, "-inf", until_ms, 0, limit)]

    async def take_warning(self, session_id: str, now_ms: int) -> bool:
        """True for exactly one caller: the one that should send this session's max-duration warning."""
        return bool(await self._run("take_warning", session_id, now_ms))

    async def claim_tab(self, session_id: str, tab: str, socket: str, *, take: bool) -> tuple[bool, str]:
        """Hold the session's viewer for ``tab``'s ``socket`` (``lua/viewer_tab.lua``): (held, previous/other tab).

        ``take``: whoever holds it (the user chose "continue here"); else only when free or this tab's.
        """
        res = await self._run("viewer_tab", session_id, "take" if take else "claim", tab, socket, VIEWER_TAB_TTL_MS)
        return bool(int(res[0])), _s(res[1])

    async def keep_tab(self, session_id: str, tab: str, socket: str) -> bool:
        """Renew the socket's hold; False when another socket took the session (or the hold lapsed)."""
        return bool(await self._run("viewer_tab", session_id, "keep", tab, socket, VIEWER_TAB_TTL_MS))

    async def release_tab(self, session_id: str, tab: str, socket: str) -> bool:
        """Drop the socket's hold; False when it is not (or no longer) this socket's."""
        return bool(await self._run("viewer_tab", session_id, "release", tab, socket, VIEWER_TAB_TTL_MS))

    async def leave_session(self, session_id: str, tab: str, now_ms: int) -> int:
        """Mark the session left by its viewer's tab (``lua/leave_session.lua``): 1 marked, 0 not seated,
        -1 another tab holds the viewer."""
        return int(await self._run("leave_session", session_id, tab, now_ms))

    # ---- share links (lua/share.lua); times are wall-clock ms, as token expiries are ----
    async def create_share(self, session_id: str, share_id: str, record: dict[str, Any], ttl_ms: int,
                           now_ms: int, max_shares: int) -> str:
        """Add a share link: "ok", "not_live" (no such live session) or "too_many"."""
        return _s(await self._run("share", "create", session_id, share_id, json.dumps(record), ttl_ms, now_ms,
                                  max_shares))

    async def revoke_shares(self, session_id: str, share_id: str | None,
                            now_ms: int) -> tuple[str, list[str], list[str]]:
        """Revoke one link (or every link when ``share_id`` is None): (status, share ids revoked, viewers
        removed as "<share> <viewer>"); status "not_found" for a named link that never lived."""
        res = await self._run("share", "revoke", session_id, share_id or "", now_ms)
        return _s(res[0]), [_s(x) for x in res[1]], [_s(x) for x in res[2]]

    async def shares(self, session_id: str, now_ms: int) -> dict[str, dict[str, Any]]:
        """The session's live links (share id -> record) with ``viewers``: how many are connected now."""
        raw = await self.redis.hgetall(self.keys.session_shares(session_id))
        holds = await self.redis.zrangebyscore(self.keys.session_viewers(session_id), now_ms, "+inf")
        out: dict[str, dict[str, Any]] = {}
        for k, v in raw.items():
            rec = json.loads(v)
            if int(rec.get("expires_at", 0)) * 1000 > now_ms:
                out[_s(k)] = {**rec, "viewers": 0, "viewer_ids": []}
        for member in holds:
            share, _, viewer = _s(member).partition(" ")
            if share in out:
                out[share]["viewers"] += 1
                out[share]["viewer_ids"].append(viewer)
        return out

    async def set_control(self, session_id: str, viewer_id: str | None, now_ms: int) -> tuple[str, str | None]:
        """Hand control to share viewer ``viewer_id`` (None: take it back): (status "ok" or "not_viewer",
        the previous controller as "<share> <viewer>" or None)."""
        res = await self._run("share", "control", session_id, viewer_id or "", CONTROL_TTL_MS, now_ms)
        return _s(res[0]), (_s(res[1]) or None)

    async def controller(self, session_id: str) -> str | None:
        """The share viewer in control of the session ("<share> <viewer>"), or None."""
        raw = await self.redis.get(self.keys.session_control(session_id))
        return _s(raw) if raw else None

    async def share_revoked(self, share_id: str) -> bool:
        return bool(await self.redis.exists(self.keys.share_revoked(share_id)))

    async def join_share(self, session_id: str, share_id: str, viewer_id: str, now_ms: int) -> str:
        """Hold a viewer's place: "ok", "revoked" or "not_seated" (one step with revocation: no viewer
        joins a link after its revocation took effect)."""
        return _s(await self._run("share", "join", session_id, share_id, viewer_id, SHARE_VIEWER_TTL_MS, now_ms))

    async def keep_share(self, session_id: str, share_id: str, viewer_id: str, now_ms: int) -> bool:
        return bool(await self._run("share", "keep", session_id, share_id, viewer_id, SHARE_VIEWER_TTL_MS, now_ms))

    async def leave_share(self, session_id: str, share_id: str, viewer_id: str) -> bool:
        return bool(await self._run("share", "leave", session_id, share_id, viewer_id))

    async def reindex_pool(self, pool: str, now_ms: int) -> tuple[int, int]:
        """Rebuild one pool's placement index, counters and deadlines; returns (hosts, sessions) indexed."""
        res = await self._run("reindex_pool", pool, now_ms)
        return int(res[0]), int(res[1])

    async def ensure_indexes(self, now_ms: int, owner: str) -> bool:
        """Build every pool's indexes from the records once per ``INDEX_VERSION`` (an upgrade); True if built."""
        cur = await self.redis.get(self.keys.index_version)
        if cur is not None and _s(cur) == INDEX_VERSION:
            return False
        if not await self.try_lock("reindex", owner, 60_000):
            return False  # another replica is building them
        # down hosts an older broker left: dropped when their record would have expired
        ids = await self.host_ids()
        async with self.redis.pipeline(transaction=False) as pipe:
            for h in ids:
                pipe.hget(self.keys.host(h), "state")
                pipe.pttl(self.keys.host(h))
            raw = await pipe.execute()
        for i, h in enumerate(ids):
            state, ttl = raw[2 * i], int(raw[2 * i + 1])
            if state is None:
                await self.redis.srem(self.keys.hosts, h)
            elif _s(state) == HostState.DOWN and ttl > 0:
                await self.redis.zadd(self.keys.due_purge, {h: now_ms + ttl}, nx=True)
        for pool in await self.list_pools():
            await self.reindex_pool(pool, now_ms)
        await self.redis.set(self.keys.index_version, INDEX_VERSION)
        await self.redis.delete(self.keys.lock("reindex"))
        return True

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
        """Live seats used/free/total, queue length, hosts and sessions by state, staged sessions for one pool.

        Reads of counters the Lua steps keep (``P:pool:{pool}:stats``), whatever the pool's size.
        Down hosts count until their record is dropped (``DOWN_HOST_TTL_S``).
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.pool_stats(pool.name))
            pipe.llen(self.keys.pool_queue(pool.name))
            pipe.zcard(self.keys.pool_staged(pool.name))
            pipe.zcount(self.keys.pool_staged(pool.name), 0, 0)
            raw, qlen, staged, ready = await pipe.execute()
        c = {_s(k): max(0, int(v)) for k, v in raw.items()}
        return {
            "seats_total": c.get("seats_total", 0),
            "seats_used": c.get("seats_used", 0),
            "seats_free": c.get("seats_free", 0),
            "queue_length": int(qlen),
            "hosts": {st.value: c.get(f"hosts_{st.value}", 0) for st in HostState},
            "sessions": {s.value: c.get(f"s_{s.value}", 0) for s in SessionState if s != SessionState.ENDED},
            # warm sessions for the next users (the pool's ``staged`` setting; each holds a seat in seats_used)
            "staged_sessions": {"target": pool.staged, "ready": int(ready), "starting": int(staged) - int(ready)},
        }

    async def queue_waits(self, pools: list[str]) -> dict[str, QueueWaits]:
        """Each pool's queue wait histogram as the seating steps counted it (``P:pool:{pool}:waits``)."""
        if not pools:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in pools:
                pipe.hgetall(self.keys.pool_waits(name))
            raw = await pipe.execute()
        out = {}
        for name, rec in zip(pools, raw, strict=True):
            d = {_s(k): int(v) for k, v in rec.items()}
            out[name] = QueueWaits(tuple(d.get(f"b{i}", 0) for i in range(1, len(QUEUE_WAIT_BUCKETS_S) + 2)),
                                   d.get("sum_ms", 0))
        return out

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
