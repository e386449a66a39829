"""The product path through TURN: the broker's web client in headless Debian Chromium streams a game
session from a real render node that it cannot reach directly, relay-only, through coturn.

Topology: the netem Lab.  The router namespace runs coturn (``use-auth-secret``, UDP 3478) and the
broker (``python -m broker serve`` on 0.0.0.0, its embedded Redis and a SQLite file: the lab has no
path to the machine's Redis), with ``BROKER_TURN_URLS`` / ``BROKER_TURN_SECRET`` set, so both sides
get the broker's per-session credentials.  The render node (``python -m streamer``, built-in game,
libx264) runs in the node namespace and reaches the broker at the router's node-side address.
Chromium runs in the viewer namespace: Playwright's driver stays here and launches a wrapper that
``exec``s ``ip netns exec <viewer ns> /usr/bin/chromium`` (the DevTools pipe is inherited through
the exec, so nothing else was needed; ``--no-sandbox`` as in every browser test).  The page is opened
with ``?relay=1`` (ICE transport policy "relay"), and the router drops every packet forwarded
between node and viewer.  Asserted: frames decoded in the page, the page's selected local candidate
is ``relay``, and the node's heartbeat reports the session's path as ``relay`` (the dashboard's badge).
Two cases: TURN over UDP, and TURN over TLS (``turns:host:5349?transport=tcp`` for both sides, coturn
with a test-CA certificate) with the viewer's UDP and plain TCP 3478 dropped.  Chromium verifies the
TURN server's certificate (without help the TLS case never connects); it is made to trust the test
certificate with ``--ignore-certificate-errors-spki-list`` (the SHA-256 of its public key), the node
through ``SSL_CERT_FILE``.  Skipped, with the reason, without root/namespaces, coturn or Chromium.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bench.common import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import ADMIN, NODE, SECRET
from tests.netem.coturn import SECRET as TURN_SECRET
from tests.netem.coturn import TURN_PORT, TURNS_PORT, VIEWER_PLAIN_TURN_BLOCKED, VIEWER_UDP_BLOCKED, start_turn
from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab, unavailable_reason
from tests.procs import session_user_env
from tests.tlsutil import make_ca
from tests.web.conftest import VIEWPORT, page_errors

BROKER_PORT = 8080  # the router namespace has its own port space
HOST = "turnnode"
POOL = "game"
DEADLINE_S = 60.0


def _skip_reason() -> str | None:
    if (reason := unavailable_reason()) is not None:
        return f"network lab unavailable: {reason}"
    if shutil.which("turnserver") is None:
        return "coturn is not installed (Debian package coturn; scripts/setup.sh installs it)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]

# One HTTP call made from inside a namespace (this process has no route into the lab).
_HTTP = """
import json, sys, urllib.error, urllib.request
method, url, token, body = sys.argv[1:5]
req = urllib.request.Request(url, method=method, data=body.encode() if body else None,
                             headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        print(json.dumps({"status": r.status, "body": json.loads(r.read() or b"null")}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except OSError as e:
    print(json.dumps({"status": 0, "body": str(e)}))
"""


def _http(lab: Lab, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    url = f"http://{ROUTER_VIEWER_IP}:{BROKER_PORT}{path}"
    out = subprocess.run(["ip", "netns", "exec", lab.viewer_ns, sys.executable, "-c", _HTTP, method, url, token,
                          json.dumps(body) if body is not None else ""], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    reply = json.loads(out)
    return int(reply["status"]), reply["body"]


def _until(what: str, probe: Any, proc: subprocess.Popen[Any], log: Path) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if (value := probe()) is not None:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {DEADLINE_S} s:\n{log.read_text()[-3000:]}")


@dataclass
class TurnLab:
    lab: Lab
    turn_url: str
    chromium_args: list[str]  # the TLS case: trust the test certificate by its key's SPKI hash


@pytest.fixture(params=["udp", "tls"])
def turn_lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TurnLab]:
    tls = request.param == "tls"
    with Lab() as lab:
        extra_env: dict[str, str] = {}
        chromium_args: list[str] = []
        if tls:
            ca = make_ca(tmp_path)
            cert, key = tmp_path / "turn.pem", tmp_path / "turn.key"
            ca.issue(cert, key, ips=(ROUTER_NODE_IP, ROUTER_VIEWER_IP))
            start_turn(lab, (cert, key))
            lab.router_nft(VIEWER_UDP_BLOCKED)
            lab.router_nft(VIEWER_PLAIN_TURN_BLOCKED)
            turn_url = f"turns:{ROUTER_VIEWER_IP}:{TURNS_PORT}?transport=tcp"
            extra_env = {"SSL_CERT_FILE": str(ca.path)}  # the node (aiortc) trusts the test CA
            chromium_args = [f"--ignore-certificate-errors-spki-list={_spki_hash(cert)}"]
        else:
            start_turn(lab)
            turn_url = f"turn:{ROUTER_VIEWER_IP}:{TURN_PORT}?transport=udp"
        broker_log = tmp_path / "broker.log"
        env = {**os.environ, "BROKER_HOST": "0.0.0.0", "BROKER_PORT": str(BROKER_PORT), "BROKER_REDIS_URL": "",
               "BROKER_DATA_DIR": str(tmp_path / "data"), "BROKER_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}",
               "BROKER_ADMIN_TOKEN": ADMIN, "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET,
               "BROKER_REAPER_INTERVAL_S": "3600", "BROKER_SAMPLE_INTERVAL_S": "3600",
               "BROKER_AUTOSCALE_INTERVAL_S": "0", "BROKER_HOST_LEASE_TTL_S": "300", "BROKER_LOG_LEVEL": "warning",
               # one URL for both sides: the node reaches the router's viewer-side address too (local delivery)
               "BROKER_TURN_URLS": turn_url,
               "BROKER_TURN_SECRET": TURN_SECRET}
        with open(broker_log, "ab") as log:
            broker = lab.popen("router", [sys.executable, "-m", "broker", "serve"], env=env, stdout=log, stderr=log)
        _until("broker ready", lambda: _http(lab, "GET", "/readyz", "")[0] == 200 or None, broker, broker_log)
        status, body = _http(lab, "PUT", f"/api/v1/pools/{POOL}", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
        assert status in (200, 201), body
        node_log = tmp_path / "render-node.log"
        node_env = {**os.environ, "NODE_BROKER_URL": f"http://{ROUTER_NODE_IP}:{BROKER_PORT}", "NODE_NODE_TOKEN": NODE,
                    "NODE_HOST_ID": HOST, "NODE_POOL": POOL, "NODE_ADVERTISE_ADDRESSES": lab.node_ip,
                    "NODE_SEATS": "1", "NODE_HEARTBEAT_INTERVAL_S": "1", "NODE_ENCODER": "libx264",
                    "NODE_LOG_LEVEL": "info", "NODE_SHUTDOWN_GRACE_S": "0", **session_user_env(), **extra_env}
        with open(node_log, "ab") as log:
            node = lab.popen("node", [sys.executable, "-m", "streamer"], env=node_env, stdout=log, stderr=log)
        _until("node registered", lambda: _http(lab, "GET", f"/api/v1/hosts/{HOST}", ADMIN)[0] == 200 or None,
               node, node_log)
        yield TurnLab(lab, turn_url, chromium_args)


def _tls_rule(lab: Lab) -> str:
    """The router's accept rule for TLS to 5349, with its packet counter."""
    rules = subprocess.run(["ip", "netns", "exec", lab.router_ns, "nft", "list", "table", "inet", "rbturntcp"],
                           capture_output=True, text=True, check=True).stdout
    return next(line for line in rules.splitlines() if f"dport {TURNS_PORT}" in line)


def _spki_hash(cert_pem: Path) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


async def test_a_chromium_viewer_streams_relay_only_through_turn(turn_lab: TurnLab, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    lab = turn_lab.lab
    status, body = _http(lab, "POST", "/api/v1/tokens", ADMIN, {"user": "viewer", "ttl_s": 3600})
    assert status == 201, body
    token = body["token"]
    wrapper = tmp_path / "chromium-in-viewer-ns"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {lab.viewer_ns} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    profile = tmp_path / "chromium-profile"
    async with async_playwright() as pw:
        ctx = await pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(wrapper), headless=True, args=[*CHROMIUM_ARGS, *turn_lab.chromium_args],
            viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]})
        ctx.set_default_timeout(20_000)
        try:
            page = await ctx.new_page()
            errors = page_errors(page)
            await page.goto(f"http://{ROUTER_VIEWER_IP}:{BROKER_PORT}/?relay=1")
            await page.fill("#token", token)
            await page.click("#signin-submit")
            await page.locator(f'#pools article[data-pool="{POOL}"] button').click()
            await page.locator('body[data-view="stream"]').wait_for(timeout=30_000)
            sid = await page.evaluate("window.renderBroker.sessionId")
            await page.wait_for_function("async () => { const s = await window.renderBroker.stats();"
                                         " return s && s.framesDecoded >= 30 && s.width > 0; }", timeout=30_000)
            stats = await page.evaluate("window.renderBroker.stats()")
            assert stats["connectionState"] == "connected" and stats["codec"] == "H264", stats
            assert stats["localCandidateType"] == "relay", stats  # the page had nothing but its TURN allocation
            servers = await page.evaluate("window.renderBroker.pc.getConfiguration()")
            assert servers["iceTransportPolicy"] == "relay"
            assert [url for s in servers["iceServers"] for url in s["urls"]] == [turn_lab.turn_url]
            await page.keyboard.press("F8")  # the stats overlay names the path too
            await page.wait_for_function("() => document.querySelector('#stats dl')?.textContent"
                                         ".includes('relay (TURN)')")
            candidate = await _node_candidate(lab, sid)  # while the page still streams
            assert errors == [], errors
        finally:
            await ctx.close()
    shutil.rmtree(profile, ignore_errors=True)
    if turn_lab.turn_url.startswith("turns:"):
        tls_line = _tls_rule(lab)
        assert "counter packets 0 " not in tls_line, tls_line  # the media did travel over TLS to 5349
    assert candidate == "relay"  # what the node's heartbeat reports and the dashboard shows for the session


async def _node_candidate(lab: Lab, sid: str) -> str | None:
    """The session's path as the node's heartbeat last reported it (None until it reports one)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        status, host = await asyncio.to_thread(_http, lab, "GET", f"/api/v1/hosts/{HOST}", ADMIN)
        sessions = ((host.get("telemetry") or {}).get("sessions") or []) if status == 200 else []
        found = next((s["candidate"] for s in sessions if s.get("id") == sid and s.get("candidate")), None)
        if found is not None:
            return str(found)
        await asyncio.sleep(0.3)
    return None
