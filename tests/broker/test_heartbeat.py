"""Heartbeats on a real Redis + SQL broker: the late-heartbeat race, leases from arrival, one step.

A node builds each heartbeat after the previous reply.  A session it starts while a heartbeat is
on its way is missing from that heartbeat, and the node reports it ``running`` separately; when
that report lands first, the older heartbeat must not end the session as "node no longer runs
it".  A heartbeat built after the report that still leaves the session out does end it.
"""

from __future__ import annotations

from broker.keys_app import BROKER
from tests.conftest import NODE, auth, setup_pool, user_token


async def _seat(api, user: str = "u1") -> str:  # type: ignore[no-untyped-def]
    tok = await user_token(api, user)
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert r.status == 201, await r.text()
    return str((await r.json())["id"])


async def _heartbeat(api, sessions: list[str], host: str = "p1-h0") -> dict:  # type: ignore[no-untyped-def]
    r = await api.put(f"/api/v1/hosts/{host}/heartbeat",
                      json={"sessions": [{"id": s, "state": "running"} for s in sessions]}, headers=auth(NODE))
    assert r.status == 200, await r.text()
    return await r.json()


async def _state(api, sid: str) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    s = await api.app[BROKER].live.get_session(sid)
    return s["state"], s["end_reason"]


async def test_an_older_heartbeat_never_ends_a_session_reported_running(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    sid = await _seat(api)
    clock.advance(1_000)
    start = await _heartbeat(api, [])  # heartbeat 1: the node has not started it yet
    assert [c["session"]["id"] for c in start["start"]] == [sid]
    # the node starts the session and reports it running while heartbeat 2, built before the
    # session was added, is on its way
    clock.advance(2_000)
    r = await api.put(f"/api/v1/hosts/p1-h0/sessions/{sid}/state", json={"state": "running"}, headers=auth(NODE))
    assert r.status == 200
    clock.advance(500)
    await _heartbeat(api, [])  # heartbeat 2 (older than the report) arrives after it
    assert await _state(api, sid) == ("running", None)
    # heartbeat 3 is built after heartbeat 2's reply: it includes the session, which lives on
    clock.advance(5_000)
    await _heartbeat(api, [sid])
    assert await _state(api, sid) == ("running", None)


async def test_a_heartbeat_built_after_the_report_ends_a_session_the_node_dropped(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    sid = await _seat(api)
    r = await api.put(f"/api/v1/hosts/p1-h0/sessions/{sid}/state", json={"state": "running"}, headers=auth(NODE))
    assert r.status == 200
    clock.advance(1_000)
    await _heartbeat(api, [sid])
    clock.advance(5_000)
    await _heartbeat(api, [])  # the node lost it (the app died without a report)
    assert await _state(api, sid) == ("ended", "node_ended")
    pool = await api.app[BROKER].live.pool_summary(await api.app[BROKER].get_pool("p1"))
    assert pool["seats_used"] == 0 and pool["sessions"]["running"] == 0


async def test_a_restarted_node_ends_what_it_no_longer_runs_and_is_sent_what_is_starting(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=2)
    running, starting = await _seat(api, "u1"), await _seat(api, "u2")
    await api.put(f"/api/v1/hosts/p1-h0/sessions/{running}/state", json={"state": "running"}, headers=auth(NODE))
    clock.advance(1_000)
    r = await api.post("/api/v1/hosts", json={"id": "p1-h0", "pool": "p1", "address": "10.0.0.1:7000", "gpus": [
        {"index": 0, "vram_mb": 24_576}]}, headers=auth(NODE))
    assert r.status == 201
    clock.advance(1_000)
    hb = await _heartbeat(api, [])
    assert [c["session"]["id"] for c in hb["start"]] == [starting]
    assert hb["start"][0]["session"]["profile"]["width"] > 0 and hb["start"][0]["session"]["gpu"] == 0
    assert await _state(api, running) == ("ended", "node_ended")


async def test_stop_lists_sessions_the_broker_does_not_have_there(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    sid = await _seat(api)
    await api.delete(f"/api/v1/sessions/{sid}", headers=auth(await user_token(api, "u1")))
    hb = await _heartbeat(api, [sid, "0" * 32])
    assert sorted(hb["stop"]) == sorted([sid, "0" * 32]) and hb["start"] == []


async def test_the_reaper_reads_only_due_leases_and_a_live_lease_is_never_expired(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2)
    b = api.app[BROKER]
    ttl = b.settings.lease_ttl_ms
    clock.advance(10_000)
    await _heartbeat(api, [], "p1-h1")
    await b.live.redis.delete(b.live.keys.host_lease("p1-h0"), b.live.keys.host_lease("p1-h1"))
    clock.advance(ttl - 10_000 - 1)
    assert await b.reap_once() == [] and await b.live.lease_due_count(clock.now_ms) == 0  # not due yet
    clock.advance(1)
    assert await b.live.lease_due_count(clock.now_ms) == 1
    await b.reap_once()  # p1-h0 is due and its lease is gone; p1-h1 is not due
    assert {h["id"]: h["state"] for h in await b.list_hosts()} == {"p1-h0": "down", "p1-h1": "up"}
    # a host whose lease key lives (Redis's clock is the lease) is not expired when its entry comes due
    await _heartbeat(api, [], "p1-h1")
    clock.advance(ttl * 10)
    await b.reap_once()
    assert (await b.get_host("p1-h1"))["state"] == "up"
    # a heartbeat of the down host asks it to register again
    r = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={}, headers=auth(NODE))
    assert r.status == 404 and (await r.json())["reregister"]


async def test_a_lagging_reaper_leaves_due_leases_to_a_later_pass(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    b = api.app[BROKER]
    sid = await _seat(api)
    await b.live.redis.delete(b.live.keys.host_lease("p1-h0"))
    clock.advance(b.settings.lease_ttl_ms)
    b.note_loop_lag(b.settings.host_lease_ttl_s)  # this process's loop ran a whole lease late
    assert await b.reap_once() == []
    assert (await b.get_host("p1-h0"))["state"] == "up"
    b.note_loop_lag(0.0)
    assert await b.reap_once() == [(sid, "host_lost")]
