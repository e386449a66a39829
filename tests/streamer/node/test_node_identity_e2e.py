"""Per-host node identity and key rotation with real processes: a broker, a real render-node agent
running a session, and a second node ("x") that holds the shared node token and its own credential.

x cannot open the agent's command socket, report its session, drain it, delete it or take its id
over.  Then the broker is restarted twice on the same port, as a rotation rolls out: signing with a
new key while still verifying the old one (the agent keeps heartbeating, its credential is renewed,
old user tokens still work), then the new key alone (old user tokens are refused; the agent never
notices: no re-registration, its session keeps running, and it deregisters itself on shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.embedded import free_port
from tests.conftest import ADMIN, NODE, SECRET, auth, gpu
from tests.procs import stop_process, wait_ready
from tests.streamer.node.test_node_e2e import node_process, start_session, wait_host, wait_state

pytestmark = pytest.mark.e2e

NEW_SECRET = "rotated-hmac-secret-for-tests"
LIVE = {"running", "disconnected"}  # with no viewer, the node's heartbeats report the session disconnected


@contextlib.asynccontextmanager
async def broker_on(port: int, env: dict[str, str], log: Path) -> AsyncIterator[str]:
    """A ``render-broker serve`` child on a fixed port (so a restarted broker is where the node looks)."""
    full = {**os.environ, **env, "BROKER_PORT": str(port), "BROKER_HOST": "127.0.0.1"}
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker", "serve", env=full,
                                                    stdout=fh, stderr=fh, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc)
        yield url
    finally:
        # a replica holding a node's command socket takes over 10 s to exit on SIGTERM (measured here);
        # the rotation is about keys, so stop it sooner (SIGKILL after 3 s: a replica lost, state in Redis)
        await stop_process(proc, timeout_s=3)


async def host_view(http: aiohttp.ClientSession, url: str, host_id: str) -> dict[str, Any]:
    async with http.get(f"{url}/api/v1/hosts/{host_id}", headers=auth(ADMIN)) as r:
        assert r.status == 200, await r.text()
        view: dict[str, Any] = await r.json()
        return view


async def wait_heartbeat_after(http: aiohttp.ClientSession, url: str, host_id: str, after_ms: int) -> None:
    """Until the broker has accepted a heartbeat from the host that arrived after ``after_ms``."""
    deadline = time.monotonic() + 30
    while (await host_view(http, url, host_id))["heartbeat_ms"] <= after_ms:
        assert time.monotonic() < deadline, f"no heartbeat from {host_id} accepted after {after_ms}"
        await asyncio.sleep(0.1)


async def registrations(http: aiohttp.ClientSession, url: str, host_id: str) -> int:
    async with http.get(f"{url}/api/v1/audit?action=host.register", headers=auth(ADMIN)) as r:
        return sum(1 for e in (await r.json())["entries"] if e["target"] == host_id)


async def expect(r: aiohttp.ClientResponse, status: int, field: str) -> None:
    body = await r.json()
    assert (r.status, body.get("field")) == (status, field), body


async def test_node_x_cannot_act_for_a_live_agent_and_a_key_rotation_logs_nobody_out(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    port = free_port()
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_REAPER_INTERVAL_S": "0.5", "BROKER_LOG_LEVEL": "info",
           "BROKER_HOST_LEASE_TTL_S": "30"}  # outlasts a broker restart plus the node's reconnect backoff (5 s)
    log = tmp_path / "broker.log"
    base = f"http://127.0.0.1:{port}"
    # the node outlives three broker processes on the same port; it retries until the pool exists
    async with aiohttp.ClientSession() as http, node_process(base, "game", "node-y", tmp_path / "node.log") as node:
        async with broker_on(port, env, log) as url:
            user_token, s = await start_session(http, url, "game", "game", "gamer",
                                                {"width": 320, "height": 240, "fps": 15})
            sid = s["id"]
            await wait_host(http, url, "node-y")
            await wait_state(http, url, sid, user_token, {"running"})

            # ---- node x: registered with the shared token, holds its own credential ----
            async with http.post(f"{url}/api/v1/hosts", headers=auth(NODE), json={
                    "id": "node-x", "pool": "game", "address": "x:1", "gpus": [gpu(0)]}) as r:
                assert r.status == 201, await r.text()
                x = (await r.json())["node_credential"]["token"]
            for token in (x, NODE):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(f"{url}/api/v1/hosts/node-y/commands", headers=auth(token))
                assert refused.value.status == 403
            await expect(await http.put(f"{url}/api/v1/hosts/node-y/sessions/{sid}/state",
                                        json={"state": "ended"}, headers=auth(x)), 403, "host")
            await expect(await http.post(f"{url}/api/v1/hosts/node-y/drain", json={}, headers=auth(x)), 403, "host")
            await expect(await http.delete(f"{url}/api/v1/hosts/node-y?force=true", headers=auth(x)), 403, "host")
            await expect(await http.put(f"{url}/api/v1/hosts/node-y/heartbeat", json={}, headers=auth(x)),
                         403, "host")
            await expect(await http.post(f"{url}/api/v1/hosts", headers=auth(NODE), json={
                "id": "node-y", "pool": "game", "address": "evil:1", "gpus": [gpu(0)]}), 409, "id")
            y = await host_view(http, url, "node-y")
            assert (y["state"], y["alive"], y["sessions"]) == ("up", True, [sid]) and y["address"] != "evil:1"
            assert (await wait_state(http, url, sid, user_token, LIVE))["host"] == "node-y"
        stopped_ms = int(time.time() * 1000)  # no broker runs now: a later heartbeat reached the next one

        # ---- rotation, step 1: sign with the new key, verify the old one too ----
        overlap = {**env, "BROKER_SECRET": NEW_SECRET, "BROKER_PREVIOUS_SECRETS": SECRET}
        async with broker_on(port, overlap, log) as url:
            await wait_heartbeat_after(http, url, "node-y", stopped_ms)  # its reply carried a new credential
            async with http.get(f"{url}/api/v1/whoami", headers=auth(user_token)) as r:
                assert r.status == 200 and (await r.json())["name"] == "gamer"
        stopped_ms = int(time.time() * 1000)

        # ---- rotation, step 2: the old key removed ----
        async with broker_on(port, {**env, "BROKER_SECRET": NEW_SECRET}, log) as url:
            async with http.get(f"{url}/api/v1/whoami", headers=auth(user_token)) as r:
                assert r.status == 401 and "signature" in (await r.json())["detail"]
            await wait_heartbeat_after(http, url, "node-y", stopped_ms)
            first = (await host_view(http, url, "node-y"))["heartbeat_ms"]
            await wait_heartbeat_after(http, url, "node-y", first)  # and it keeps heartbeating
            assert await registrations(http, url, "node-y") == 1  # it never had to register again
            async with http.post(f"{url}/api/v1/tokens", json={"user": "gamer"}, headers=auth(ADMIN)) as r:
                fresh = (await r.json())["token"]
            assert (await wait_state(http, url, sid, fresh, LIVE))["host"] == "node-y"
            # the agent ends its session and deregisters itself with its (renewed) credential
            await stop_process(node)
            assert node.returncode == 0
            async with http.get(f"{url}/api/v1/hosts/node-y", headers=auth(ADMIN)) as r:
                assert r.status == 404, await r.text()
            assert (await wait_state(http, url, sid, fresh, {"ended"}))["end_reason"] == "node_ended"
