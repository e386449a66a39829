"""A canary rollout end to end: a real broker app on real Redis + SQLite, nodes of two versions
(simulated through the node API: register, session state reports), the candidate faulty.

The candidate node fails every session it is given (it reports ``ended`` / ``start_failed``,
as ``streamer.node.agent`` does when a runtime cannot start); the stable node runs its sessions.
The rollout loop's step holds until the minimum sample is in, then rolls back on its own:
candidate hosts drained with the reason (audited), the alert gauge set, new sessions on stable
hosts, and no session on a stable host lost.
"""

from __future__ import annotations

from broker.http.rollout import ROLLOUTS
from broker.keys_app import BROKER
from broker.rollout.policy import Action, Reason
from tests.broker.rollout.test_rollout_api import register
from tests.conftest import ADMIN, NODE, auth, user_token

POLICY = {"candidate_version": "2.0", "share_pct": 50, "min_sessions": 4, "min_soak_s": 3600,
          "max_start_failure_pct": 10}


async def new_session(api, user: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    tok = await user_token(api, user)
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert r.status == 201, await r.text()
    return await r.json()  # type: ignore[no-any-return]


async def node_reports(api, s: dict, state: str, reason: str = "") -> None:  # type: ignore[no-untyped-def, type-arg]
    body = {"state": state, **({"reason": reason} if reason else {})}
    r = await api.put(f"/api/v1/hosts/{s['host']}/sessions/{s['id']}/state", json=body, headers=auth(NODE))
    assert r.status == 200, await r.text()


async def run_node(api, s: dict) -> None:  # type: ignore[no-untyped-def, type-arg]
    """What each node does with a session it is told to start: stable runs it, the candidate fails it."""
    if s["host"].startswith("c"):
        await node_reports(api, s, "ended", "start_failed")
    else:
        await node_reports(api, s, "running")


async def test_a_faulty_candidate_is_rolled_back_on_its_own_and_no_stable_session_is_lost(api, clock) -> None:
    b = api.app[BROKER]
    rollouts = api.app[ROLLOUTS]
    r = await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 4, "vram_per_session_mb": 4096},
                      headers=auth(ADMIN))
    assert r.status == 201
    await register(api, "s0", "1.0")
    await register(api, "s1", "1.0")
    before = [await new_session(api, f"early{i}") for i in range(2)]  # running before the rollout
    for s in before:
        await run_node(api, s)
    await register(api, "c0", "2.0")
    await register(api, "c1", "2.0")
    clock.advance(1000)  # the judging window opens after the early sessions were seated
    assert (await api.put("/api/v1/pools/p1/rollout", json=POLICY, headers=auth(ADMIN))).status == 201

    seated = []
    for i in range(4):  # half the seatings prefer the candidate: 2 fail so far, under min_sessions
        s = await new_session(api, f"u{i}")
        seated.append(s)
        await run_node(api, s)
    assert [s["host"][0] for s in seated] == ["s", "c", "s", "c"]
    await b.drain_outbox()
    [(pool, verdict)] = await rollouts.run_once()
    assert pool == "p1" and verdict is not None
    assert (verdict.action, verdict.reason) == (Action.HOLD, Reason.NOT_ENOUGH_SAMPLES)

    for i in range(4, 8):
        s = await new_session(api, f"u{i}")
        seated.append(s)
        await run_node(api, s)
    await b.drain_outbox()
    [(_, verdict)] = await rollouts.run_once()
    assert verdict is not None and (verdict.action, verdict.reason) == (Action.ROLLBACK, Reason.START_FAILURES)
    assert "4/4" in verdict.detail

    # the candidate's hosts drain (audited with the reason), the stable ones keep serving
    hosts = {h["id"]: h for h in (await (await api.get("/api/v1/hosts", headers=auth(ADMIN))).json())["hosts"]}
    assert {h: v["state"] for h, v in hosts.items()} == {"s0": "up", "s1": "up", "c0": "draining", "c1": "draining"}
    entries = (await (await api.get("/api/v1/audit?limit=200", headers=auth(ADMIN))).json())["entries"]
    drains = {e["target"]: e for e in entries if e["action"] == "host.drain"}
    assert set(drains) == {"c0", "c1"} and all(e["actor"] == "rollout" for e in drains.values())
    assert all(e["detail"]["reason"].startswith("canary rollback of 2.0: start_failures") for e in drains.values())
    [rb] = [e for e in entries if e["action"] == "rollout.rollback"]
    assert rb["actor"] == "rollout" and rb["detail"]["reason"] == "start_failures"
    assert sorted(rb["detail"]["drained"]) == ["c0", "c1"]
    view = await (await api.get("/api/v1/pools/p1/rollout", headers=auth(ADMIN))).json()
    assert view["state"] == "rolled_back" and view["last"]["reason"] == "start_failures"
    assert view["last"]["candidate"]["start_failed"] == 4 and view["last"]["stable"]["started"] == 4
    assert 'render_broker_rollout_rolled_back{pool="p1"} 1.0' in await (await api.get("/metrics")).text()

    # no session on a stable host was lost: every one still runs
    stable = before + [s for s in seated if s["host"].startswith("s")]
    assert len(stable) == 6
    for s in stable:
        got = await b.live.get_session(s["id"])
        assert got is not None and got["state"] == "running", got
    history = await b.repo.session_history(pool="p1")
    assert sorted((h["end_reason"], h["host_version"]) for h in history) == [("start_failed", "2.0")] * 4

    # new sessions land on stable hosts only; a candidate host that comes up later is drained too
    s = await new_session(api, "after")
    assert s["host"] in ("s0", "s1")
    await register(api, "c2", "2.0")
    await rollouts.run_once()
    host = await (await api.get("/api/v1/hosts/c2", headers=auth(ADMIN))).json()
    assert host["state"] == "draining"
    await register(api, "c0", "2.0")  # a candidate node restarting stays drained
    assert (await (await api.get("/api/v1/hosts/c0", headers=auth(ADMIN))).json())["state"] == "draining"


async def test_a_healthy_candidate_is_promoted_after_its_soak(api, clock) -> None:
    rollouts = api.app[ROLLOUTS]
    await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 4, "vram_per_session_mb": 4096},
                  headers=auth(ADMIN))
    await register(api, "s0", "1.0")
    await register(api, "c0", "2.1")
    policy = {**POLICY, "candidate_version": "2.1", "min_sessions": 2, "min_soak_s": 600}
    assert (await api.put("/api/v1/pools/p1/rollout", json=policy, headers=auth(ADMIN))).status == 201
    for i in range(4):
        s = await new_session(api, f"u{i}")
        await node_reports(api, s, "running")  # both versions run their sessions
    [(_, v)] = await rollouts.run_once()
    assert v is not None and (v.action, v.reason) == (Action.HOLD, Reason.SOAKING)
    clock.advance(600_000)
    [(_, v)] = await rollouts.run_once()
    assert v is not None and (v.action, v.reason) == (Action.PROMOTE, Reason.HEALTHY)
    assert (await api.get("/api/v1/pools/p1/rollout", headers=auth(ADMIN))).status == 404
    assert await api.app[BROKER].live.rollout_split("p1") is None
    entries = (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
    assert [(e["action"], e["actor"]) for e in entries if e["action"] == "rollout.promote"] == [
        ("rollout.promote", "rollout")]
    assert await rollouts.run_once() == []  # nothing left to judge


async def test_a_candidate_whose_streams_freeze_is_rolled_back_on_the_nodes_heartbeat_counts(api, clock) -> None:
    rollouts = api.app[ROLLOUTS]
    await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 4, "vram_per_session_mb": 4096},
                  headers=auth(ADMIN))
    await register(api, "s0", "1.0")
    await register(api, "c0", "2.2")
    policy = {**POLICY, "candidate_version": "2.2", "min_sessions": 2}
    assert (await api.put("/api/v1/pools/p1/rollout", json=policy, headers=auth(ADMIN))).status == 201
    by_host: dict[str, list[str]] = {"s0": [], "c0": []}
    for i in range(4):
        s = await new_session(api, f"u{i}")
        await node_reports(api, s, "running")  # both versions start their sessions fine
        by_host[s["host"]].append(s["id"])
    assert [len(v) for v in by_host.values()] == [2, 2]
    clock.advance(600_000)  # 10 minutes of streaming: 20 session-minutes per class
    for host, freezes in (("s0", 2), ("c0", 30)):  # the candidate's viewers see 1.5 freezes a minute
        sessions = [{"id": sid, "state": "running", "freezes": freezes // 2, "encoder_errors": 0,
                     "first_frame_ms": 400.0} for sid in by_host[host]]
        r = await api.put(f"/api/v1/hosts/{host}/heartbeat", json={"gpus": [], "sessions": sessions},
                          headers=auth(NODE))
        assert r.status == 200, await r.text()
    [(_, v)] = await rollouts.run_once()
    assert v is not None and (v.action, v.reason) == (Action.ROLLBACK, Reason.FREEZES), v
    assert "1.50/min vs stable 0.10/min" in v.detail
    view = await (await api.get("/api/v1/pools/p1/rollout", headers=auth(ADMIN))).json()
    assert view["last"]["candidate"]["freezes"] == 30 and view["last"]["stable"]["freezes"] == 2
    host = await (await api.get("/api/v1/hosts/c0", headers=auth(ADMIN))).json()
    assert host["state"] == "draining"
