"""Per-host node identity and HMAC key rotation, against a real broker app on real Redis and SQLite.

The shared node token only registers; registration answers with a credential bound to the host id,
and every per-host route (heartbeat, command socket, session state, drain/undrain, GET and DELETE
of the host) refuses a credential bound to another host with 403 naming the field, and the bare
node token with 403 naming ``Authorization``.  The bootstrap token cannot take over a live host by
registering its id.  Rotation: a broker signing with a new key and still verifying the old one keeps
old user tokens and node credentials working and renews the node's; once the old key is removed,
tokens it signed are refused.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from broker.auth import mint_node_credential, mint_user_token, verify_node_credential
from broker.errors import Unauthorized
from tests.conftest import ADMIN, NODE, SECRET, auth, gpu


def host_body(host_id: str, pool: str = "p1", address: str = "10.0.0.9:7000") -> dict[str, Any]:
    return {"id": host_id, "pool": pool, "address": address, "gpus": [gpu(0)]}


@pytest.fixture
async def strict(aiohttp_client, settings_factory, clock):  # type: ignore[no-untyped-def]
    """A broker app with the compatibility window off (the default of a real deployment)."""
    from broker.app import create_app

    return await aiohttp_client(create_app(settings_factory(node_token_any_host=False), clock=clock))


async def register(api, host_id: str, token: str = NODE) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = await api.post("/api/v1/hosts", json=host_body(host_id), headers=auth(token))
    assert r.status == 201, await r.text()
    body: dict[str, Any] = await r.json()
    return body


async def two_hosts_and_a_session(api) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    """Pool p1 with hosts x and y; a user's session seated on y.  Returns (x's credential, y's, session id)."""
    r = await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 1, "vram_per_session_mb": 1024},
                      headers=auth(ADMIN))
    assert r.status == 201, await r.text()
    y = (await register(api, "y"))["node_credential"]
    r = await api.post("/api/v1/tokens", json={"user": "alice"}, headers=auth(ADMIN))
    s = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth((await r.json())["token"]))).json()
    assert s["host"] == "y", s
    x = (await register(api, "x"))["node_credential"]
    return x["token"], y["token"], s["id"]


async def problem(r: aiohttp.ClientResponse, status: int, field: str) -> dict[str, Any]:
    body: dict[str, Any] = await r.json()
    assert (r.status, body.get("field")) == (status, field), body
    return body


async def test_registration_returns_a_credential_bound_to_the_host(strict) -> None:
    await strict.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))
    body = await register(strict, "h1")
    cred = body["node_credential"]
    assert cred["host"] == "h1" and cred["expires_at"] > time.time() + 3000
    assert verify_node_credential(SECRET, cred["token"], time.time()).host == "h1"
    who = await (await strict.get("/api/v1/whoami", headers=auth(cred["token"]))).json()
    assert who["role"] == "node" and who["host"] == "h1" and who["name"] == "h1"
    # the credential is a node credential, never a user: it cannot ask for a session
    r = await strict.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(cred["token"]))
    assert r.status in (403, 422), await r.text()


async def test_node_x_cannot_act_for_host_y(strict) -> None:
    x, y, sid = await two_hosts_and_a_session(strict)
    # command socket: refused before the upgrade, so x never receives y's start command
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await strict.ws_connect("/api/v1/hosts/y/commands", headers=auth(x))
    assert refused.value.status == 403
    await problem(await strict.put("/api/v1/hosts/y/heartbeat", json={"sessions": []}, headers=auth(x)), 403, "host")
    await problem(await strict.put(f"/api/v1/hosts/y/sessions/{sid}/state", json={"state": "ended"}, headers=auth(x)),
                  403, "host")
    await problem(await strict.put(f"/api/v1/hosts/y/sessions/{sid}/state", json={"state": "running"},
                                   headers=auth(x)), 403, "host")
    await problem(await strict.post("/api/v1/hosts/y/drain", json={"reason": "x says so"}, headers=auth(x)),
                  403, "host")
    await problem(await strict.post("/api/v1/hosts/y/undrain", json={}, headers=auth(x)), 403, "host")
    await problem(await strict.delete("/api/v1/hosts/y?force=true", headers=auth(x)), 403, "host")
    await problem(await strict.get("/api/v1/hosts/y", headers=auth(x)), 403, "host")
    await problem(await strict.get("/api/v1/hosts", headers=auth(x)), 403, "Authorization")
    # x re-registering under y's id with its own credential, or taking y's live id with the bootstrap token
    await problem(await strict.post("/api/v1/hosts", json=host_body("y", address="evil:1"), headers=auth(x)),
                  403, "id")
    await problem(await strict.post("/api/v1/hosts", json=host_body("y", address="evil:1"), headers=auth(NODE)),
                  409, "id")
    # nothing changed on y: up, same address, the session still starting there
    host = await (await strict.get("/api/v1/hosts/y", headers=auth(ADMIN))).json()
    assert (host["state"], host["alive"], host["address"], host["sessions"]) == ("up", True, "10.0.0.9:7000", [sid])
    s = await (await strict.get(f"/api/v1/sessions/{sid}", headers=auth(ADMIN))).json()
    assert (s["state"], s["host"]) == ("starting", "y")
    # y's own credential does all of it
    async with strict.ws_connect("/api/v1/hosts/y/commands", headers=auth(y)) as ws:
        start = await ws.receive_json(timeout=5)
        assert start["cmd"] == "start" and start["session"]["id"] == sid
    r = await strict.put(f"/api/v1/hosts/y/sessions/{sid}/state", json={"state": "running"}, headers=auth(y))
    assert r.status == 200, await r.text()
    r = await strict.put("/api/v1/hosts/y/heartbeat", json={"sessions": [{"id": sid, "state": "running"}]},
                         headers=auth(y))
    assert r.status == 200 and "node_credential" not in await r.json()  # fresh credential: no renewal
    assert (await strict.post("/api/v1/hosts/y/drain", json={"reason": "own"}, headers=auth(y))).status == 200
    assert (await strict.post("/api/v1/hosts/y/undrain", json={}, headers=auth(y))).status == 200
    audit = (await (await strict.get("/api/v1/audit?action=host.drain", headers=auth(ADMIN))).json())["entries"]
    assert [(e["actor"], e["role"], e["target"]) for e in audit] == [("y", "node", "y")]
    # y re-registers with its own credential while live (a reconnect), and gets a fresh one
    again = await register(strict, "y", token=y)
    assert again["node_credential"]["host"] == "y" and again["sessions"] == [sid]
    r = await strict.delete("/api/v1/hosts/y?force=true", headers=auth(y))
    assert r.status == 200 and (await r.json())["ended_sessions"] == [sid]
    # y deregistered itself (not retired): the bootstrap token registers the id again at once
    assert (await register(strict, "y"))["node_credential"]["host"] == "y"


async def test_the_bootstrap_token_only_registers(strict) -> None:
    _x, _y, sid = await two_hosts_and_a_session(strict)
    for method, path, body in (("PUT", "/api/v1/hosts/y/heartbeat", {}),
                               ("PUT", f"/api/v1/hosts/y/sessions/{sid}/state", {"state": "ended"}),
                               ("POST", "/api/v1/hosts/y/drain", {}), ("POST", "/api/v1/hosts/y/undrain", {}),
                               ("DELETE", "/api/v1/hosts/y?force=true", None), ("GET", "/api/v1/hosts/y", None),
                               ("GET", "/api/v1/hosts", None)):
        r = await strict.request(method, path, json=body, headers=auth(NODE))
        assert (await problem(r, 403, "Authorization"))["code"] == "forbidden", (method, path)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await strict.ws_connect("/api/v1/hosts/y/commands", headers=auth(NODE))
    assert refused.value.status == 403
    s = await (await strict.get(f"/api/v1/sessions/{sid}", headers=auth(ADMIN))).json()
    assert s["state"] == "starting"


async def test_an_admin_keeps_admin_powers_and_users_get_none(strict) -> None:
    _x, _y, sid = await two_hosts_and_a_session(strict)
    user = mint_user_token(SECRET, "alice", time.time(), 60)[0]
    assert (await strict.post("/api/v1/hosts/y/drain", json={}, headers=auth(user))).status == 403
    assert (await strict.put("/api/v1/hosts/y/heartbeat", json={}, headers=auth(ADMIN))).status == 403
    assert (await strict.get("/api/v1/hosts", headers=auth(ADMIN))).status == 200
    assert (await strict.post("/api/v1/hosts/y/drain", json={}, headers=auth(ADMIN))).status == 200
    r = await strict.delete("/api/v1/hosts/y?force=true", headers=auth(ADMIN))
    assert r.status == 200 and (await r.json())["ended_sessions"] == [sid]


async def test_the_compatibility_window_lets_the_bootstrap_token_act_and_hands_out_a_credential(api) -> None:
    """``node_token_any_host`` on (the test fixture's setting): a node registered before credentials
    keeps heartbeating with the shared token, and the reply carries its credential."""
    await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))
    await register(api, "old")
    r = await api.put("/api/v1/hosts/old/heartbeat", json={}, headers=auth(NODE))
    assert r.status == 200, await r.text()
    cred = (await r.json())["node_credential"]
    assert cred["host"] == "old"
    # a bound credential is still bound during the window
    other = (await register(api, "other"))["node_credential"]["token"]
    await problem(await api.put("/api/v1/hosts/old/heartbeat", json={}, headers=auth(other)), 403, "host")


async def test_a_credential_past_half_its_life_is_renewed_and_an_expired_one_is_refused(strict) -> None:
    await strict.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))
    await register(strict, "h1")
    old = mint_node_credential(SECRET, "h1", time.time(), 600)[0]  # < half of node_credential_ttl_s (3600) left
    r = await strict.put("/api/v1/hosts/h1/heartbeat", json={}, headers=auth(old))
    fresh = (await r.json())["node_credential"]
    assert r.status == 200 and fresh["expires_at"] >= time.time() + 3599 - 1
    dead = mint_node_credential(SECRET, "h1", time.time() - 7200, 3600)[0]
    r = await strict.put("/api/v1/hosts/h1/heartbeat", json={}, headers=auth(dead))
    assert r.status == 401 and "expired" in (await r.json())["detail"]


async def test_rotation_keeps_old_tokens_during_the_overlap_and_refuses_them_after(aiohttp_client, settings_factory,
                                                                                  clock) -> None:
    """Three broker replicas on one Redis, as a rotation rolls out: signing with the old key, signing
    with the new one while still verifying the old, then the new one alone."""
    from broker.app import create_app

    old_key, new_key = SECRET, "new-hmac-secret-for-tests"
    before = await aiohttp_client(create_app(settings_factory(node_token_any_host=False), clock=clock))
    overlap = await aiohttp_client(create_app(settings_factory(node_token_any_host=False, secret=new_key,
                                                               previous_secrets=[old_key]), clock=clock))
    after = await aiohttp_client(create_app(settings_factory(node_token_any_host=False, secret=new_key),
                                            clock=clock))
    await before.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))
    node_old = (await register(before, "h1"))["node_credential"]["token"]
    r = await before.post("/api/v1/tokens", json={"user": "alice", "ttl_s": 3600}, headers=auth(ADMIN))
    user_old = (await r.json())["token"]
    # overlap: both old tokens verify; the heartbeat reply renews the node's with the new key
    assert (await overlap.get("/api/v1/whoami", headers=auth(user_old))).status == 200
    r = await overlap.put("/api/v1/hosts/h1/heartbeat", json={}, headers=auth(node_old))
    assert r.status == 200, await r.text()
    node_new = (await r.json())["node_credential"]["token"]
    assert verify_node_credential(new_key, node_new, time.time()).host == "h1"
    with pytest.raises(Unauthorized):
        verify_node_credential(old_key, node_new, time.time())
    r = await overlap.post("/api/v1/tokens", json={"user": "bob"}, headers=auth(ADMIN))
    user_new = (await r.json())["token"]
    # the renewed credential, presented again, is not renewed again
    r = await overlap.put("/api/v1/hosts/h1/heartbeat", json={}, headers=auth(node_new))
    assert r.status == 200 and "node_credential" not in await r.json()
    # old key removed: what it signed is refused, what the new key signed works
    for token in (user_old, node_old):
        r = await after.get("/api/v1/whoami", headers=auth(token))
        assert r.status == 401 and "signature" in (await r.json())["detail"]
    assert (await after.put("/api/v1/hosts/h1/heartbeat", json={}, headers=auth(node_old))).status == 401
    assert (await after.put("/api/v1/hosts/h1/heartbeat", json={}, headers=auth(node_new))).status == 200
    assert (await (await after.get("/api/v1/whoami", headers=auth(user_new))).json())["name"] == "bob"
