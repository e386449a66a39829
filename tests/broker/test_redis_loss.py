"""Redis lost without losing a session: real redis-server processes frozen (SIGSTOP), killed and
restarted with their data, and restarted empty, under a broker app on that private Redis.

- An outage longer than the host lease: hosts whose nodes heartbeat again after it keep their
  sessions (a lease of grace); a host whose node never comes back still goes down a lease later.
- A frozen Redis answers requests with a 503 problem body within ``redis_timeout_s``.
- Redis back empty: /readyz says not ready, a node cannot re-register into a missing pool (503,
  not 404), the reaper restores pools from SQL without a restart, the node re-registers with the
  session it still streams and the broker re-adopts it (user, pool, state, host, GPU); the queued
  session nobody can claim is ended ``state_lost`` in SQL a lease later, never silently gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from broker.embedded import EmbeddedRedis, free_port
from broker.keys_app import BROKER
from tests.conftest import ADMIN, NODE, auth, gpu, node_auth, user_token

LEASE_S = 2.0


async def _register(client, host: str, pool: str = "p1", sessions: list[dict[str, Any]] | None = None,  # type: ignore[no-untyped-def]
                    token: str = NODE) -> Any:
    body: dict[str, Any] = {"id": host, "pool": pool, "address": f"{host}:7000", "gpus": [gpu(0)]}
    if sessions is not None:
        body["sessions"] = sessions
    return await client.post("/api/v1/hosts", json=body, headers=auth(token))


async def _pool(client, name: str = "p1", seats: int = 1) -> None:  # type: ignore[no-untyped-def]
    r = await client.put(f"/api/v1/pools/{name}", json={"strategy": "breadth-first", "max_sessions_per_gpu": seats,
                                                        "vram_per_session_mb": 4096}, headers=auth(ADMIN))
    assert r.status in (200, 201), await r.text()


async def _session(client, user: str) -> tuple[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    tok = await user_token(client, user)
    r = await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert r.status == 201, await r.text()
    return tok, await r.json()


async def _running(client, host: str, sid: str) -> None:  # type: ignore[no-untyped-def]
    r = await client.put(f"/api/v1/hosts/{host}/sessions/{sid}/state", json={"state": "running"},
                         headers=node_auth(host))
    assert r.status == 200, await r.text()


async def _node(client, host: str, sids: list[str], stop: asyncio.Event,  # type: ignore[no-untyped-def]
                awake: asyncio.Event | None = None) -> None:
    """A node's heartbeat loop: every 0.5 s, 1 s after a failure; while ``awake`` is clear it waits
    (the agent's retry backoff, grown through the outage, puts its next heartbeat that far out)."""
    while not stop.is_set():
        if awake is not None:
            await awake.wait()
        try:
            r = await client.put(f"/api/v1/hosts/{host}/heartbeat", headers=node_auth(host),
                                 json={"sessions": [{"id": s, "state": "running"} for s in sids]})
            ok = r.status == 200
        except Exception:  # the broker is away too: retry like the agent does
            ok = False
        await asyncio.sleep(0.5 if ok else 1.0)


@pytest.mark.parametrize("outage", ["freeze", "restart_with_data"])
async def test_hosts_get_a_lease_of_grace_after_an_outage_longer_than_the_lease(
        aiohttp_client, settings_factory, tmp_path, outage: str) -> None:
    from broker.app import create_app

    redis = EmbeddedRedis(tmp_path / "r", persist=True, port=free_port())
    await redis.start()
    stop, awake = asyncio.Event(), asyncio.Event()
    nodes: list[asyncio.Task[None]] = []
    try:
        client = await aiohttp_client(create_app(settings_factory(
            redis_url=redis.url, host_lease_ttl_s=LEASE_S, reaper_interval_s=0.2, redis_timeout_s=0.5)))
        b = client.server.app[BROKER]
        await _pool(client)
        for h in ("p1-h0", "p1-h1"):
            assert (await _register(client, h)).status == 201
        tok_a, a = await _session(client, "alice")
        tok_b, bb = await _session(client, "bob")
        assert {a["host"], bb["host"]} == {"p1-h0", "p1-h1"}
        for s in (a, bb):
            await _running(client, s["host"], s["id"])
        live_host, dead_host = a["host"], bb["host"]
        awake.set()
        dead_stop = asyncio.Event()
        nodes += [asyncio.create_task(_node(client, live_host, [a["id"]], stop, awake)),
                  asyncio.create_task(_node(client, dead_host, [bb["id"]], dead_stop))]
        await asyncio.sleep(1.0)
        dead_stop.set()  # this node dies with the outage and never comes back

        assert redis.proc is not None
        awake.clear()
        if outage == "freeze":
            os.kill(redis.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(2 * LEASE_S)
            os.kill(redis.proc.pid, signal.SIGCONT)
        else:
            await redis.stop()  # SIGTERM: the append-only file keeps the data
            await asyncio.sleep(2 * LEASE_S)
            await redis.start()
        await nodes[1]
        # the node's next heartbeat comes 0.6 s after Redis returned: after the reaper's first passes
        # (every 0.2 s), which without grace find its lease long gone and end its session host_lost
        await asyncio.sleep(0.6)
        awake.set()

        # past one full lease after Redis returned: the heartbeating host kept its session ...
        await asyncio.sleep(LEASE_S + 0.5)
        got = await (await client.get(f"/api/v1/sessions/{a['id']}", headers=auth(tok_a))).json()
        assert got["state"] == "running" and got["host"] == live_host, got
        assert b.stats.lease_graces >= 1
        # ... and the host whose node never came back went down after its lease of grace
        deadline = time.monotonic() + 3 * LEASE_S
        while True:
            gone = await (await client.get(f"/api/v1/sessions/{bb['id']}", headers=auth(tok_b))).json()
            if gone["state"] == "ended" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert gone["state"] == "ended" and gone["end_reason"] == "host_lost", gone
    finally:
        stop.set()
        awake.set()
        await asyncio.wait_for(asyncio.gather(*nodes, return_exceptions=True), 5)
        await redis.stop()


async def test_a_frozen_redis_answers_503_within_the_configured_bound(aiohttp_client, settings_factory,
                                                                      tmp_path) -> None:
    from broker.app import create_app

    redis = EmbeddedRedis(tmp_path / "r", persist=False, port=free_port())
    await redis.start()
    try:
        settings = settings_factory(redis_url=redis.url)
        assert settings.redis_timeout_s == 1.0  # the default bound
        client = await aiohttp_client(create_app(settings))
        await _pool(client)
        tok = await user_token(client, "alice")
        assert redis.proc is not None
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            for path, method in (("/api/v1/sessions", "post"), ("/api/v1/pools/p1", "get")):
                t0 = time.monotonic()
                r = await getattr(client, method)(path, json={"pool": "p1"} if method == "post" else None,
                                                  headers=auth(tok))
                took = time.monotonic() - t0
                body = await r.json()
                assert r.status == 503 and body["code"] == "unavailable", body
                assert r.headers["Content-Type"].startswith("application/problem+json")
                assert took < settings.redis_timeout_s + 0.5, f"{method} {path} took {took:.2f} s"
            t0 = time.monotonic()
            ready = await client.get("/readyz")
            assert ready.status == 503 and time.monotonic() - t0 < settings.redis_timeout_s + 0.5
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
    finally:
        await redis.stop()


async def test_redis_back_empty_restores_pools_readopts_streaming_sessions_and_ends_the_rest(
        aiohttp_client, settings_factory, clock, tmp_path) -> None:
    from broker.app import create_app

    redis = EmbeddedRedis(tmp_path / "r", persist=False, port=free_port())
    await redis.start()
    try:
        client = await aiohttp_client(create_app(settings_factory(redis_url=redis.url, node_token_any_host=False),
                                                 clock=clock))
        b = client.server.app[BROKER]
        await _pool(client, seats=1)
        r = await _register(client, "p1-h0")
        assert r.status == 201
        cred = (await r.json())["node_credential"]["token"]
        tok_a, a = await _session(client, "alice")
        assert a["state"] == "starting" and a["host"] == "p1-h0"
        await _running(client, "p1-h0", a["id"])
        tok_q, q = await _session(client, "quinn")
        assert q["state"] == "queued"
        # no outbox pass yet: the queued session is in SQL already (nothing else could ever re-claim it);
        # alice's start is still only in Redis's outbox (her node would re-claim her)
        assert set(await b.repo.live_rows()) == {q["id"]}
        await b.drain_outbox()  # SQL now knows both (the outbox runs every 0.5 s in production)
        assert set(await b.repo.live_rows()) == {a["id"], q["id"]}
        epoch = b.epoch
        assert epoch is not None

        await redis.stop()
        await redis.start()  # same port, no data: everything live is gone

        ready = await client.get("/readyz")
        assert ready.status == 503 and (await ready.json())["checks"]["live_state"].startswith("lost"), \
            await ready.text()
        # a node re-registering before the reaper restored the pool is told to retry, not "no pool"
        r = await _register(client, "p1-h0", token=cred)
        assert r.status == 503, await r.text()
        hb = await client.put("/api/v1/hosts/p1-h0/heartbeat", json={"sessions": []}, headers=auth(cred))
        assert hb.status == 404 and (await hb.json())["reregister"] is True

        # the user polling the session meanwhile is told to retry (SQL has it live), not "no session"
        r = await client.get(f"/api/v1/sessions/{a['id']}", headers=auth(tok_a))
        assert r.status == 503, await r.text()

        await b.reap_once()  # the reaper's next pass notices and restores, no broker restart
        assert b.epoch != epoch and b.stats.recoveries == 1
        assert (await client.get("/readyz")).status == 200
        assert (await client.get("/api/v1/pools/p1", headers=auth(ADMIN))).status == 200

        # the node re-registers with its own credential (signed, not stored in Redis) and its session
        claim = {"id": a["id"], "user": "alice", "state": "running", "gpu": 0, "kind": "desktop",
                 "profile": a["profile"], "started_ms": clock() - 5000}
        forged = {**claim, "id": q["id"], "user": "mallory"}  # SQL knows q is quinn's: refused
        r = await _register(client, "p1-h0", sessions=[claim, forged], token=cred)
        assert r.status == 201, await r.text()
        reply = await r.json()
        assert reply["adopted"] == [a["id"]] and reply["stop"] == [q["id"]]
        got = await (await client.get(f"/api/v1/sessions/{a['id']}", headers=auth(tok_a))).json()
        assert (got["state"], got["user"], got["pool"], got["host"], got["gpu"]) == \
            ("running", "alice", "p1", "p1-h0", 0)
        assert got["created_ms"] == a["created_ms"]  # times from SQL, not the node
        pool = await (await client.get("/api/v1/pools/p1", headers=auth(ADMIN))).json()
        assert pool["seats_used"] == 1 and pool["sessions"]["running"] == 1
        hb = await client.put("/api/v1/hosts/p1-h0/heartbeat", json={"sessions": [{"id": a["id"],
                                                                                  "state": "running"}]},
                              headers=auth(cred))
        assert hb.status == 200 and (await hb.json())["stop"] == []
        # alice asking again gets her adopted session back, not a second one
        r = await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok_a))
        assert r.status == 200 and (await r.json())["id"] == a["id"]

        # within the window nothing is ended; a lease after the recovery the unclaimed queued one is
        await b.reap_once()
        assert await b.repo.get_history(q["id"]) is None
        clock.advance(int(LEASE_S * 1000) + 15_000)
        await b.reap_once()
        await b.drain_outbox()
        lost = await b.repo.get_history(q["id"])
        assert lost is not None and lost["end_reason"] == "state_lost" and lost["user"] == "quinn"
        assert set(await b.repo.live_rows()) == {a["id"]}
        got = await (await client.get(f"/api/v1/sessions/{q['id']}", headers=auth(tok_q))).json()
        assert got["state"] == "ended" and got["end_reason"] == "state_lost"
        got = await (await client.get(f"/api/v1/sessions/{a['id']}", headers=auth(tok_a))).json()
        assert got["state"] == "running"
        audit = await b.repo.audit_log(action="host.adopt")
        assert audit and audit[0]["detail"]["adopted"] == [a["id"]] and audit[0]["detail"]["stop"] == [q["id"]]
    finally:
        await redis.stop()


async def test_claims_sql_or_redis_contradict_are_stopped_and_bad_claims_name_their_field(
        aiohttp_client, settings_factory, clock) -> None:
    """Redis still has everything here: a node re-registering can keep what is its own, nothing more."""
    from broker.app import create_app

    client = await aiohttp_client(create_app(settings_factory(), clock=clock))
    b = client.server.app[BROKER]
    await _pool(client, seats=1)
    assert (await _register(client, "p1-h0")).status == 201
    assert (await _register(client, "p1-h1")).status == 201
    _tok, a = await _session(client, "alice")
    await _running(client, a["host"], a["id"])
    other = "p1-h1" if a["host"] == "p1-h0" else "p1-h0"
    tok_e, e = await _session(client, "erin")
    assert e["host"] == other
    r = await client.delete(f"/api/v1/sessions/{e['id']}", headers=auth(tok_e))
    assert r.status == 200
    await b.drain_outbox()  # SQL: erin's session ended

    def claim(sid: str, user: str, gpu_index: int = 0) -> dict[str, Any]:
        return {"id": sid, "user": user, "state": "running", "gpu": gpu_index}

    # alice's session on its own host is kept; on the other host, or ended (erin's), it is stopped;
    # one nobody knows needs a free seat on the GPU it names (the other host's only seat is free)
    ghost = "f" * 32
    r = await _register(client, a["host"], sessions=[claim(a["id"], "alice"), claim(e["id"], "erin")])
    assert r.status == 201, await r.text()
    assert (await r.json())["adopted"] == [a["id"]] and (await r.json())["stop"] == [e["id"]]
    r = await _register(client, other, sessions=[claim(a["id"], "alice"), claim(ghost, "gus", 3)])
    reply = await r.json()
    assert reply["adopted"] == [] and sorted(reply["stop"]) == sorted([a["id"], ghost])
    got = await b.live.get_session(a["id"])
    assert got is not None and got["host"] == a["host"] and got["state"] == "running"
    assert await b.live.get_session(ghost) is None

    for bad, field in (({"id": "../x", "user": "u", "state": "running", "gpu": 0}, "sessions[0].id"),
                       ({"id": ghost, "user": "a b", "state": "running", "gpu": 0}, "sessions[0].user"),
                       ({"id": ghost, "user": "u", "state": "ended", "gpu": 0}, "sessions[0].state"),
                       ({"id": ghost, "user": "u", "state": "running"}, "sessions[0].gpu")):
        r = await _register(client, other, sessions=[bad])
        body = await r.json()
        assert r.status == 422 and body["field"] == field, body


async def test_two_replicas_one_restores_the_other_joins_and_the_lost_are_ended_once(
        aiohttp_client, settings_factory, clock, tmp_path) -> None:
    from broker.app import create_app

    redis = EmbeddedRedis(tmp_path / "r", persist=False, port=free_port())
    await redis.start()
    try:
        settings = settings_factory(redis_url=redis.url)
        one = await aiohttp_client(create_app(settings, clock=clock))
        two = await aiohttp_client(create_app(settings, clock=clock))
        b1, b2 = one.server.app[BROKER], two.server.app[BROKER]
        assert b1.epoch == b2.epoch is not None  # the second joined the first's generation at start
        await _pool(one, seats=1)
        assert (await _register(one, "p1-h0")).status == 201
        _tok, a = await _session(two, "alice")
        await b1.drain_outbox()

        await redis.stop()
        await redis.start()
        await b1.reap_once()
        ready = await two.get("/readyz")
        assert ready.status == 503 and (await ready.json())["checks"]["live_state"] == "new generation: joining"
        await b2.reap_once()
        assert b2.epoch == b1.epoch and (await two.get("/readyz")).status == 200
        assert (await two.get("/api/v1/pools/p1", headers=auth(ADMIN))).status == 200

        clock.advance(15_001)  # the recovery's window (one default lease): nobody re-claimed alice's
        await b2.reap_once()
        await b1.reap_once()
        assert b1.stats.sessions_lost + b2.stats.sessions_lost == 1
        hist = await b1.repo.get_history(a["id"])
        assert hist is not None and hist["end_reason"] == "state_lost"
        ends = await b1.repo.audit_log(action="session.end")
        assert [x["target"] for x in ends] == [a["id"]]
    finally:
        await redis.stop()
