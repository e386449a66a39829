"""The network edge: address rules (pure), and a real broker serving HTTPS with an admin listener,
allow-lists and a certificate reloaded on SIGHUP."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from broker.auth import mint_user_token
from broker.embedded import free_port
from broker.errors import ValidationError
from broker.http.edge import client_address, parse_listen, parse_networks, role_allowed
from broker.protocol import Role
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import stop_process
from tests.tlsutil import CertAuthority, make_ca, served_serial

ip = ipaddress.ip_address


def test_networks_and_listen_addresses_are_parsed_or_refused_naming_the_setting() -> None:
    assert [str(n) for n in parse_networks("10.0.0.0/8, 192.168.1.7,::1", "admin_allow")] == \
        ["10.0.0.0/8", "192.168.1.7/32", "::1/128"]
    assert parse_networks(["10.1.2.3/8"], "node_allow")[0] == ipaddress.ip_network("10.0.0.0/8")
    with pytest.raises(ValidationError) as exc:
        parse_networks("10.0.0.0/8,not-an-ip", "node_allow")
    assert exc.value.field == "node_allow" and "not-an-ip" in exc.value.detail
    assert parse_listen("", "admin_listen") is None
    assert parse_listen("10.0.0.5:9090", "admin_listen") == ("10.0.0.5", 9090)
    assert parse_listen("[::1]:9090", "admin_listen") == ("::1", 9090)
    for bad in ("9090", "host:", "host:99999", ":80"):
        with pytest.raises(ValidationError) as exc:
            parse_listen(bad, "admin_listen")
        assert exc.value.field == "admin_listen"


@pytest.mark.parametrize(("peer", "xff", "expected"), [
    ("203.0.113.9", None, "203.0.113.9"),  # no proxy
    ("203.0.113.9", "10.0.0.1", "203.0.113.9"),  # an untrusted peer's header is ignored
    ("10.9.0.2", "198.51.100.7", "198.51.100.7"),  # through one trusted proxy
    ("10.9.0.2", "1.2.3.4, 198.51.100.7", "198.51.100.7"),  # what the client claimed (left) is not believed
    ("10.9.0.2", "198.51.100.7, 10.9.0.3", "198.51.100.7"),  # two trusted proxies in a row
    ("10.9.0.2", "10.9.0.3", "10.9.0.3"),  # only proxies: the left-most proxy
    ("10.9.0.2", "garbage", "10.9.0.2"),  # a malformed chain: only the peer is trusted
    ("not-an-address", None, None),
])
def test_the_client_address_believes_only_trusted_proxies(peer: str, xff: str | None, expected: str | None) -> None:
    got = client_address(peer, xff, parse_networks("10.9.0.0/24", "trusted_proxies"))
    assert (str(got) if got else None) == expected


def test_allow_lists_apply_per_role_and_users_are_never_restricted() -> None:
    admins, nodes = parse_networks("10.0.0.0/8", "a"), parse_networks("192.168.0.0/16", "n")
    assert role_allowed(Role.ADMIN, ip("10.1.1.1"), admins, nodes)
    assert not role_allowed(Role.ADMIN, ip("192.168.1.1"), admins, nodes)
    assert role_allowed(Role.NODE, ip("192.168.1.1"), admins, nodes)
    assert not role_allowed(Role.NODE, ip("10.1.1.1"), admins, nodes)
    assert not role_allowed(Role.NODE, None, admins, nodes)
    assert not role_allowed(Role.ADMIN, ip("::ffff:10.1.1.1"), admins, nodes)  # IPv6 never matches an IPv4 list
    assert role_allowed(Role.USER, ip("8.8.8.8"), admins, nodes)
    assert role_allowed(Role.ADMIN, ip("8.8.8.8"), (), ())  # empty lists allow every address


def _tail(log: Path, chars: int = 2000) -> str:
    return log.read_text()[-chars:]


@contextlib.asynccontextmanager
async def tls_broker(env: dict[str, str], log: Path, ca: CertAuthority, port: int) -> AsyncIterator[
        asyncio.subprocess.Process]:
    full = {**os.environ, **env, "BROKER_PORT": str(port), "BROKER_HOST": "127.0.0.1"}
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker", "serve", env=full,
                                                    stdout=fh, stderr=fh, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as http:
            while True:
                assert proc.returncode is None, _tail(log)
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with http.get(f"https://127.0.0.1:{port}/readyz", ssl=ca.client_context()) as r:
                        if r.status == 200:
                            break
                assert time.monotonic() < deadline, _tail(log)
                await asyncio.sleep(0.1)
        yield proc
    finally:
        await stop_process(proc)


async def test_https_admin_listener_allow_lists_and_sighup_reload(redis_url: str, prefix: str,
                                                                  tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    first = ca.issue(cert, key)
    port, admin_port = free_port(), free_port()
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_TLS_CERT": str(cert), "BROKER_TLS_KEY": str(key),
           "BROKER_ADMIN_LISTEN": f"127.0.0.1:{admin_port}", "BROKER_ADMIN_ALLOW": "127.0.0.0/8",
           "BROKER_NODE_ALLOW": "10.0.0.0/8"}  # nodes only from 10/8: this loopback caller is refused
    public, admin = f"https://127.0.0.1:{port}", f"https://127.0.0.1:{admin_port}"
    user = mint_user_token(SECRET, "alice", time.time(), 600)[0]
    async with tls_broker(env, tmp_path / "b.log", ca, port) as proc:
        ssl_ctx = ca.client_context()
        async with aiohttp.ClientSession() as http:
            # plain HTTP on the TLS port is not served
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                    await r.read()
            # the admin API: refused on the public listener, served on the admin one
            async with http.get(f"{public}/api/v1/pools", headers=auth(ADMIN), ssl=ssl_ctx) as r:
                body = await r.json()
                assert r.status == 403 and body["field"] == "Authorization" and "admin_listen" in body["detail"]
            async with http.put(f"{admin}/api/v1/pools/p1", headers=auth(ADMIN), ssl=ssl_ctx,
                                json={"max_sessions_per_gpu": 1}) as r:
                assert r.status in (200, 201), await r.text()
            # users are served on the public listener
            async with http.get(f"{public}/api/v1/pools", headers=auth(user), ssl=ssl_ctx) as r:
                assert r.status == 200, await r.text()
            # /metrics only on the admin listener
            async with http.get(f"{public}/metrics", ssl=ssl_ctx) as r:
                assert r.status == 404
            async with http.get(f"{admin}/metrics", ssl=ssl_ctx) as r:
                assert r.status == 200 and "render_broker" in await r.text()
            # a node token from outside node_allow is refused before anything is registered
            async with http.post(f"{public}/api/v1/hosts", headers=auth(NODE), ssl=ssl_ctx, json={
                    "id": "h1", "pool": "p1", "address": "10.0.0.1:7000",
                    "gpus": [{"index": 0, "model": "L4", "vram_mb": 24576}]}) as r:
                body = await r.json()
                assert r.status == 403 and body["field"] == "Authorization" and "node_allow" in body["detail"]
            async with http.get(f"{admin}/api/v1/hosts/h1", headers=auth(ADMIN), ssl=ssl_ctx) as r:
                assert r.status == 404

        assert await asyncio.to_thread(served_serial, "127.0.0.1", port, ca) == first
        # SIGHUP: a renewed certificate is served to new connections, on both listeners
        second = ca.issue(cert, key)
        proc.send_signal(signal.SIGHUP)
        for _ in range(50):
            if await asyncio.to_thread(served_serial, "127.0.0.1", port, ca) == second:
                break
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(served_serial, "127.0.0.1", port, ca) == second
        assert await asyncio.to_thread(served_serial, "127.0.0.1", admin_port, ca) == second
        # a half-written renewal is refused and the current certificate stays
        cert.write_text("-----BEGIN CERTIFICATE-----\ntruncated\n")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10  # the broker has handled the signal: it logged the refusal
        while "TLS reload failed, keeping the current certificate" not in _tail(tmp_path / "b.log", 1_000_000):
            assert time.monotonic() < deadline, _tail(tmp_path / "b.log")
            await asyncio.sleep(0.05)
        assert proc.returncode is None
        assert await asyncio.to_thread(served_serial, "127.0.0.1", port, ca) == second


@pytest.mark.parametrize(("env", "expected"), [
    ({"BROKER_TLS_CERT": "/nonexistent/cert.pem"}, "tls_cert and tls_key go together"),
    ({"BROKER_TLS_CERT": "/nonexistent/cert.pem", "BROKER_TLS_KEY": "/nonexistent/key.pem"},
     "cannot load tls_cert/tls_key"),
    ({"BROKER_ADMIN_LISTEN": "nowhere"}, "admin_listen: expected host:port"),
    ({"BROKER_NODE_ALLOW": "10.0.0.0/8,bogus"}, "node_allow: 'bogus' is not an address or CIDR"),
])
async def test_bad_edge_settings_are_one_line_and_exit_2(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "serve",
        env={**os.environ, "BROKER_DATA_DIR": str(tmp_path / "d"), "BROKER_PORT": str(free_port()), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    text = err.decode()
    assert "Traceback" not in text and expected in text, text


@pytest.mark.e2e
async def test_the_brokers_own_tls_carries_rest_sse_and_websockets(redis_url: str, prefix: str,
                                                                  tmp_path: Path) -> None:
    """No proxy: the broker serves HTTPS itself, and a real render node trusting the test CA registers over
    https, follows its commands over wss (start, then stop on delete) and reports the session ready, while
    the user's events stream over TLS shows it seated, running and ended."""
    from tests.infra.test_nginx import next_event
    from tests.streamer.node.test_node_e2e import node_process, start_session, wait_host

    ca = make_ca(tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.issue(cert, key)
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_TLS_CERT": str(cert), "BROKER_TLS_KEY": str(key)}
    node_log = tmp_path / "node.log"

    def node_lines(needle: str) -> list[str]:
        return [line for line in node_log.read_text().splitlines() if needle in line]

    async def node_logged(needle: str) -> None:
        deadline = time.monotonic() + 20
        while not node_lines(needle):
            assert time.monotonic() < deadline, f"the node never logged {needle!r}:\n{_tail(node_log)}"
            await asyncio.sleep(0.05)

    async with tls_broker(env, tmp_path / "b.log", ca, port), \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ca.client_context())) as http, \
            node_process(base, "game", "tls-node", node_log,
                         extra=("--broker-ca", str(ca.path), "--selftest-interval-s", "0")):
        async with http.put(f"{base}/api/v1/pools/game", json={"kind": "game", "max_sessions_per_gpu": 1},
                            headers=auth(ADMIN)) as r:
            assert r.status in (200, 201), await r.text()
        await wait_host(http, base, "tls-node")  # registered over https
        await node_logged("command socket open")  # the wss command socket is up before the session exists
        token, s = await start_session(http, base, "game", "game", "gamer", {"width": 320, "height": 240, "fps": 15})
        sid = s["id"]
        async with http.get(f"{base}/api/v1/sessions/{sid}/events", params={"access_token": token}) as events:
            assert events.status == 200 and events.headers["Content-Type"] == "text/event-stream"
            seen = [await next_event(events, 10)]
            while seen[-1]["state"] != "running":  # seated (starting), then running once the node says ready
                seen.append(await next_event(events, 20))
            assert [e["state"] for e in seen] in (["starting", "running"], ["running"]), seen
            assert all(e["host"] == "tls-node" for e in seen), seen
            await node_logged(f"command socket: start {sid}")
            async with http.delete(f"{base}/api/v1/sessions/{sid}", headers=auth(token)) as r:
                assert r.status in (200, 204), await r.text()
            ended = await next_event(events, 10)
            assert (ended["state"], ended["end_reason"]) == ("ended", "user")
        await node_logged(f"command socket: stop {sid}")
        await node_logged(f"session {sid} stopped: user")  # the stop command's reason (a heartbeat says "by broker")
        assert len(node_lines(f"command socket: start {sid}")) == 1, node_lines(sid)
