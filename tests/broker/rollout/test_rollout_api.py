"""Rollout endpoints on a real Redis + SQLite broker: validation, audit, storage, admin promote / rollback."""

from __future__ import annotations

from broker.keys_app import BROKER
from tests.conftest import ADMIN, NODE, auth, gpu, user_token

URL = "/api/v1/pools/p1/rollout"


async def register(api, host: str, version: str, pool: str = "p1") -> None:  # type: ignore[no-untyped-def]
    r = await api.post("/api/v1/hosts", json={"id": host, "pool": pool, "address": f"{host}:7000",
                                              "gpus": [gpu(0)], "version": version}, headers=auth(NODE))
    assert r.status == 201, await r.text()
    assert (await r.json())["version"] == version


async def audit(api, prefix: str) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    entries = (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
    return [(e["action"], e["target"], e["actor"]) for e in entries if e["action"].startswith(prefix)]


async def test_put_get_delete_rollout_validated_stored_and_audited(api) -> None:
    r = await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 2, "vram_per_session_mb": 4096},
                      headers=auth(ADMIN))
    assert r.status == 201
    await register(api, "s0", "1.0")
    await register(api, "c0", "2.0")
    assert (await api.get(URL, headers=auth(ADMIN))).status == 404
    # bad bodies: 422 naming the field, nothing stored
    for body, field in (({"share_pct": 10}, "candidate_version"),
                        ({"candidate_version": "2.0", "share_pct": 150}, "share_pct"),
                        ({"candidate_version": "2.0", "min_sessions": -1}, "min_sessions"),
                        ({"candidate_version": "2.0", "bogus": True}, "bogus")):
        r = await api.put(URL, json=body, headers=auth(ADMIN))
        assert r.status == 422 and (await r.json())["field"] == field, body
    assert (await api.get(URL, headers=auth(ADMIN))).status == 404
    b = api.app[BROKER]
    assert await b.live.rollout_split("p1") is None

    r = await api.put(URL, json={"candidate_version": "2.0", "share_pct": 20}, headers=auth(ADMIN))
    assert r.status == 201, await r.text()
    view = await r.json()
    assert view["state"] == "active" and view["policy"]["share_pct"] == 20 and view["policy"]["min_sessions"] == 20
    assert view["candidate_hosts"] == ["c0"] and view["stable_hosts"] == ["s0"]
    assert view["split"] == {"version": "2.0", "share_pct": 20, "seatings": 0}
    r = await api.put(URL, json={"candidate_version": "2.0", "share_pct": 30}, headers=auth(ADMIN))
    assert r.status == 200 and (await r.json())["split"]["share_pct"] == 30
    host = await (await api.get("/api/v1/hosts/c0", headers=auth(ADMIN))).json()
    assert host["version"] == "2.0"

    assert (await api.delete(URL, headers=auth(ADMIN))).status == 204
    assert (await api.get(URL, headers=auth(ADMIN))).status == 404
    assert (await api.delete(URL, headers=auth(ADMIN))).status == 404
    assert await b.live.rollout_split("p1") is None
    assert await audit(api, "rollout.") == [("rollout.delete", "p1", "admin"), ("rollout.update", "p1", "admin"),
                                            ("rollout.create", "p1", "admin")]


async def test_rollout_needs_admin_and_a_pool(api) -> None:
    await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))
    tok = await user_token(api, "u1")
    for method, path in (("PUT", ""), ("GET", ""), ("DELETE", ""), ("POST", "/promote"), ("POST", "/rollback")):
        for who in (tok, NODE):
            r = await api.request(method, URL + path, json={"candidate_version": "2"}, headers=auth(who))
            assert r.status == 403, (method, path)
    r = await api.put("/api/v1/pools/nope/rollout", json={"candidate_version": "2"}, headers=auth(ADMIN))
    assert r.status == 404 and (await r.json())["field"] == "pool"
    assert (await api.post(URL + "/promote", headers=auth(ADMIN))).status == 404


async def test_admin_rollback_drains_the_candidate_and_admin_promote_clears_the_policy(api) -> None:
    await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 2, "vram_per_session_mb": 4096},
                  headers=auth(ADMIN))
    await register(api, "s0", "1.0")
    await register(api, "c0", "2.0")
    await register(api, "c1", "2.0")
    assert (await api.put(URL, json={"candidate_version": "2.0", "share_pct": 50}, headers=auth(ADMIN))).status == 201
    r = await api.post(URL + "/rollback", json={"reason": "x" * 201}, headers=auth(ADMIN))
    assert r.status == 422 and (await r.json())["field"] == "reason"
    r = await api.post(URL + "/rollback", json={"reason": "bad build"}, headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["state"] == "rolled_back" and body["drained"] == ["c0", "c1"]
    assert body["split"]["share_pct"] == 0
    hosts = (await (await api.get("/api/v1/hosts", headers=auth(ADMIN))).json())["hosts"]
    states = {h["id"]: h["state"] for h in hosts}
    assert states == {"s0": "up", "c0": "draining", "c1": "draining"}
    drains = [e for e in (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
              if e["action"] == "host.drain"]
    assert sorted(e["target"] for e in drains) == ["c0", "c1"]
    assert all("canary rollback of 2.0: admin: bad build" in e["detail"]["reason"] for e in drains)
    assert (await api.post(URL + "/rollback", headers=auth(ADMIN))).status == 409
    metrics = await (await api.get("/metrics")).text()
    assert 'render_broker_rollout_rolled_back{pool="p1"} 1.0' in metrics

    # a new rollout of a fixed build, promoted by the admin: the policy and the split are gone
    assert (await api.put(URL, json={"candidate_version": "2.1"}, headers=auth(ADMIN))).status == 200
    r = await api.post(URL + "/promote", headers=auth(ADMIN))
    assert r.status == 200 and (await r.json()) == {"pool": "p1", "promoted": "2.1"}
    assert (await api.get(URL, headers=auth(ADMIN))).status == 404
    assert await api.app[BROKER].live.rollout_split("p1") is None
    assert [a for a, _t, _w in await audit(api, "rollout.")] == ["rollout.promote", "rollout.update",
                                                                  "rollout.rollback", "rollout.create"]


async def test_openapi_documents_the_rollout_routes(api) -> None:
    doc = await (await api.get("/api/v1/openapi.json")).json()
    ops = doc["paths"]["/api/v1/pools/{name}/rollout"]
    assert set(ops) == {"put", "get", "delete"}
    props = ops["put"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"candidate_version", "share_pct", "min_sessions", "max_start_failure_pct"} <= set(props)
    assert "post" in doc["paths"]["/api/v1/pools/{name}/rollout/rollback"]
