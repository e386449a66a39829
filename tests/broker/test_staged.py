"""Staged sessions on a real Redis + SQL broker: hand-out, refill, no over-seat, nothing leaks.

A pool's ``staged`` setting keeps that many sessions started on its hosts for the next users.  A
staged session holds a seat (placement, counters and the autoscaler see it) but is nobody's: it is
in no user's list or history until it is handed out, and it goes away with its host or the setting.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from broker.keys_app import BROKER
from tests.conftest import ADMIN, NODE, auth, setup_pool, user_token


async def _pool(api) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = await api.get("/api/v1/pools/p1", headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    return dict(await r.json())


async def _staged_ids(api) -> list[str]:  # type: ignore[no-untyped-def]
    live = api.app[BROKER].live
    return sorted(x.decode() for x in await live.redis.zrange(live.keys.pool_staged("p1"), 0, -1))


async def _ask(api, user: str, profile: dict[str, Any] | None = None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    tok = await user_token(api, user)
    body: dict[str, Any] = {"pool": "p1"}
    if profile is not None:
        body["profile"] = profile
    r = await api.post("/api/v1/sessions", json=body, headers=auth(tok))
    assert r.status == 201, await r.text()
    return dict(await r.json())


async def _ready(api, sid: str, host: str = "p1-h0") -> None:  # type: ignore[no-untyped-def]
    r = await api.put(f"/api/v1/hosts/{host}/sessions/{sid}/state", json={"state": "running"}, headers=auth(NODE))
    assert r.status == 200, await r.text()


async def _host_of(api, sid: str) -> str:  # type: ignore[no-untyped-def]
    s = await api.app[BROKER].live.get_session(sid)
    return str(s["host"])


async def test_a_staged_session_is_handed_out_running_and_refilled(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, staged=1)
    pool = await _pool(api)
    assert pool["staged"] == 1
    assert pool["staged_sessions"] == {"target": 1, "ready": 0, "starting": 1}
    assert pool["seats_used"] == 1 and pool["seats_free"] == 1  # a staged session holds a seat
    [staged] = await _staged_ids(api)
    rec = await api.app[BROKER].live.get_session(staged)
    assert rec["state"] == "staged" and rec["user"] == "" and rec["host"] == "p1-h0"
    hb = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={"sessions": []}, headers=auth(NODE))
    [cmd] = (await hb.json())["start"]  # the node is (re)sent it until it reports it ready
    assert cmd["session"]["id"] == staged and cmd["session"]["staged"] is True

    await _ready(api, staged)
    assert (await _pool(api))["staged_sessions"] == {"target": 1, "ready": 1, "starting": 0}
    clock.advance(1_000)
    view = await _ask(api, "u1", {"width": 1280, "height": 720, "fps": 30})
    assert view["id"] == staged and view["user"] == "u1" and view["state"] == "running"
    assert view["started_ms"] == clock() and view["signaling"]["url"].endswith(f"/sessions/{staged}/signal")
    pool = await _pool(api)
    assert pool["staged_sessions"] == {"target": 1, "ready": 0, "starting": 1}  # refilled at once
    assert pool["seats_used"] == 2 and pool["sessions"]["running"] == 1
    [refill] = await _staged_ids(api)
    assert refill != staged

    # the staged refill is nobody's: not in the user's or the admin's session list, nor in history
    tok = await user_token(api, "u1")
    mine = (await (await api.get("/api/v1/sessions", headers=auth(tok))).json())["sessions"]
    assert [s["id"] for s in mine] == [staged]
    everyone = (await (await api.get("/api/v1/sessions", headers=auth(ADMIN))).json())["sessions"]
    assert [s["id"] for s in everyone] == [staged]
    assert (await api.get(f"/api/v1/sessions/{refill}", headers=auth(tok))).status == 404

    # ending the user's session frees its seat; the staged refill stays
    r = await api.delete(f"/api/v1/sessions/{staged}", headers=auth(tok))
    assert r.status == 200, await r.text()
    assert await _staged_ids(api) == [refill]
    assert (await _pool(api))["seats_used"] == 1
    await api.app[BROKER].drain_outbox()
    hist = (await (await api.get("/api/v1/sessions/history", headers=auth(ADMIN))).json())["sessions"]
    assert [(s["id"], s["user"]) for s in hist] == [(staged, "u1")]  # the user's, from the hand-out


async def test_a_profile_the_staged_session_cannot_serve_is_seated_cold(api) -> None:
    await setup_pool(api, "p1", hosts=1, staged=1, kind="game")
    [staged] = await _staged_ids(api)
    await _ready(api, staged)
    cold = await _ask(api, "u1", {"width": 1920, "height": 1080, "fps": 60})  # a game is not resized
    assert cold["id"] != staged and cold["state"] == "starting"
    assert await _staged_ids(api) == [staged]
    warm = await _ask(api, "u2", {"width": 1280, "height": 720, "fps": 60})
    assert warm["id"] == staged and warm["state"] == "running"


async def test_staged_seats_never_over_seat_and_yield_to_users(api) -> None:
    await setup_pool(api, "p1", hosts=1, staged=1)  # 2 seats
    users = [f"u{i}" for i in range(8)]
    views = await asyncio.gather(*(_ask(api, u) for u in users))
    seated = [v for v in views if v["state"] in ("starting", "running")]
    queued = [v for v in views if v["state"] == "queued"]
    assert len(seated) == 2 and len(queued) == 6  # one got the staged session, one the seat it yielded
    pool = await _pool(api)
    assert pool["seats_used"] == 2 and pool["seats_total"] == 2 and pool["queue_length"] == 6
    assert await _staged_ids(api) == []  # no refill while people queue
    # a freed seat goes to the queue before any restaging
    by_user = {v["user"]: v for v in views}
    first = seated[0]
    tok = await user_token(api, first["user"])
    assert (await api.delete(f"/api/v1/sessions/{first['id']}", headers=auth(tok))).status == 200
    pool = await _pool(api)
    assert pool["seats_used"] == 2 and pool["queue_length"] == 5 and await _staged_ids(api) == []
    # once nobody queues, a freed seat is staged again
    for v in [*sorted(queued, key=lambda v: v["created_ms"]), seated[1]]:
        tok = await user_token(api, v["user"])
        assert (await api.delete(f"/api/v1/sessions/{by_user[v['user']]['id']}", headers=auth(tok))).status == 200
    pool = await _pool(api)
    assert pool["queue_length"] == 0 and pool["seats_used"] == 1 and len(await _staged_ids(api)) == 1


async def test_staged_sessions_follow_the_setting_and_their_hosts(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, staged=2)
    staged = await _staged_ids(api)
    # the first host registered took both (the pool's setting came first)
    assert len(staged) == 2 and {await _host_of(api, s) for s in staged} == {"p1-h0"}

    # a draining host keeps none: its staged session moves to a host that takes sessions
    r = await api.post("/api/v1/hosts/p1-h0/drain", json={}, headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    now = await _staged_ids(api)
    assert len(now) == 2 and {await _host_of(api, s) for s in now} == {"p1-h1"}
    gone = [s for s in staged if s not in now]
    assert gone == staged and await api.app[BROKER].live.get_sessions(gone) == []
    host = (await (await api.get("/api/v1/hosts/p1-h0", headers=auth(ADMIN))).json())
    assert host["sessions"] == [] and host["seats_used"] == 0

    # a host holding only staged sessions is removed without force (nobody's sessions keep it)
    r = await api.delete("/api/v1/hosts/p1-h1", headers=auth(ADMIN))
    assert r.status in (200, 204), await r.text()
    assert await _staged_ids(api) == []  # nowhere left to stage (p1-h0 drains)
    assert await api.app[BROKER].live.get_sessions(now) == []

    # undrain: staged again; shrinking the setting drops the extra
    r = await api.post("/api/v1/hosts/p1-h0/undrain", json={}, headers=auth(ADMIN))
    assert r.status == 200
    assert len(await _staged_ids(api)) == 2 and (await _pool(api))["seats_used"] == 2
    r = await api.put("/api/v1/pools/p1", json={"strategy": "breadth-first", "max_sessions_per_gpu": 2,
                                                "vram_per_session_mb": 4096, "staged": 0}, headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    assert await _staged_ids(api) == [] and (await _pool(api))["seats_used"] == 0

    # a host that dies takes its staged sessions with it, and they are no one's lost session
    r = await api.put("/api/v1/pools/p1", json={"strategy": "breadth-first", "max_sessions_per_gpu": 2,
                                                "vram_per_session_mb": 4096, "staged": 1}, headers=auth(ADMIN))
    [last] = await _staged_ids(api)
    b = api.app[BROKER]
    await b.live.redis.delete(b.live.keys.host_lease("p1-h0"))  # the lease ran out (Redis's clock)
    clock.advance(60_000)
    ended = await api.app[BROKER].reap_once()
    assert last not in [sid for sid, _ in ended]
    assert await api.app[BROKER].live.get_session(last) is None and await _staged_ids(api) == []
    assert (await _pool(api))["seats_used"] == 0
    await api.app[BROKER].drain_outbox()
    hist = (await (await api.get("/api/v1/sessions/history", headers=auth(ADMIN))).json())["sessions"]
    assert hist == []


async def test_a_staged_session_its_node_lost_is_replaced(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, staged=1)
    [staged] = await _staged_ids(api)
    await _ready(api, staged)
    clock.advance(1_000)
    r = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={"sessions": [{"id": staged, "state": "disconnected"}]},
                      headers=auth(NODE))
    assert r.status == 200 and await _staged_ids(api) == [staged]  # listed: kept, no stop
    assert (await r.json())["stop"] == []
    clock.advance(5_000)
    r = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={"sessions": []}, headers=auth(NODE))
    [fresh] = await _staged_ids(api)  # dropped and staged anew, sent to the node in the same reply
    assert fresh != staged and await api.app[BROKER].live.get_session(staged) is None
    assert [c["session"]["id"] for c in (await r.json())["start"]] in ([], [fresh])
    pool = await _pool(api)
    assert pool["seats_used"] == 1 and sum(pool["sessions"].values()) == 0
    raw = await api.app[BROKER].live.redis.lrange(api.app[BROKER].live.keys.outbox, 0, -1)
    assert [json.loads(x)["session"]["id"] for x in raw] == []
