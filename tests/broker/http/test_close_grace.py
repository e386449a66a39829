"""A deliberate close (pagehide -> POST /leave) keeps the seat close_grace_s; a network drop keeps
disconnect_timeout_s.  Real Redis + SQL broker, fake clock, the reaper's own pass."""

from __future__ import annotations

from broker.keys_app import BROKER
from broker.lifecycle import SessionClock, Timeouts, next_due_ms, reap
from broker.protocol import SessionState
from tests.broker.http.test_lifecycle_api import new_session, state_of
from tests.conftest import NODE, auth, setup_pool


async def _state(api, sid: str, state: str) -> None:  # type: ignore[no-untyped-def]
    r = await api.put(f"/api/v1/hosts/p1-h0/sessions/{sid}/state", json={"state": state}, headers=auth(NODE))
    assert r.status == 200, await r.text()


async def test_a_closed_tab_frees_the_seat_after_the_grace_a_drop_after_the_timeout(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=3, disconnect_timeout_s=300, close_grace_s=30,
                     idle_timeout_s=0)
    b = api.app[BROKER]
    t_closed, closed = await new_session(api, "closer")
    t_drop, dropped = await new_session(api, "dropper")
    t_back, back = await new_session(api, "returner")
    for s in (closed, dropped, back):
        await _state(api, s["id"], "running")
    # the closing tab says so; the node then loses its viewer; the others just lose theirs
    r = await api.post(f"/api/v1/sessions/{closed['id']}/leave?tab=tab-1", headers=auth(t_closed))
    assert r.status == 200 and (await r.json())["left"] is True, await r.text()
    r = await api.post(f"/api/v1/sessions/{back['id']}/leave?tab=tab-2", headers=auth(t_back))
    assert (await r.json())["left"] is True
    for s in (closed, dropped, back):
        await _state(api, s["id"], "disconnected")
    await _state(api, back["id"], "running")  # a reload: its viewer came back, the mark is gone
    await _state(api, back["id"], "disconnected")  # ... and a later network drop

    clock.advance(29_999)
    assert await b.reap_once() == []
    clock.advance(1)
    assert await b.reap_once() == [(closed["id"], "disconnect_timeout")]
    assert (await state_of(api, t_closed, closed["id"]))["state"] == "ended"
    clock.advance(300_000 - 30_000 - 1)
    assert await b.reap_once() == []
    clock.advance(1)
    assert sorted(await b.reap_once()) == sorted([(dropped["id"], "disconnect_timeout"),
                                                  (back["id"], "disconnect_timeout")])
    assert (await state_of(api, t_back, back["id"]))["state"] == "ended"


async def test_leave_is_ignored_while_another_tab_watches_and_checks_its_input(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    tok, s = await new_session(api, "u1")
    live = api.app[BROKER].live
    assert (await live.claim_tab(s["id"], "watching", "sock", take=False))[0]
    r = await api.post(f"/api/v1/sessions/{s['id']}/leave?tab=closing", headers=auth(tok))
    assert (await r.json()) == {"id": s["id"], "left": False, "reason": "another_tab"}
    r = await api.post(f"/api/v1/sessions/{s['id']}/leave?tab=../x", headers=auth(tok))
    body = await r.json()
    assert r.status == 422 and body["field"] == "tab", body
    other, _ = await new_session(api, "u2")
    r = await api.post(f"/api/v1/sessions/{s['id']}/leave?tab=t", headers=auth(other))
    assert r.status == 404, await r.text()  # not the owner


def test_the_policy_and_the_deadline_agree_on_the_grace() -> None:
    t = Timeouts(queue_timeout_s=60, idle_timeout_s=0, disconnect_timeout_s=300, max_duration_s=0, close_grace_s=30)
    left = SessionClock(SessionState.DISCONNECTED, created_ms=0, seated_ms=1_000, disconnected_ms=10_000,
                        left_ms=9_000)
    assert next_due_ms(left, t) == 40_000
    assert not reap(left, t, 39_999).end and reap(left, t, 40_000).end
    assert "closed its tab" in reap(left, t, 40_000).detail
    dropped = SessionClock(SessionState.DISCONNECTED, created_ms=0, seated_ms=1_000, disconnected_ms=10_000)
    assert next_due_ms(dropped, t) == 310_000
    longer = Timeouts(queue_timeout_s=60, idle_timeout_s=0, disconnect_timeout_s=20, max_duration_s=0,
                      close_grace_s=30)
    assert next_due_ms(left, longer) == 30_000  # the grace never lengthens a shorter disconnect timeout


async def test_a_pool_stored_before_the_setting_gets_the_default_grace(api) -> None:
    await setup_pool(api, "p1", hosts=1, disconnect_timeout_s=300)
    tok, s = await new_session(api, "u1")
    live = api.app[BROKER].live
    await live.redis.hdel(live.keys.pool("p1"), "close_grace_s")  # as an older broker wrote it
    await _state(api, s["id"], "running")
    await _state(api, s["id"], "disconnected")
    assert (await (await api.post(f"/api/v1/sessions/{s['id']}/leave", headers=auth(tok))).json())["left"]
    disconnected = (await live.get_session(s["id"]))["disconnected_ms"]
    due = await live.redis.zscore(live.keys.due_sessions, s["id"])
    assert int(due) == disconnected + 30_000  # lifecycle.CLOSE_GRACE_DEFAULT_S, not 0 (= at once)
