"""NAT traversal proven: a real coturn relays a game session between a node and a viewer that cannot
reach each other, with the broker's per-session TURN credentials (coturn ``use-auth-secret``).

Topology: the netem Lab's node and viewer namespaces; the router namespace runs coturn on both of
its addresses and drops every packet forwarded between node and viewer, so only the TURN server
joins them.  The viewer gathers relay candidates only (``iceTransportPolicy=relay``).  Cases:
TURN over UDP, and TURN over TCP with every UDP packet from the viewer to the router dropped (a
firewall that lets only TCP out).  Skipped, with the reason, where namespaces cannot be made or
coturn is not installed (Debian package coturn; scripts/setup.sh installs it).
"""

from __future__ import annotations

import json
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
from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab, unavailable_reason

PEER = str(Path(__file__).with_name("turnpeer.py"))
SECRET = "lab-turn-secret"
REALM = "render-broker.test"
TURN_PORT = 3478
DEADLINE_S = 60.0

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"network lab unavailable: {unavailable_reason()}"),
    pytest.mark.skipif(shutil.which("turnserver") is None,
                       reason="coturn is not installed (Debian package coturn; scripts/setup.sh installs it)"),
]

# Node <-> viewer forwarding is dropped: they share no path but the router's own TURN server.
NO_DIRECT_PATH = """table inet rbturn {
  chain forward {
    type filter hook forward priority -300; policy accept;
    ip saddr 10.231.1.0/24 ip daddr 10.231.2.0/24 counter drop
    ip saddr 10.231.2.0/24 ip daddr 10.231.1.0/24 counter drop
  }
}
"""
# A firewall on the viewer's side that lets no UDP out to the router (TURN must use TCP).
VIEWER_UDP_BLOCKED = """table inet rbturnudp {
  chain input {
    type filter hook input priority -300; policy accept;
    iifname "rviewer" meta l4proto udp counter drop
  }
}
"""


@pytest.fixture
def lab() -> Iterator[Lab]:
    with Lab() as lab:
        lab.router_nft(NO_DIRECT_PATH)
        turn = lab.popen("router", [
            "turnserver", "-n", "--no-cli", "--no-tls", "--no-dtls", "--use-auth-secret",
            f"--static-auth-secret={SECRET}", f"--realm={REALM}", f"--listening-ip={ROUTER_NODE_IP}",
            f"--listening-ip={ROUTER_VIEWER_IP}", f"--relay-ip={ROUTER_NODE_IP}", f"--listening-port={TURN_PORT}",
            "--min-port=49160", "--max-port=49260", "--log-file=stdout", "--simple-log", "--no-software-attribute",
            "--pidfile=/dev/null"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait_listening(lab, turn)
        yield lab


def _wait_listening(lab: Lab, turn: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if turn.poll() is not None:
            raise AssertionError(f"coturn exited: {turn.stdout.read() if turn.stdout else ''}")
        out = subprocess.run(["ip", "netns", "exec", lab.router_ns, "ss", "-lntu"], capture_output=True, text=True,
                             check=False).stdout
        if f"{ROUTER_VIEWER_IP}:{TURN_PORT}" in out and "tcp" in out and "udp" in out:
            return
        time.sleep(0.1)
    raise AssertionError("coturn did not listen in time")


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


def _stream_through_turn(lab: Lab, node_url: str, viewer_url: str) -> dict[str, Any]:
    session = "b3f1c0de" * 4
    common = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "bufsize": 1}
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
