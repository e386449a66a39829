"""Timeouts, drain, host loss, limits, events and observability on a real Redis + SQL broker."""

from __future__ import annotations

import asyncio
import json

from broker.keys_app import BROKER, HUB
from tests.conftest import ADMIN, NODE, auth, setup_pool, user_token


async def new_session(api, user: str, pool: str = "p1") -> tuple[str, dict]:
    tok = await user_token(api, user)
    r = await api.post("/api/v1/sessions", json={"pool": pool}, headers=auth(tok))
    assert r.status in (200, 201), await r.text()
    return tok, await r.json()


async def state_of(api, tok: str, sid: str) -> dict:
    return await (await api.get(f"/api/v1/sessions/{sid}", headers=auth(tok))).json()


async def test_timeouts_end_sessions_through_the_reaper(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=1, queue_timeout_s=30, idle_timeout_s=600,
                     disconnect_timeout_s=60, max_duration_s=7200)
    b = api.app[BROKER]
    t1, s1 = await new_session(api, "u1")
    t2, s2 = await new_session(api, "u2")
    assert s2["state"] == "queued"
    await api.put(f"/api/v1/hosts/p1-h0/sessions/{s1['id']}/state", json={"state": "running"}, headers=auth(NODE))
    clock.advance(29_000)
    assert await b.reap_once() == []
    clock.advance(1_000)
    assert await b.reap_once() == [(s2["id"], "queue_timeout")]
    # the viewer goes away: disconnected, then ended after disconnect_timeout_s
    await api.put(f"/api/v1/hosts/p1-h0/sessions/{s1['id']}/state", json={"state": "disconnected"},
                  headers=auth(NODE))
    clock.advance(59_999)
    assert await b.reap_once() == []
    clock.advance(1)
    assert await b.reap_once() == [(s1["id"], "disconnect_timeout")]
    got = await state_of(api, t1, s1["id"])
    assert got["state"] == "ended" and got["end_reason"] == "disconnect_timeout"
    pool = await (await api.get("/api/v1/pools/p1", headers=auth(ADMIN))).json()
    assert pool["seats_used"] == 0 and pool["queue_length"] == 0


async def test_idle_timeout_counts_from_last_input(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, idle_timeout_s=300)
    b = api.app[BROKER]
    tok, s = await new_session(api, "u1")
    await api.put(f"/api/v1/hosts/p1-h0/sessions/{s['id']}/state", json={"state": "running"}, headers=auth(NODE))
    clock.advance(200_000)
    hb = {"sessions": [{"id": s["id"], "state": "running", "last_input_ms": clock.now_ms}]}
    assert (await api.put("/api/v1/hosts/p1-h0/heartbeat", json=hb, headers=auth(NODE))).status == 200
    clock.advance(299_999)
    assert await b.reap_once() == []
    clock.advance(1)
    assert await b.reap_once() == [(s["id"], "idle_timeout")]


async def test_host_lost_frees_seats_and_seats_queue_elsewhere(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=1)
    b = api.app[BROKER]
    sessions = [await new_session(api, f"u{i}") for i in range(3)]
    hosts = {s["host"] for _, s in sessions[:2]}
    assert hosts == {"p1-h0", "p1-h1"} and sessions[2][1]["state"] == "queued"
    lost = sessions[0][1]
    kept = sessions[1][1]["host"]
    clock.advance(b.settings.lease_ttl_ms - 1_000)
    assert (await api.put(f"/api/v1/hosts/{kept}/heartbeat", json={}, headers=auth(NODE))).status == 200
    clock.advance(1_000)
    await b.live.redis.delete(b.live.keys.host_lease(lost["host"]))  # the lease runs out (Redis's clock)
    ended = await b.reap_once()
    assert ended == [(lost["id"], "host_lost")]
    host = await (await api.get(f"/api/v1/hosts/{lost['host']}", headers=auth(ADMIN))).json()
    assert host["state"] == "down" and host["sessions"] == []
    # the queued session cannot go to the down host; the heartbeat of a down host asks it to re-register
    assert (await state_of(api, sessions[2][0], sessions[2][1]["id"]))["state"] == "queued"
    r = await api.put(f"/api/v1/hosts/{lost['host']}/heartbeat", json={}, headers=auth(NODE))
    assert r.status == 404 and (await r.json())["reregister"]
    # the node comes back and registers again: the queue head is seated there
    r = await api.post("/api/v1/hosts", json={"id": lost["host"], "pool": "p1", "address": "x:1", "gpus": [
        {"index": 0, "vram_mb": 24576}]}, headers=auth(NODE))
    assert r.status == 201
    got = await state_of(api, sessions[2][0], sessions[2][1]["id"])
    assert got["state"] == "starting" and got["host"] == lost["host"]


async def test_drain_stops_new_sessions_but_reconnect_still_works(api) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=2)
    t1, s1 = await new_session(api, "u1")
    r = await api.post(f"/api/v1/hosts/{s1['host']}/drain", headers=auth(ADMIN))
    assert r.status == 200 and (await r.json())["state"] == "draining"
    others = [await new_session(api, f"v{i}") for i in range(2)]
    assert all(s["host"] != s1["host"] for _, s in others)
    # the user with a session on the draining host gets it back
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(t1))
    assert r.status == 200 and (await r.json())["id"] == s1["id"]
    _, queued = await new_session(api, "w")
    assert queued["state"] == "queued"
    r = await api.post(f"/api/v1/hosts/{s1['host']}/undrain", headers=auth(ADMIN))
    assert (await r.json())["state"] == "up"
    got = await (await api.get(f"/api/v1/sessions/{queued['id']}", headers=auth(ADMIN))).json()
    assert got["state"] == "starting" and got["host"] == s1["host"]
    entries = (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
    assert {"host.drain", "host.undrain"} <= {e["action"] for e in entries}


async def test_queue_limit_and_per_user_limit(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=1, max_queue=1, max_sessions_per_user=2)
    tok, s1 = await new_session(api, "u1")
    clock.advance(1)
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    s2 = await r.json()
    assert r.status == 201 and s2["id"] != s1["id"] and s2["state"] == "queued"  # limit 2: a second one
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert r.status == 200 and (await r.json())["id"] == s1["id"]  # at the limit: the oldest comes back
    t3 = await user_token(api, "u3")
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(t3))
    body = await r.json()
    assert r.status == 429 and body["code"] == "queue_full" and body["field"] == "pool"


async def test_concurrent_requests_of_one_user_get_one_session(api) -> None:
    await setup_pool(api, "p1", hosts=2)
    tok = await user_token(api, "same")
    rs = await asyncio.gather(*[api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
                                for _ in range(20)])
    ids = {(await r.json())["id"] for r in rs}
    assert len(ids) == 1 and sorted(r.status for r in rs).count(201) == 1


async def test_events_stream_queue_position_then_seat(api) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=1)
    t1, s1 = await new_session(api, "u1")
    t2, s2 = await new_session(api, "u2")
    t3, s3 = await new_session(api, "u3")
    resp = await api.get(f"/api/v1/sessions/{s3['id']}/events", headers=auth(t3))
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"

    async def next_event() -> dict:
        while True:
            line = await asyncio.wait_for(resp.content.readline(), 5)
            if line.startswith(b"data: "):
                return json.loads(line[6:])

    assert (await next_event())["queue_position"] == 2
    await api.delete(f"/api/v1/sessions/{s1['id']}", headers=auth(t1))
    assert (await next_event())["queue_position"] == 1
    hub = api.app[HUB]
    pool_channel = api.app[BROKER].live.keys.chan_pool("p1")
    assert hub.listener_count(pool_channel) == 1  # queued: follows the queue
    await api.delete(f"/api/v1/sessions/{s2['id']}", headers=auth(t2))
    ev = await next_event()
    assert ev["state"] == "starting" and ev["host"] == "p1-h0"
    # seated: the stream no longer wakes on every queue movement of its pool, only on its own session
    assert hub.listener_count(pool_channel) == 0
    t4, s4 = await new_session(api, "u4")
    assert s4["state"] == "queued"
    await api.delete(f"/api/v1/sessions/{s3['id']}", headers=auth(t3))
    ev = await next_event()
    assert ev["state"] == "ended" and ev["end_reason"] == "user"
    resp.close()


async def test_metrics_openapi_and_health(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    await new_session(api, "u1")
    await api.post("/api/v1/sessions", json={"pool": "zzz"}, headers=auth(await user_token(api, "u2")))
    text = await (await api.get("/metrics")).text()
    assert 'render_broker_sessions{pool="p1",state="starting"} 1.0' in text
    assert 'render_broker_seats_total{pool="p1"} 2.0' in text
    assert 'render_broker_queue_length{pool="p1"} 0.0' in text
    assert "render_broker_allocation_seconds_count 2.0" in text
    assert 'render_broker_http_errors_total{code="not_found",status="404"} 1.0' in text
    doc = await (await api.get("/api/v1/openapi.json")).json()
    served = {(r.method.lower(), r.resource.get_info().get("path") or r.resource.get_info().get("formatter"))
              for r in api.app.router.routes() if r.method != "HEAD" and r.resource is not None}
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert {x for x in served if x[1] and x[1].startswith("/api/")} <= documented
    assert doc["paths"]["/api/v1/pools/{name}"]["put"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["strategy"]["enum"] == ["breadth-first", "depth-first"]
    assert all(op["summary"] for ops in doc["paths"].values() for op in ops.values())
    assert (await api.get("/healthz")).status == 200
    ready = await api.get("/readyz")
    assert ready.status == 200 and (await ready.json())["checks"] == {"redis": "ok", "live_state": "ok", "sql": "ok"}


async def test_state_survives_a_broker_restart(aiohttp_client, settings_factory, clock) -> None:
    from broker.app import create_app

    settings = settings_factory()
    c1 = await aiohttp_client(create_app(settings, clock=clock))
    await setup_pool(c1, "p1", hosts=1)
    tok, s = await new_session(c1, "u1")
    await c1.close()
    c2 = await aiohttp_client(create_app(settings, clock=clock))
    got = await state_of(c2, tok, s["id"])
    assert got["state"] == "starting" and got["host"] == "p1-h0"
    r = await c2.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert (await r.json())["id"] == s["id"]


async def test_a_node_drains_its_host_with_a_reason_and_users_cannot(api) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=2)
    r = await api.post("/api/v1/hosts/p1-h0/drain", json={"reason": "watchdog: GPU 0 at 93 C"}, headers=auth(NODE))
    assert r.status == 200 and (await r.json())["state"] == "draining"
    r = await api.post("/api/v1/hosts/p1-h0/undrain", json={"reason": "watchdog: healthy for 300 s"},
                       headers=auth(NODE))
    assert r.status == 200 and (await r.json())["state"] == "up"
    entries = (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
    got = {(e["action"], e["role"], (e.get("detail") or {}).get("reason")) for e in entries
           if e["action"].startswith("host.")}
    assert {("host.drain", "node", "watchdog: GPU 0 at 93 C"),
            ("host.undrain", "node", "watchdog: healthy for 300 s")} <= got
    user = await user_token(api, "u1")
    assert (await api.post("/api/v1/hosts/p1-h0/drain", headers=auth(user))).status == 403
    r = await api.post("/api/v1/hosts/p1-h0/drain", json={"reason": "x" * 201}, headers=auth(NODE))
    assert r.status == 422 and (await r.json())["field"] == "reason"
    r = await api.post("/api/v1/hosts/p1-h0/drain", json=["not", "an", "object"], headers=auth(NODE))
    assert r.status == 422 and (await r.json())["field"] == "body"
