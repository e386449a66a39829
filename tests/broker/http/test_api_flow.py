"""End-to-end API flow on real Redis + SQL: pools, hosts, seats, queue, reconnect, end, history."""

from __future__ import annotations

from tests.conftest import ADMIN, NODE, auth, gpu, setup_pool, user_token


async def test_seat_queue_release_and_history(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=2)
    tokens = [await user_token(api, f"u{i}") for i in range(4)]
    views = []
    for t in tokens:
        r = await api.post("/api/v1/sessions", json={"pool": "p1", "profile": {"width": 1280, "height": 720}},
                           headers=auth(t))
        assert r.status == 201, await r.text()
        views.append(await r.json())
    assert [v["state"] for v in views] == ["starting", "starting", "queued", "queued"]
    assert [v["queue_position"] for v in views] == [None, None, 1, 2]
    assert views[0]["host"] == "p1-h0" and views[0]["signaling"]["url"].endswith("/signal")

    # the same user asking again gets the same session back (reconnect), not a new one
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tokens[0]))
    assert r.status == 200 and (await r.json())["id"] == views[0]["id"]

    pool = await (await api.get("/api/v1/pools/p1", headers=auth(ADMIN))).json()
    assert (pool["seats_total"], pool["seats_used"], pool["seats_free"], pool["queue_length"]) == (2, 2, 0, 2)

    # a user cannot see or end another user's session
    r = await api.delete(f"/api/v1/sessions/{views[0]['id']}", headers=auth(tokens[1]))
    assert r.status == 404

    clock.advance(5_000)
    r = await api.delete(f"/api/v1/sessions/{views[0]['id']}", headers=auth(tokens[0]))
    ended = await r.json()
    assert r.status == 200 and ended["state"] == "ended"
    # the reply is built from the record read before the step plus what the step wrote: the same as
    # reading the record back
    again = await (await api.get(f"/api/v1/sessions/{views[0]['id']}", headers=auth(tokens[0]))).json()
    assert ended == again and ended["end_reason"] == "user" and ended["ended_ms"] == clock() > ended["seated_ms"]
    # ending it again reads the record (nothing was written): the same view
    r = await api.delete(f"/api/v1/sessions/{views[0]['id']}", headers=auth(tokens[0]))
    assert r.status == 200 and await r.json() == again
    # the head of the queue got the freed seat; the next one moved up
    s2 = await (await api.get(f"/api/v1/sessions/{views[2]['id']}", headers=auth(tokens[2]))).json()
    s3 = await (await api.get(f"/api/v1/sessions/{views[3]['id']}", headers=auth(tokens[3]))).json()
    assert s2["state"] == "starting" and s3["queue_position"] == 1

    # history is written through the outbox
    broker = api.app[__import__("broker.keys_app", fromlist=["BROKER"]).BROKER]
    assert await broker.drain_outbox() >= 3
    hist = await (await api.get("/api/v1/sessions/history", headers=auth(tokens[0]))).json()
    assert len(hist["sessions"]) == 1
    row = hist["sessions"][0]
    assert row["end_reason"] == "user" and row["host"] == "p1-h0" and row["gpu_seconds"] == 5.0
    audit = await (await api.get("/api/v1/audit?limit=100", headers=auth(ADMIN))).json()
    actions = [e["action"] for e in audit["entries"]]
    assert "session.end" in actions and "session.start" in actions and "pool.create" in actions


async def test_node_reports_and_heartbeat(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    t = await user_token(api, "alice")
    s = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(t))).json()
    hb = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={"gpus": [{"index": 0, "utilization": 40}],
                                                              "sessions": []}, headers=auth(NODE))
    body = await hb.json()
    assert hb.status == 200 and [c["session"]["id"] for c in body["start"]] == [s["id"]]
    r = await api.put(f"/api/v1/hosts/p1-h0/sessions/{s['id']}/state", json={"state": "running"},
                      headers=auth(NODE))
    assert r.status == 200
    got = await (await api.get(f"/api/v1/sessions/{s['id']}", headers=auth(t))).json()
    assert got["state"] == "running" and got["started_ms"] == clock.now_ms
    # a heartbeat reporting an unknown session tells the node to stop it
    hb = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={"sessions": [{"id": s["id"]}, {"id": "ghost"}]},
                       headers=auth(NODE))
    assert (await hb.json())["stop"] == ["ghost"]


async def test_register_requires_node_token(api) -> None:
    await setup_pool(api, "p1", hosts=0)
    body = {"id": "h1", "pool": "p1", "address": "x:1", "gpus": [gpu()]}
    assert (await api.post("/api/v1/hosts", json=body)).status == 401
    assert (await api.post("/api/v1/hosts", json=body, headers=auth(ADMIN))).status == 403
    assert (await api.post("/api/v1/hosts", json=body, headers=auth(NODE))).status == 201


async def test_admin_path_reaches_the_dashboard(api) -> None:
    r = await api.get("/admin", allow_redirects=False)
    assert r.status == 302 and r.headers["Location"] == "/web/admin.html"
    page = await api.get("/admin")
    assert page.status == 200 and "admin.js" in await page.text()


async def test_session_list_reads_the_users_own_index(api, clock) -> None:
    """A user's GET /sessions lists their live sessions in every pool (from P:user:*), not others', not ended ones."""
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=2)
    await setup_pool(api, "p2", hosts=1)
    alice, bob = await user_token(api, "alice"), await user_token(api, "bob")
    a1 = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(alice))).json()
    a2 = await (await api.post("/api/v1/sessions", json={"pool": "p2"}, headers=auth(alice))).json()
    b1 = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(bob))).json()

    async def ids(token: str, query: str = "") -> list[str]:
        r = await api.get(f"/api/v1/sessions{query}", headers=auth(token))
        assert r.status == 200, await r.text()
        return sorted(s["id"] for s in (await r.json())["sessions"])

    assert await ids(alice) == sorted([a1["id"], a2["id"]])
    assert await ids(alice, "?pool=p2") == [a2["id"]]
    assert await ids(alice, "?pool=nope") == []
    assert await ids(bob) == [b1["id"]]
    assert await ids(ADMIN) == sorted([a1["id"], a2["id"], b1["id"]])
    assert await ids(ADMIN, "?pool=p1") == sorted([a1["id"], b1["id"]])
    clock.advance(1_000)
    assert (await api.delete(f"/api/v1/sessions/{a1['id']}", headers=auth(alice))).status == 200
    assert await ids(alice) == [a2["id"]]
