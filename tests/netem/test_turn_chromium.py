"""The product path through TURN: the broker's web client in headless Debian Chromium streams a game
session from a real render node that it cannot reach directly, relay-only, through coturn.

Topologies: the netem Lab (``lab.py``: node, router and viewer namespaces; the router drops every
packet forwarded between node and viewer and runs coturn on both of its addresses) and the NatLab
(``nat.py``: the viewer on a home LAN behind a masquerading router, coturn on a private address
behind a 1:1 NAT started with ``--external-ip``, the node on a public address the viewer's network
cannot reach).  The broker (``python -m broker serve`` on 0.0.0.0, its embedded Redis and a SQLite
file: the namespaces have no path to the machine's Redis) runs where both sides reach it (the Lab's
router, the NatLab's core) with ``BROKER_TURN_URLS`` / ``BROKER_TURN_SECRET`` set, so both sides get
the broker's per-session credentials.  The render node (``python -m streamer``, built-in game,
libx264) runs in the node namespace.  Chromium runs in the viewer namespace: Playwright's driver
stays here and launches a wrapper that ``exec``s ``ip netns exec <viewer ns> /usr/bin/chromium``
(the DevTools pipe is inherited through the exec; ``--no-sandbox`` as in every browser test).  The
page is opened with ``?relay=1`` (ICE transport policy "relay").

Cases (one fixture parameter each): TURN over UDP; TURN over TCP (``turn:host:3478?transport=tcp``)
with every UDP packet leaving the viewer's namespace dropped there; TURN over TLS
(``turns:host:5349?transport=tcp``, coturn with a test-CA certificate) with the viewer's UDP and
plain TCP 3478 dropped; and UDP through the NATs.  Asserted: frames decoded in the page; the page's
selected local candidate is ``relay`` over the expected transport (``relayProtocol``) and, behind
the NAT, on coturn's public address; an nft counter of that transport rose (TCP 3478, TLS 5349,
the NATs' translations); the node's heartbeat reports the session's path as ``relay``; and the
admin dashboard, opened in the same browser, shows the session's path badge as ``relay``.
Chromium verifies the TURN server's certificate (without help the TLS case never connects); it is
made to trust the test certificate with ``--ignore-certificate-errors-spki-list`` (the SHA-256 of
its public key), the node through ``SSL_CERT_FILE``.  Skipped, with the reason, without
root/namespaces, coturn or Chromium.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bench.common import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import ADMIN, NODE, SECRET
from tests.netem.coturn import SECRET as TURN_SECRET
from tests.netem.coturn import (
    TURN_PORT,
    TURNS_PORT,
    VIEWER_PLAIN_TURN_BLOCKED,
    VIEWER_UDP_BLOCKED,
    run_coturn,
    start_turn,
    viewer_turn_packets,
)
from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab, Netns, unavailable_reason
from tests.netem.nat import (
    CORE_NODE_IP,
    CORE_VIEWER_IP,
    EXTERNAL_IP,
    NODE_IP,
    TURN_PRIVATE_IP,
    TURN_PUBLIC_IP,
    NatLab,
)
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


# Every UDP packet leaving the viewer's namespace is dropped there (a network that lets only TCP out).
VIEWER_NS_UDP_BLOCKED = """table inet rbnoudp {
  chain output {
    type filter hook output priority filter; policy accept;
    oifname "eth0" meta l4proto udp counter drop comment "udp"
  }
}
"""


@dataclass
class Stage:
    """One topology with coturn up: where the broker and node go, and what the test must see."""

    lab: Netns
    broker_side: str  # the namespace role the broker runs in (both sides reach it)
    viewer_base: str  # the broker as the viewer reaches it
    node_env: dict[str, str]  # the node's environment for this topology (broker URL, addresses, trust)
    turn_url: str  # BROKER_TURN_URLS (node and viewer)
    relay_protocol: str  # how the page must reach coturn: udp | tcp | tls
    relay_address: str  # the relay address the page must be handed
    transport_packets: Callable[[], int]  # an nft counter that rises only if that transport carried the session
    chromium_args: list[str] = field(default_factory=list)  # TLS: trust the test certificate by its SPKI hash


def _http(lab: Netns, base: str, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    out = subprocess.run(["ip", "netns", "exec", lab.namespaces["viewer"], sys.executable, "-c", _HTTP, method,
                          base + path, token, json.dumps(body) if body is not None else ""], capture_output=True,
                         text=True, check=True, timeout=30).stdout
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


def _stage(kind: str, tmp_path: Path) -> Stage:
    """The topology of case ``kind`` with coturn up (the caller closes ``Stage.lab``)."""
    if kind == "nat":
        nat = NatLab()
        try:
            run_coturn(nat, "turn", [TURN_PRIVATE_IP], TURN_PRIVATE_IP, external_ip=EXTERNAL_IP)
        except BaseException:
            nat.close()
            raise
        return Stage(nat, "core", f"http://{CORE_VIEWER_IP}:{BROKER_PORT}",
                     {"NODE_BROKER_URL": f"http://{CORE_NODE_IP}:{BROKER_PORT}", "NODE_ADVERTISE_ADDRESSES": NODE_IP},
                     f"turn:{TURN_PUBLIC_IP}:{TURN_PORT}?transport=udp", "udp", TURN_PUBLIC_IP,
                     lambda: nat.counter("edge", "turn to viewer"))  # through both NATs
    lab = Lab()
    try:
        # one URL for both sides: the node reaches the router's viewer-side address too (local delivery)
        stage = Stage(lab, "router", f"http://{ROUTER_VIEWER_IP}:{BROKER_PORT}",
                      {"NODE_BROKER_URL": f"http://{ROUTER_NODE_IP}:{BROKER_PORT}",
                       "NODE_ADVERTISE_ADDRESSES": lab.node_ip},
                      f"turn:{ROUTER_VIEWER_IP}:{TURN_PORT}?transport={kind}", kind, ROUTER_NODE_IP,
                      lambda: viewer_turn_packets(lab, kind))
        if kind != "tls":
            start_turn(lab)
            if kind == "tcp":
                lab.nft("viewer", VIEWER_NS_UDP_BLOCKED)
            return stage
        ca = make_ca(tmp_path)
        cert, key = tmp_path / "turn.pem", tmp_path / "turn.key"
        ca.issue(cert, key, ips=(ROUTER_NODE_IP, ROUTER_VIEWER_IP))
        start_turn(lab, (cert, key))
        lab.router_nft(VIEWER_UDP_BLOCKED)
        lab.router_nft(VIEWER_PLAIN_TURN_BLOCKED)
        stage.turn_url = f"turns:{ROUTER_VIEWER_IP}:{TURNS_PORT}?transport=tcp"
        stage.node_env["SSL_CERT_FILE"] = str(ca.path)  # the node (aiortc) trusts the test CA
        stage.chromium_args = [f"--ignore-certificate-errors-spki-list={_spki_hash(cert)}"]
        return stage
    except BaseException:
        lab.close()
        raise


@pytest.fixture(params=["udp", "tcp", "tls", "nat"])
def stage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stage]:
    stage = _stage(request.param, tmp_path)
    lab, base = stage.lab, stage.viewer_base
    with lab:
        broker_log = tmp_path / "broker.log"
        env = {**os.environ, "BROKER_HOST": "0.0.0.0", "BROKER_PORT": str(BROKER_PORT), "BROKER_REDIS_URL": "",
               "BROKER_DATA_DIR": str(tmp_path / "data"), "BROKER_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}",
               "BROKER_ADMIN_TOKEN": ADMIN, "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET,
               "BROKER_REAPER_INTERVAL_S": "3600", "BROKER_SAMPLE_INTERVAL_S": "3600",
               "BROKER_AUTOSCALE_INTERVAL_S": "0", "BROKER_HOST_LEASE_TTL_S": "300", "BROKER_LOG_LEVEL": "warning",
               "BROKER_TURN_URLS": stage.turn_url, "BROKER_TURN_SECRET": TURN_SECRET}
        with open(broker_log, "ab") as log:
            broker = lab.popen(stage.broker_side, [sys.executable, "-m", "broker", "serve"], env=env, stdout=log,
                               stderr=log)
        _until("broker ready", lambda: _http(lab, base, "GET", "/readyz", "")[0] == 200 or None, broker, broker_log)
        status, body = _http(lab, base, "PUT", f"/api/v1/pools/{POOL}", ADMIN,
                             {"kind": "game", "max_sessions_per_gpu": 1})
        assert status in (200, 201), body
        node_log = tmp_path / "render-node.log"
        node_env = {**os.environ, "NODE_NODE_TOKEN": NODE, "NODE_HOST_ID": HOST, "NODE_POOL": POOL,
                    "NODE_SEATS": "1", "NODE_HEARTBEAT_INTERVAL_S": "1", "NODE_ENCODER": "libx264",
                    "NODE_LOG_LEVEL": "info", "NODE_SHUTDOWN_GRACE_S": "0", **session_user_env(), **stage.node_env}
        with open(node_log, "ab") as log:
            node = lab.popen("node", [sys.executable, "-m", "streamer"], env=node_env, stdout=log, stderr=log)
        _until("node registered", lambda: _http(lab, base, "GET", f"/api/v1/hosts/{HOST}", ADMIN)[0] == 200 or None,
               node, node_log)
        yield stage


def _spki_hash(cert_pem: Path) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


# The page's selected ICE pair's local candidate: type, address and (for a relay) how it reaches TURN.
_SELECTED_LOCAL = """async () => {
  const r = await window.renderBroker.pc.getStats();
  let pair = null;
  r.forEach((s) => {
    if (s.type === "transport" && s.selectedCandidatePairId) pair = r.get(s.selectedCandidatePairId);
  });
  const c = pair ? r.get(pair.localCandidateId) : null;
  return c ? { type: c.candidateType, address: c.address, relayProtocol: c.relayProtocol ?? null } : null;
}"""


async def test_a_chromium_viewer_streams_relay_only_through_turn(stage: Stage, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    lab, base = stage.lab, stage.viewer_base
    status, body = _http(lab, base, "POST", "/api/v1/tokens", ADMIN, {"user": "viewer", "ttl_s": 3600})
    assert status == 201, body
    token = body["token"]
    before = stage.transport_packets()
    wrapper = tmp_path / "chromium-in-viewer-ns"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {lab.namespaces["viewer"]} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    profile = tmp_path / "chromium-profile"
    async with async_playwright() as pw:
        ctx = await pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(wrapper), headless=True, args=[*CHROMIUM_ARGS, *stage.chromium_args],
            viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]})
        ctx.set_default_timeout(20_000)
        try:
            page = await ctx.new_page()
            errors = page_errors(page)
            await page.goto(f"{base}/?relay=1")
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
            local = await page.evaluate(_SELECTED_LOCAL)
            assert local == {"type": "relay", "address": stage.relay_address,
                             "relayProtocol": stage.relay_protocol}, local
            servers = await page.evaluate("window.renderBroker.pc.getConfiguration()")
            assert servers["iceTransportPolicy"] == "relay"
            assert [url for s in servers["iceServers"] for url in s["urls"]] == [stage.turn_url]
            await page.keyboard.press("F8")  # the stats overlay names the path too
            await page.wait_for_function("() => document.querySelector('#stats dl')?.textContent"
                                         ".includes('relay (TURN)')")
            candidate = await _node_candidate(lab, base, sid)  # while the page still streams
            assert candidate == "relay"  # what the node's heartbeat reports for the session
            badge = await _dashboard_path(ctx, base, sid)
            assert errors == [], errors
        finally:
            await ctx.close()
    shutil.rmtree(profile, ignore_errors=True)
    assert badge == "relay"  # and the admin dashboard shows
    assert stage.transport_packets() > before  # the session did travel over that transport / through the NATs


async def _node_candidate(lab: Netns, base: str, sid: str) -> str | None:
    """The session's path as the node's heartbeat last reported it (None until it reports one)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        status, host = await asyncio.to_thread(_http, lab, base, "GET", f"/api/v1/hosts/{HOST}", ADMIN)
        sessions = ((host.get("telemetry") or {}).get("sessions") or []) if status == 200 else []
        found = next((s["candidate"] for s in sessions if s.get("id") == sid and s.get("candidate")), None)
        if found is not None:
            return str(found)
        await asyncio.sleep(0.3)
    return None


async def _dashboard_path(ctx: Any, base: str, sid: str) -> str | None:
    """The path badge of session ``sid`` in the admin dashboard, opened in another tab of the browser."""
    admin = await ctx.new_page()
    errors = page_errors(admin)
    await admin.goto(f"{base}/web/admin.html")
    await admin.fill("#token", ADMIN)
    await admin.click("#signin-submit")
    badge = admin.locator(f'#sessions-table tr[data-session="{sid}"] [data-path]')
    await badge.wait_for()
    text, path = await badge.inner_text(), await badge.get_attribute("data-path")
    assert text == path and errors == [], (text, path, errors)
    await admin.close()
    return path
