"""infra/nginx/render-broker.conf in front of a real broker: TLS at nginx, REST, the events stream
and a node's command WebSocket all pass through, and the stream is not buffered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from broker.auth import mint_user_token
from broker.embedded import free_port
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import broker_process
from tests.tlsutil import CertAuthority, make_ca

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "infra" / "nginx" / "render-broker.conf"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (scripts/setup.sh installs nginx-light)")


def site_for_test(upstream: str, port: int, cert: Path, key: Path) -> str:
    """The shipped site with only its three "test:" lines rewritten (each must still be there)."""
    text = SITE.read_text()
    swaps = [("server 127.0.0.1:8080;", f"server {upstream};"), ("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;"),
             ("/etc/render-broker/tls/cert.pem", str(cert)), ("/etc/render-broker/tls/key.pem", str(key))]
    for old, new in swaps:
        assert old in text, f"{SITE} no longer has {old!r}"
        text = text.replace(old, new)
    return text


@contextlib.contextmanager
def nginx(tmp: Path, site: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    assert NGINX is not None
    (tmp / "site.conf").write_text(site)
    temp = "".join(f"{k}_temp_path {tmp}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp / "nginx.conf").write_text(
        f"daemon off;\nmaster_process off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log info;\n"
        f"events {{ worker_connections 256; }}\n"
        f"http {{\n access_log off;\n{temp} include {tmp}/site.conf;\n}}\n")
    check = subprocess.run([NGINX, "-t", "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")])
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError):
                import socket

                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            assert proc.poll() is None, (tmp / "error.log").read_text()
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def next_event(resp: aiohttp.ClientResponse, timeout_s: float) -> dict[str, object]:
    while True:
        line = await asyncio.wait_for(resp.content.readline(), timeout_s)
        if line.startswith(b"data: "):
            return dict(json.loads(line[6:]))


async def test_nginx_passes_rest_sse_and_websockets_through(redis_url: str, prefix: str, tmp_path: Path) -> None:
    ca: CertAuthority = make_ca(tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.issue(cert, key)
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_TRUSTED_PROXIES": "127.0.0.1", "BROKER_NODE_ALLOW": "127.0.0.1"}
    port = free_port()
    async with broker_process(env, str(tmp_path / "broker.log")) as broker:
        with nginx(tmp_path, site_for_test(broker.url.removeprefix("http://"), port, cert, key), port):
            base, ssl_ctx = f"https://127.0.0.1:{port}", ca.client_context()
            user = mint_user_token(SECRET, "alice", time.time(), 600)[0]
            async with aiohttp.ClientSession() as http:
                r = await http.put(f"{base}/api/v1/pools/p1", json={"max_sessions_per_gpu": 1}, headers=auth(ADMIN),
                                   ssl=ssl_ctx)
                assert r.status in (200, 201), await r.text()
                r = await http.post(f"{base}/api/v1/hosts", headers=auth(NODE), ssl=ssl_ctx, json={
                    "id": "h1", "pool": "p1", "address": "10.0.0.1:7000",
                    "gpus": [{"index": 0, "model": "L4", "vram_mb": 24576}]})
                assert r.status == 201, await r.text()
                node = auth((await r.json())["node_credential"]["token"])
                # the node's command socket: an upgraded WebSocket through the proxy
                ws = await http.ws_connect(f"wss://127.0.0.1:{port}/api/v1/hosts/h1/commands", headers=node,
                                           ssl=ssl_ctx)
                r = await http.post(f"{base}/api/v1/sessions", json={"pool": "p1"}, headers=auth(user), ssl=ssl_ctx)
                assert r.status == 201, await r.text()
                sid = (await r.json())["id"]
                cmd = json.loads((await ws.receive(timeout=10)).data)
                assert cmd["cmd"] == "start" and cmd["session"]["id"] == sid
                # the events stream: each state change arrives at once (nothing buffered on the way)
                events = await http.get(f"{base}/api/v1/sessions/{sid}/events?access_token={user}", ssl=ssl_ctx)
                assert events.status == 200 and events.headers["Content-Type"] == "text/event-stream"
                assert (await next_event(events, 5))["state"] == "starting"
                t0 = time.monotonic()
                r = await http.put(f"{base}/api/v1/hosts/h1/sessions/{sid}/state", json={"state": "running"},
                                   headers=node, ssl=ssl_ctx)
                assert r.status == 200, await r.text()
                assert (await next_event(events, 5))["state"] == "running"
                assert time.monotonic() - t0 < 2.0
                r = await http.delete(f"{base}/api/v1/sessions/{sid}", headers=auth(user), ssl=ssl_ctx)
                assert r.status in (200, 204), await r.text()
                ended = await next_event(events, 5)
                assert ended["state"] == "ended" and ended["end_reason"] == "user"
                stop = json.loads((await ws.receive(timeout=10)).data)
                assert stop["cmd"] == "stop" and stop["session_id"] == sid
                events.close()
                await ws.close()
