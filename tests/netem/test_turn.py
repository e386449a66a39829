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

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netem.coturn import (
    TURN_PORT,
    TURNS_PORT,
    VIEWER_PLAIN_TURN_BLOCKED,
    VIEWER_UDP_BLOCKED,
    start_turn,
    viewer_turn_packets,
)
from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab, unavailable_reason
from tests.netem.turnrun import gathered, ice, start_gather, stream
from tests.tlsutil import make_ca

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


def _stream_through_turn(lab: Lab, node_url: str, viewer_url: str, ca: Path | None = None) -> dict[str, Any]:
    session = "b3f1c0de" * 4
    return stream(lab, ice(node_url, session), ice(viewer_url, session), node_ip=lab.node_ip,
                  viewer_ip=lab.viewer_ip, ca=ca)


def test_a_session_streams_through_turn_over_udp(lab: Lab) -> None:
    result = _stream_through_turn(lab, f"turn:{ROUTER_NODE_IP}:{TURN_PORT}?transport=udp",
                                  f"turn:{ROUTER_VIEWER_IP}:{TURN_PORT}?transport=udp")
    assert "error" not in result, result
    assert result["frames"] >= 30 and result["stamps"] >= 1
    assert result["local_types"] == ["relay"]  # the viewer had nothing but its TURN allocation
    assert result["node_candidate"] == "relay"  # what the node reports in its heartbeat (dashboard, metrics)
    assert viewer_turn_packets(lab, "udp") > 0


def test_with_udp_blocked_the_session_streams_through_turn_over_tcp(lab: Lab) -> None:
    lab.router_nft(VIEWER_UDP_BLOCKED)
    result = _stream_through_turn(lab, f"turn:{ROUTER_NODE_IP}:{TURN_PORT}?transport=udp",
                                  f"turn:{ROUTER_VIEWER_IP}:{TURN_PORT}?transport=tcp")
    assert "error" not in result, result
    assert result["frames"] >= 30 and result["stamps"] >= 1
    assert result["local_types"] == ["relay"]
    assert result["node_candidate"] == "relay"
    assert viewer_turn_packets(lab, "tcp") > 0  # the media went over TCP to 3478


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
    assert viewer_turn_packets(lab, "tls") > 0  # the media did travel over TLS to 5349


def test_a_viewer_that_does_not_trust_the_turn_certificate_gets_no_relay(tls_lab: tuple[Lab, Path]) -> None:
    lab, ca = tls_lab
    servers = ice(f"turns:{ROUTER_VIEWER_IP}:{TURNS_PORT}?transport=tcp", "c0ffee00" * 4)
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    untrusted = start_gather(lab, "viewer", servers, env)
    trusted = start_gather(lab, "viewer", servers, {**env, "SSL_CERT_FILE": str(ca)})
    assert gathered(untrusted)["local_types"] == []  # certificate verification is on
    assert gathered(trusted)["local_types"] == ["relay"]
