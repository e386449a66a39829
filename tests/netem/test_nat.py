"""NAT traversal through real address translation (``tests/netem/nat.py``): the viewer on a home LAN
behind a masquerading router, coturn on a private address behind a 1:1 NAT and started with
``--external-ip PUBLIC/PRIVATE``, the render node on a public address that the viewer's network
cannot reach (nor the node the viewer's).

Cases: the topology translates and blocks as drawn (cheap TCP probes and the NAT counters); coturn
hands out its public relay address with ``external-ip`` and its private one without (a control
coturn on port 3479; asserted on the allocation's relayed address, which is what the peer is told
to send to); and an aiortc relay-only viewer streams a game session from the node's real session
path through coturn and both NATs.  The node there is given no TURN server (a host with a public
address): its only way to the viewer is the relay address coturn handed out, so the session
depends on ``external-ip`` (without it the viewer's relay candidate is 10.77.0.10, which the node
has no route to).  The Chromium case is in ``test_turn_chromium.py``.  Skipped, with the reason,
without root/namespaces or coturn.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.netem.coturn import TURN_PORT, run_coturn
from tests.netem.lab import unavailable_reason
from tests.netem.nat import (
    CORE_VIEWER_IP,
    EXTERNAL_IP,
    HOME_WAN_IP,
    NODE_IP,
    TURN_PRIVATE_IP,
    TURN_PUBLIC_IP,
    VIEWER_IP,
    NatLab,
)
from tests.netem.turnrun import gathered, ice, start_gather, stream

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"network lab unavailable: {unavailable_reason()}"),
    pytest.mark.skipif(shutil.which("turnserver") is None,
                       reason="coturn is not installed (Debian package coturn; scripts/setup.sh installs it)"),
]

PROBE_PORT = 7000
# Answers every TCP connection with the address it came from (run in a namespace until killed).
_WHOAMI = """import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
while True:
    c, addr = s.accept()
    c.sendall(addr[0].encode())
    c.close()
"""
# Connects to argv[1]:argv[2] and prints what the far side saw as our address, or why it could not.
_ASK = """import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5) as c:
        print(c.recv(64).decode())
except OSError as e:
    print("unreachable: " + type(e).__name__)
"""


@pytest.fixture
def nat() -> Iterator[NatLab]:
    with NatLab() as lab:
        yield lab


def _ask(nat: NatLab, side: str, ip: str) -> str:
    out = subprocess.run(["ip", "netns", "exec", nat.namespaces[side], sys.executable, "-c", _ASK, ip,
                          str(PROBE_PORT)], capture_output=True, text=True, check=True, timeout=10)
    return out.stdout.strip()


def test_the_topology_translates_addresses_and_joins_node_and_viewer_by_nothing(nat: NatLab) -> None:
    for side in ("core", "turn", "node"):
        server = nat.popen(side, [sys.executable, "-c", _WHOAMI, str(PROBE_PORT)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    assert _ask(nat, "viewer", CORE_VIEWER_IP) == HOME_WAN_IP  # the home router masquerades the viewer
    assert _ask(nat, "viewer", TURN_PUBLIC_IP) == HOME_WAN_IP  # the public address reaches coturn's host
    assert nat.counter("edge", "dnat") > 0
    assert _ask(nat, "turn", CORE_VIEWER_IP) == TURN_PUBLIC_IP  # and coturn's host is seen by its public one
    assert nat.counter("edge", "snat") > 0
    assert _ask(nat, "node", TURN_PUBLIC_IP) == NODE_IP
    # no direct path: the viewer's network and the node's are cut at the core, private LANs unrouted
    assert _ask(nat, "viewer", NODE_IP) == "unreachable: TimeoutError"
    assert nat.counter("core", "viewer to node") > 0
    assert _ask(nat, "node", HOME_WAN_IP) == "unreachable: TimeoutError"
    assert nat.counter("core", "node to viewer") > 0
    assert _ask(nat, "node", VIEWER_IP).startswith("unreachable")
    assert _ask(nat, "node", TURN_PRIVATE_IP).startswith("unreachable")


def test_coturn_hands_out_its_public_relay_address_only_with_external_ip(nat: NatLab) -> None:
    run_coturn(nat, "turn", [TURN_PRIVATE_IP], TURN_PRIVATE_IP, external_ip=EXTERNAL_IP)
    control_port = TURN_PORT + 1  # the control: the same coturn without --external-ip
    run_coturn(nat, "turn", [TURN_PRIVATE_IP], TURN_PRIVATE_IP, port=control_port, relay_ports=(49300, 49400))
    mapped = start_gather(nat, "viewer", ice(f"turn:{TURN_PUBLIC_IP}:{TURN_PORT}?transport=udp", "a1" * 16))
    control = start_gather(nat, "viewer", ice(f"turn:{TURN_PUBLIC_IP}:{control_port}?transport=udp", "a2" * 16))
    assert gathered(mapped) == {"local_types": ["relay"], "relay_addresses": [TURN_PUBLIC_IP]}
    # without external-ip the allocation names the private address: a peer outside cannot send to it
    assert gathered(control) == {"local_types": ["relay"], "relay_addresses": [TURN_PRIVATE_IP]}


def test_an_aiortc_viewer_behind_nat_streams_through_turn(nat: NatLab) -> None:
    run_coturn(nat, "turn", [TURN_PRIVATE_IP], TURN_PRIVATE_IP, external_ip=EXTERNAL_IP)
    viewer_ice = ice(f"turn:{TURN_PUBLIC_IP}:{TURN_PORT}?transport=udp", "b3f1c0de" * 4)
    result = stream(nat, [], viewer_ice, node_ip=NODE_IP, viewer_ip=VIEWER_IP)
    assert "error" not in result, result
    assert result["frames"] >= 30 and result["stamps"] >= 1
    assert result["local_types"] == ["relay"] and result["relay_addresses"] == [TURN_PUBLIC_IP]
    assert result["node_candidate"] == "relay"
    assert nat.counter("home", "masquerade") > 0  # the viewer's packets were translated on the way out
    # every packet between coturn and the viewer crossed both NATs (media one way, RTCP and checks back)
    assert nat.counter("edge", "turn to viewer") > 30 and nat.counter("edge", "viewer to turn") > 0
    # viewer -> coturn and node -> the viewer's relay address: both flows entered at the public address
    assert nat.counter("edge", "dnat") >= 2
