"""Scaling-plan, autoscaler-view and pool-sizing endpoints on a real Redis + SQLite broker."""

from __future__ import annotations

import time

from broker.autoscale.plans import DEFAULT_PLAN
from broker.keys_app import BROKER
from tests.conftest import ADMIN, NODE, auth, setup_pool, user_token

PLAN = {"name": "office", "time_zone": "Europe/Paris", "schedules": [
    {"days": ["mon", "tue", "wed", "thu", "fri"], "scale_in_mode": "force_logoff", "logoff_wait_min": 10,
     "ramp_up": {"start": "07:30", "strategy": "breadth-first", "capacity_threshold_pct": 60, "min_hosts_pct": 25},
     "ramp_down": {"start": "18:30", "strategy": "depth-first", "capacity_threshold_pct": 90, "min_hosts_pct": 10}}]}


async def test_put_get_delete_plan_validated_and_audited(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    url = "/api/v1/pools/p1/plan"
    assert (await api.get(url, headers=auth(ADMIN))).status == 404
    r = await api.put(url, json=PLAN, headers=auth(ADMIN))
    assert r.status == 201, await r.text()
    body = await r.json()
    assert body["plan"]["time_zone"] == "Europe/Paris" and body["phase"]["name"] in (
        "ramp_up", "peak", "ramp_down", "off_peak")
    assert body["plan"]["schedules"][0]["peak"]["start"] == "09:00"  # defaults filled in
    r = await api.put(url, json={**PLAN, "scale_in_cooldown_min": 30}, headers=auth(ADMIN))
    assert r.status == 200
    got = await (await api.get(url, headers=auth(ADMIN))).json()
    assert got["plan"]["scale_in_cooldown_min"] == 30 and got["plan"]["name"] == "office"
    audit = (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
    plan_actions = [(e["action"], e["target"], e["actor"]) for e in audit if e["action"].startswith("plan.")]
    assert plan_actions == [("plan.update", "p1", "admin"), ("plan.create", "p1", "admin")]

    # invalid bodies: 422 naming the field, and the stored plan is untouched
    r = await api.put(url, json={**PLAN, "time_zone": "Mars/Olympus"}, headers=auth(ADMIN))
    assert r.status == 422
    problem = await r.json()
    assert problem["field"] == "time_zone" and "time_zone" in problem["detail"]
    bad_order = {**PLAN, "schedules": [{**PLAN["schedules"][0], "peak": {"start": "07:00"}}]}
    r = await api.put(url, json=bad_order, headers=auth(ADMIN))
    assert r.status == 422 and (await r.json())["field"] == "schedules[0].peak.start"
    r = await api.put(url, json={**PLAN, "surprise": 1}, headers=auth(ADMIN))
    assert r.status == 422 and (await r.json())["field"] == "surprise"
    got = await (await api.get(url, headers=auth(ADMIN))).json()
    assert got["plan"]["time_zone"] == "Europe/Paris" and got["plan"]["scale_in_cooldown_min"] == 30
    assert len([e for e in (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
                if e["action"].startswith("plan.")]) == 2

    assert (await api.delete(url, headers=auth(ADMIN))).status == 204
    assert (await api.get(url, headers=auth(ADMIN))).status == 404
    assert (await api.delete(url, headers=auth(ADMIN))).status == 404


async def test_bad_plan_on_a_pool_without_one_stores_nothing(api) -> None:
    await setup_pool(api, "p2", hosts=1)
    r = await api.put("/api/v1/pools/p2/plan", json={**PLAN, "time_zone": "Nowhere/Land"}, headers=auth(ADMIN))
    assert r.status == 422 and (await r.json())["field"] == "time_zone"
    assert (await api.get("/api/v1/pools/p2/plan", headers=auth(ADMIN))).status == 404
    view = await (await api.get("/api/v1/pools/p2/autoscale", headers=auth(ADMIN))).json()
    assert not view["enabled"] and view["phase"] is None and view["decisions"] == []


async def test_plan_endpoints_need_admin_and_an_existing_pool(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    tok = await user_token(api, "u1")
    for method, path in (("PUT", "plan"), ("GET", "plan"), ("DELETE", "plan"), ("GET", "autoscale"),
                         ("POST", "simulate"), ("GET", "recommendation")):
        for who in (tok, NODE):
            r = await api.request(method, f"/api/v1/pools/p1/{path}", json={}, headers=auth(who))
            assert r.status == 403, (method, path)
    assert (await api.put("/api/v1/pools/nope/plan", json=PLAN, headers=auth(ADMIN))).status == 404
    assert (await api.get("/api/v1/pools/nope/autoscale", headers=auth(ADMIN))).status == 404
    assert (await api.post("/api/v1/pools/nope/simulate", json={}, headers=auth(ADMIN))).status == 404


async def test_simulate_compares_always_on_plan_and_recommendation_quickly(api) -> None:
    await setup_pool(api, "p1", hosts=4, max_sessions_per_gpu=2)
    assert (await api.get("/api/v1/pools/p1/recommendation", headers=auth(ADMIN))).status == 404
    t0 = time.perf_counter()
    r = await api.post("/api/v1/pools/p1/simulate", json={"peak_concurrency": 6}, headers=auth(ADMIN))
    elapsed = time.perf_counter() - t0
    assert r.status == 200, await r.text()
    assert elapsed < 5.0
    res = await r.json()
    # thin history (none) -> a synthetic week on the pool's own shape: 4 hosts x 2 seats
    assert (res["source"], res["max_hosts"], res["seats_per_host"], res["days"]) == ("synthetic", 4, 2, 7.0)
    hours = res["host_hours"]
    assert set(hours) == {"always_on", "plan", "recommended"}
    assert hours["always_on"] == 4 * 24 * 7  # every host on all week
    assert hours["plan"] < hours["always_on"] and hours["recommended"] <= hours["always_on"]
    assert [r["label"] for r in res["results"]][:2] == ["always-on", "default plan"]
    assert res["results"][2]["label"].startswith("recommended")
    assert res["plan"] == DEFAULT_PLAN.to_dict() and res["arrivals"] > 0
    # the recommended plan is a valid plan body: it can be PUT as is
    assert (await api.put("/api/v1/pools/p1/plan", json=res["recommended_plan"], headers=auth(ADMIN))).status == 201
    stored = await (await api.get("/api/v1/pools/p1/recommendation", headers=auth(ADMIN))).json()
    assert stored["host_hours"] == hours and stored["recommended_plan"] == res["recommended_plan"]


async def test_simulate_uses_sql_history_when_there_is_enough(api, clock) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=2)
    repo = api.app[BROKER].repo
    now = clock()
    for i in range(60):  # one 30-minute session an hour for the last 60 hours; a few never seated
        created = now - (i + 1) * 3_600_000
        seated = created + 5_000 if i % 10 else 0
        await repo.record_end({"id": f"s{i}", "pool": "p1", "user": f"u{i}", "created_ms": str(created),
                               "seated_ms": str(seated), "ended_ms": str(created + 1_800_000),
                               "end_reason": "user" if seated else "queue_timeout"}, created + 1_800_000)
    r = await api.post("/api/v1/pools/p1/simulate", json={"days": 7, "recommend": False}, headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    res = await r.json()
    assert (res["source"], res["history_sessions"], res["arrivals"]) == ("history", 60, 60)
    assert set(res["host_hours"]) == {"always_on", "plan"} and "recommended_plan" not in res
    assert (await api.get("/api/v1/pools/p1/recommendation", headers=auth(ADMIN))).status == 404  # not stored
    r = await api.post("/api/v1/pools/p1/simulate", json={"min_history_sessions": 61, "recommend": False,
                                                          "peak_concurrency": 3}, headers=auth(ADMIN))
    assert (await r.json())["source"] == "synthetic"


async def test_simulate_validates_its_body_and_a_proposed_plan(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    r = await api.post("/api/v1/pools/p1/simulate", json={"days": 0}, headers=auth(ADMIN))
    assert r.status == 422 and (await r.json())["field"] == "days"
    r = await api.post("/api/v1/pools/p1/simulate", json={"plan": {**PLAN, "time_zone": "Mars/Olympus"}},
                       headers=auth(ADMIN))
    assert r.status == 422 and (await r.json())["field"] == "plan.time_zone"
    r = await api.post("/api/v1/pools/p1/simulate", json={"plan": PLAN, "recommend": False, "peak_concurrency": 2,
                                                          "days": 2}, headers=auth(ADMIN))
    assert r.status == 200 and (await r.json())["results"][1]["label"] == "proposed plan (office)"


async def test_openapi_documents_the_plan_routes(api) -> None:
    doc = await (await api.get("/api/v1/openapi.json")).json()
    ops = doc["paths"]["/api/v1/pools/{name}/plan"]
    assert set(ops) == {"put", "get", "delete"}
    assert "time_zone" in ops["put"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert doc["paths"]["/api/v1/pools/{name}/simulate"]["post"]["summary"]
    assert doc["paths"]["/api/v1/pools/{name}/recommendation"]["get"]["summary"]


async def test_plan_decision_and_recommendation_storage_on_each_database(any_db_url: str) -> None:
    from broker.db.engine import create_engine, migrate
    from broker.db.repository import Repository

    engine = create_engine(any_db_url)
    try:
        await migrate(engine)
        repo = Repository(engine)
        assert await repo.save_plan("p1", DEFAULT_PLAN.to_dict(), 1) is True
        assert await repo.save_plan("p1", {**DEFAULT_PLAN.to_dict(), "name": "v2"}, 2) is False
        assert (await repo.get_plan("p1"))["plan"]["name"] == "v2" and await repo.get_plan("p2") is None
        assert list(await repo.list_plans()) == ["p1"]
        await repo.add_decisions([{"ts_ms": i, "pool": "p1", "phase": "off_peak", "kind": "drain", "host": f"h{i}",
                                   "count": None, "reason": "scale_in", "detail": {"outcome": "applied"}}
                                  for i in range(3)])
        assert [d["host"] for d in await repo.decisions("p1", limit=2)] == ["h2", "h1"]
        await repo.save_recommendation("p1", {"host_hours": {"plan": 1.5}}, 5)
        await repo.save_recommendation("p1", {"host_hours": {"plan": 2.5}}, 6)
        latest = {"pool": "p1", "ts_ms": 6, "result": {"host_hours": {"plan": 2.5}}}
        assert await repo.get_recommendation("p1") == latest
        assert await repo.delete_plan("p1") and not await repo.delete_plan("p1")
    finally:
        await engine.dispose()
