"""Bad input gets a 4xx JSON problem naming the field, and nothing changes in Redis or SQL."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from broker.keys_app import BROKER
from tests.conftest import ADMIN, NODE, auth, gpu, setup_pool, user_token


async def snapshot(api) -> tuple[list[bytes], int, int]:
    b = api.app[BROKER]
    r: aioredis.Redis = b.live.redis
    keys = sorted([k async for k in r.scan_iter(f"{b.live.keys.prefix}:*")])
    vals = []
    for k in keys:
        t = await r.type(k)
        vals.append((k, t, await r.dump(k)))
    audit = len(await b.repo.audit_log(1000))
    return vals, audit, await b.repo.count_sessions()


def assert_problem(status: int, body: dict, want_status: int, field: str | None) -> None:
    assert status == want_status, body
    assert body["status"] == want_status and body["code"] and body["detail"]
    if field is not None:
        assert body.get("field") == field, body


@pytest.mark.parametrize(("body", "field"), [
    ({"strategy": "random"}, "strategy"),
    ({"max_sessions_per_gpu": -1}, "max_sessions_per_gpu"),
    ({"max_sessions_per_gpu": "4"}, "max_sessions_per_gpu"),
    ({"max_sessions_per_gpu": 2.5}, "max_sessions_per_gpu"),
    ({"vram_headroom": 1.5}, "vram_headroom"),
    ({"vram_per_session_mb": 0}, "vram_per_session_mb"),
    ({"max_queue": True}, "max_queue"),
    ({"seats": 4}, "seats"),
    ({"kind": None}, "kind"),
    ([1, 2], "body"),
])
async def test_bad_pool_bodies(api, body, field) -> None:
    await setup_pool(api, "p1", hosts=1)
    before = await snapshot(api)
    r = await api.put("/api/v1/pools/p1", json=body, headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, field)
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert await snapshot(api) == before


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"pool": "nope"}, 404, "pool"),
    ({"pool": "p1", "profile": {"width": 100000, "height": 100000}}, 422, "profile.width"),
    ({"pool": "p1", "profile": {"width": 1280, "height": 721}}, 422, "profile.height"),
    ({"pool": "p1", "profile": {"fps": 0}}, 422, "profile.fps"),
    ({"pool": "p1", "profile": {"codec": "mpeg2"}}, 422, "profile.codec"),
    ({"pool": "p1", "profile": {"bitrate": 5}}, 422, "profile.bitrate"),
    ({"pool": "p1", "extra": 1}, 422, "extra"),
    ({}, 422, "pool"),
    ({"pool": 5}, 422, "pool"),
    ({"pool": "../etc"}, 422, "pool"),
])
async def test_bad_session_requests(api, body, status, field) -> None:
    await setup_pool(api, "p1", hosts=1)
    tok = await user_token(api, "alice")
    before = await snapshot(api)
    r = await api.post("/api/v1/sessions", json=body, headers=auth(tok))
    assert_problem(r.status, await r.json(), status, field)
    assert await snapshot(api) == before


async def test_malformed_json_and_oversized_bodies(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    tok = await user_token(api, "alice")
    before = await snapshot(api)
    r = await api.post("/api/v1/sessions", data=b"{not json", headers={**auth(tok), "Content-Type": "application/json"})
    assert_problem(r.status, await r.json(), 400, "body")
    r = await api.post("/api/v1/sessions", data=b'{"pool":"' + b"x" * 70_000 + b'"}', headers=auth(tok))
    assert r.status == 413 and (await r.json())["field"] == "body"
    assert await snapshot(api) == before


@pytest.mark.parametrize(("body", "field"), [
    ({"id": "h1", "pool": "p1", "address": "a:1", "gpus": []}, "gpus"),
    ({"id": "h1", "pool": "p1", "address": "a:1", "gpus": [{"index": 0, "vram_mb": -5}]}, "gpus[0].vram_mb"),
    ({"id": "h1", "pool": "p1", "address": "a:1", "gpus": [gpu(0), gpu(0)]}, "gpus[1].index"),
    ({"id": "H 1", "pool": "p1", "address": "a:1", "gpus": [gpu()]}, "id"),
    ({"id": "h1", "pool": "ghost", "address": "a:1", "gpus": [gpu()]}, "pool"),
    ({"id": "h1", "pool": "p1", "gpus": [gpu()]}, "address"),
    ({"id": "h1", "pool": "p1", "address": "a:1", "gpus": [gpu()], "version": "\u0095\u009a2.0"}, "version"),
    ({"id": "h1", "pool": "p1", "address": "a:1", "gpus": [gpu()], "version": " 2.0"}, "version"),
    ({"id": "h1", "pool": "p1", "address": "a:1", "gpus": [gpu()], "version": "2.0\n"}, "version"),
])
async def test_bad_host_registrations(api, body, field) -> None:
    await setup_pool(api, "p1", hosts=0)
    before = await snapshot(api)
    r = await api.post("/api/v1/hosts", json=body, headers=auth(NODE))
    data = await r.json()
    assert 400 <= r.status < 500 and data["field"] == field, data
    assert await snapshot(api) == before


async def test_heartbeat_bad_values_and_unknown_host(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    r = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={"gpus": [{"index": 0, "utilization": 250}]},
                      headers=auth(NODE))
    assert_problem(r.status, await r.json(), 422, "gpus[0].utilization")
    r = await api.put("/api/v1/hosts/ghost/heartbeat", json={}, headers=auth(NODE))
    body = await r.json()
    assert r.status == 404 and body["reregister"] is True


async def test_token_minting_validation(api) -> None:
    r = await api.post("/api/v1/tokens", json={"user": "a b"}, headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, "user")
    r = await api.post("/api/v1/tokens", json={"user": "bob\n"}, headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, "user")
    r = await api.post("/api/v1/tokens", json={"user": "ok", "ttl_s": 1}, headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, "ttl_s")
    tok = await user_token(api, "bob")
    r = await api.post("/api/v1/tokens", json={"user": "eve"}, headers=auth(tok))
    assert_problem(r.status, await r.json(), 403, None)


async def test_unknown_route_is_a_json_problem(api) -> None:
    r = await api.get("/api/v1/nothing-here")
    assert r.status == 404 and (await r.json())["code"] == "not_found"
    r = await api.get("/api/v1/audit?limit=abc", headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, "limit")


@pytest.mark.parametrize(("method", "path", "field"), [
    ("DELETE", "/api/v1/pools/kq:queue", "pool"),
    ("DELETE", "/api/v1/pools/kq:hosts", "pool"),
    ("GET", "/api/v1/pools/kq:queue", "pool"),
    ("GET", "/api/v1/hosts/h0:lease", "host"),
    ("DELETE", "/api/v1/hosts/h0:sessions?force=true", "host"),
    ("GET", "/api/v1/sessions/abc:def", "session"),
    ("GET", "/api/v1/sessions/ZZZ", "session"),
    # a trailing newline: a regex's "$" matches before it, so names are checked with fullmatch
    ("PUT", "/api/v1/pools/kq%0A", "pool"),
    ("GET", "/api/v1/hosts/h0%0A", "host"),
    ("GET", "/api/v1/sessions/" + "a" * 32 + "%0A", "session"),
])
async def test_key_syntax_in_a_path_never_reaches_redis(api, method, path, field) -> None:
    await setup_pool(api, "kq", hosts=1)
    before = await snapshot(api)
    r = await api.request(method, path, headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, field)
    assert await snapshot(api) == before
    assert (await api.get("/api/v1/pools/kq", headers=auth(ADMIN))).status == 200


@pytest.mark.parametrize(("raw", "detail"), [
    ("[" * 20_000 + "]" * 20_000, "nested too deeply"),
    ('{"a":' * 40 + "1" + "}" * 40, "nested deeper than 32"),
    ('{"max_sessions_per_gpu": NaN}', "not valid JSON"),
    ('{"max_sessions_per_gpu": Infinity}', "not valid JSON"),
])
async def test_pathological_json_is_a_400_not_a_500(api, raw, detail) -> None:
    r = await api.put("/api/v1/pools/p1", data=raw, headers={**auth(ADMIN), "Content-Type": "application/json"})
    body = await r.json()
    assert_problem(r.status, body, 400, "body")
    assert detail in body["detail"]


async def test_tokens_in_rest_urls_are_not_accepted(api) -> None:
    r = await api.get(f"/api/v1/pools?access_token={ADMIN}")
    assert r.status == 401, await r.text()
    assert (await api.get("/api/v1/pools", headers=auth(ADMIN))).status == 200


async def test_a_bad_signaling_frame_is_answered_and_the_socket_lives_on(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    token = await user_token(api, "u1")
    s = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(token))).json()
    async with api.ws_connect(f"/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
        for frame in ('{"type": ["offer"]}', "[" * 5000 + "]" * 5000, '"just a string"', "{not json"):
            await ws.send_str(frame)
            reply = await ws.receive_json(timeout=5)
            assert reply["type"] == "error" and reply["code"] == "bad_signal", (frame[:20], reply)
        assert not ws.closed


@pytest.mark.parametrize("version", ["", " 2.0", "2.0 ", "\u0095\u009a\ud984", "v\x002", "x" * 65])
async def test_a_rollout_refuses_a_version_no_host_could_report(api, version) -> None:
    """Versions are shown and compared as given: printable ASCII without outer blanks (schemathesis sent these)."""
    await setup_pool(api, "p1", hosts=1)
    before = await snapshot(api)
    r = await api.put("/api/v1/pools/p1/rollout", json={"candidate_version": version}, headers=auth(ADMIN))
    assert_problem(r.status, await r.json(), 422, "candidate_version")
    assert await snapshot(api) == before
