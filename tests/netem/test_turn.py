"""NAT traversal proven: a real coturn relays a game session between a node and a viewer that cannot
reach each other, with the broker's per-session TURN credentials (coturn ``use-auth-secret``).

Topology: the netem Lab's node and viewer namespaces; the router namespace runs coturn on both of
its addresses and drops every packet forwarded between node and viewer, so only the TURN server
joins them.  The viewer gathers relay candidates only (``iceTransportPolicy=relay``).  Cases:
TURN over UDP, TURN over TCP with every UDP packet from the viewer to the router dropped (a
firewall that lets only TCP out), and TURN over TLS (``turns:``, coturn on 5349 with a certificate
from a test CA) with the viewer's UDP and plain TCP 3478 both dropped.  aioice wraps a ``turns:``
connection in Python's default TLS context (certificate and host name verified against OpenSSL's
default trust, which ``SSL_CERT_FILE`` points at the test CA here); a viewer that does not trust
the CA gets no relay candidate.  Skipped, with the reason, where namespaces cannot be made or
coturn is not installed (Debian package coturn; scripts/setup.sh installs it).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from broker.auth import turn_credentials
from tests.netem.coturn import SECRET, TURN_PORT, TURNS_PORT, VIEWER_PLAIN_TURN_BLOCKED, VIEWER_UDP_BLOCKED, start_turn
from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab, unavailable_reason
from tests.tlsutil import make_ca

PEER = str(Path(__file__).with_name("turnpeer.py"))
DEADLINE_S = 60.0

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"network lab unavailable: {unavailable_reason()}"),
    pytest.mark.skipif(shutil.which("turnserver") is None,
                       reason="coturn is not installed (Debian package coturn; scripts/setup.sh installs it)"),
]

@pytest.fixture
def lab() -> Iterator[Lab]:
    with Lab() as lab:
        start_turn(lab)
        yield lab


@pytest.fixture
def tls_lab(tmp_path: Path) -> Iterator[tuple[Lab, Path]]:
    """The lab with coturn also on TLS 5349 (a leaf for both router addresses); yields the CA file."""
    ca = make_ca(tmp_path)
    cert, key = tmp_path / "turn.pem", tmp_path / "turn.key"
    ca.issue(cert, key, ips=(ROUTER_NODE_IP, ROUTER_VIEWER_IP))
    with Lab() as lab:
        start_turn(lab, (cert, key))
        yield lab, ca.path


def _ice(turn_url: str, session_id: str) -> str:
    """The ICE server list exactly as the broker hands it out (``broker.service.ice_servers``)."""
    user, password = turn_credentials(SECRET, session_id, time.time(), 600)
    return json.dumps([{"urls": [turn_url], "username": user, "credential": password}])


def _line(stream: IO[str], proc: subprocess.Popen[str], deadline: float, what: str) -> dict[str, Any]:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()
            if not line:
                raise AssertionError(f"{what}: the peer exited ({proc.poll()})")
            return dict(json.loads(line))
    raise AssertionError(f"{what}: nothing within {DEADLINE_S} s")


def _stream_through_turn(lab: Lab, node_url: str, viewer_url: str, ca: Path | None = None) -> dict[str, Any]:
    session = "b3f1c0de" * 4
    env = {**os.environ, "SSL_CERT_FILE": str(ca)} if ca else None  # both sides trust the test CA
    common = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "bufsize": 1, "env": env}
    node = lab.popen("node", [sys.executable, PEER, "node", "--advertise", lab.node_ip,
                              "--ice", _ice(node_url, session)], **common)
    viewer = lab.popen("viewer", [sys.executable, PEER, "viewer", "--advertise", lab.viewer_ip, "--relay-only",
                                  "--ice", _ice(viewer_url, session)], **common)
    assert node.stdin and node.stdout and viewer.stdin and viewer.stdout
    deadline = time.monotonic() + DEADLINE_S
    offer = _line(viewer.stdout, viewer, deadline, "viewer offer")
    node.stdin.write(json.dumps(offer) + "\n")
    answer = _line(node.stdout, node, deadline, "node answer")
    viewer.stdin.write(json.dumps(answer) + "\n")
    result = _line(viewer.stdout, viewer, deadline, "viewer frames")
    node.stdin.write(json.dumps({"stats": True}) + "\n")
    result["node_candidate"] = _line(node.stdout, node, deadline, "node stats")["candidate"]
    node.stdin.close()
    viewer.stdin.close()
    return result


def test_a_session_streams_through_turn_over_udp(lab: Lab) -> None:
    result = _stream_through_turn(lab, f"turn:{ROUTER_NODE_IP}:{TURN_PORT}?transport=udp",
                                  f"turn:{ROUTER_VIEWER_IP}:{TURN_PORT}?transport=udp")
    assert "error" not in result, result
    assert result["frames"] >= 30 and result["stamps"] >= 1
    assert result["local_types"] == ["relay"]  # the viewer had nothing but its TURN allocation
    assert result["node_candidate"] == "relay"  # what the node reports in its heartbeat (dashboard, metrics)


def test_with_udp_blocked_the_session_streams_through_turn_over_tcp(lab: Lab) -> None:
    lab.router_nft(VIEWER_UDP_BLOCKED)
    result = _stream_through_turn(lab, f"turn:{ROUTER_NODE_IP}:{TURN_PORT}?transport=udp",
                                  f"turn:{ROUTER_VIEWER_IP}:{TURN_PORT}?transport=tcp")
    assert "error" not in result, result
    assert result["frames"] >= 30 and result["stamps"] >= 1
    assert result["local_types"] == ["relay"]
    assert result["node_candidate"] == "relay"
    dropped = subprocess.run(["ip", "netns", "exec", lab.router_ns, "nft", "list", "table", "inet", "rbturnudp"],
                             capture_output=True, text=True, check=True).stdout
    assert "counter packets" in dropped


def test_with_udp_and_plain_tcp_blocked_the_session_streams_through_turn_over_tls(tls_lab: tuple[Lab, Path]) -> None:
    lab, ca = tls_lab
    lab.router_nft(VIEWER_UDP_BLOCKED)
    lab.router_nft(VIEWER_PLAIN_TURN_BLOCKED)
    # the same turns: URL form on both sides, as BROKER_TURN_URLS would hand it to node and viewer
    result = _stream_through_turn(lab, f"turns:{ROUTER_NODE_IP}:{TURNS_PORT}?transport=tcp",
                                  f"turns:{ROUTER_VIEWER_IP}:{TURNS_PORT}?transport=tcp", ca)
    assert "error" not in result, result
    assert result["frames"] >= 30 and result["stamps"] >= 1
    assert result["local_types"] == ["relay"]
    assert result["node_candidate"] == "relay"
    rules = subprocess.run(["ip", "netns", "exec", lab.router_ns, "nft", "list", "ruleset"],
                           capture_output=True, text=True, check=True).stdout
    tls_line = next(line for line in rules.splitlines() if f"dport {TURNS_PORT}" in line)
    assert "counter packets 0 " not in tls_line, tls_line  # the media did travel over TLS to 5349


def test_a_viewer_that_does_not_trust_the_turn_certificate_gets_no_relay(tls_lab: tuple[Lab, Path]) -> None:
    lab, ca = tls_lab
    url = f"turns:{ROUTER_VIEWER_IP}:{TURNS_PORT}?transport=tcp"
    args = [sys.executable, PEER, "viewer", "--advertise", lab.viewer_ip, "--gather-only", "--ice",
            _ice(url, "c0ffee00" * 4)]
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    untrusted = lab.popen("viewer", args, stdout=subprocess.PIPE, text=True, env=env)
    trusted = lab.popen("viewer", args, stdout=subprocess.PIPE, text=True, env={**env, "SSL_CERT_FILE": str(ca)})
    out_untrusted, _ = untrusted.communicate(timeout=DEADLINE_S)
    out_trusted, _ = trusted.communicate(timeout=DEADLINE_S)
    assert json.loads(out_untrusted)["local_types"] == []  # certificate verification is on
    assert json.loads(out_trusted)["local_types"] == ["relay"]
