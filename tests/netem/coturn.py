"""coturn for the netem tests, with ``use-auth-secret`` (the broker's per-session credentials).

``run_coturn`` starts it in any namespace of a ``Netns`` topology and returns once it listens;
``start_turn`` is the Lab's case: coturn in the router namespace on both router addresses, after
the router drops every packet forwarded between node and viewer (they then share no path but the
TURN server) and counts the viewer's packets to each TURN transport (``viewer_turn_packets``), so
a test can show which transport the media took.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab, Netns

SECRET = "lab-turn-secret"
REALM = "render-broker.test"
TURN_PORT = 3478
TURNS_PORT = 5349
RELAY_PORTS = (49160, 49260)  # coturn's relay port range (min, max)
START_TIMEOUT_S = 15.0

# Node <-> viewer forwarding is dropped: they share no path but the router's own TURN server.
NO_DIRECT_PATH = """table inet rbturn {
  chain forward {
    type filter hook forward priority -300; policy accept;
    ip saddr 10.231.1.0/24 ip daddr 10.231.2.0/24 counter drop
    ip saddr 10.231.2.0/24 ip daddr 10.231.1.0/24 counter drop
  }
}
"""

# Counts, at the router, the viewer's packets to each TURN transport (before any firewall below).
COUNTED_TABLE = "rbturncount"
VIEWER_TURN_COUNTED = f"""table inet {COUNTED_TABLE} {{
  chain input {{
    type filter hook input priority -400; policy accept;
    iifname "rviewer" udp dport {TURN_PORT} counter comment "udp"
    iifname "rviewer" tcp dport {TURN_PORT} counter comment "tcp"
    iifname "rviewer" tcp dport {TURNS_PORT} counter comment "tls"
  }}
}}
"""
# A firewall on the viewer's side that lets no UDP out to the router (TURN must use TCP).
VIEWER_UDP_BLOCKED = """table inet rbturnudp {
  chain input {
    type filter hook input priority -300; policy accept;
    iifname "rviewer" meta l4proto udp counter drop comment "udp"
  }
}
"""
# ... and no plain TCP to the TURN port either: only TLS on 5349 gets through.
VIEWER_PLAIN_TURN_BLOCKED = f"""table inet rbturntcp {{
  chain input {{
    type filter hook input priority -300; policy accept;
    iifname "rviewer" tcp dport {TURN_PORT} counter drop
  }}
}}
"""


def viewer_turn_packets(lab: Lab, transport: str) -> int:
    """Packets the viewer sent to the router's TURN server over ``transport`` (udp, tcp or tls)."""
    return lab.nft_counter("router", COUNTED_TABLE, transport)


def run_coturn(lab: Netns, side: str, listen: Sequence[str], relay_ip: str, *, port: int = TURN_PORT,
               tls: tuple[Path, Path] | None = None, external_ip: str | None = None,
               relay_ports: tuple[int, int] = RELAY_PORTS) -> subprocess.Popen[bytes]:
    """coturn in ``lab``'s namespace ``side`` on ``listen`` addresses (UDP and TCP ``port``; with
    ``tls`` (cert, key) also TLS on 5349), relaying from ``relay_ip``; ``external_ip`` is coturn's
    ``--external-ip`` (``PUBLIC/PRIVATE``: the relay address it hands out).  Returns once it listens;
    ``lab.close()`` stops it.  Its log is kept in a temporary file and shown if it fails to start."""
    tls_args = [f"--cert={tls[0]}", f"--pkey={tls[1]}", f"--tls-listening-port={TURNS_PORT}"] if tls else ["--no-tls"]
    nat_args = [f"--external-ip={external_ip}"] if external_ip else []
    log = tempfile.TemporaryFile()  # a pipe nobody reads could fill and block coturn
    turn = lab.popen(side, [
        "turnserver", "-n", "--no-cli", *tls_args, "--no-dtls", "--use-auth-secret",
        f"--static-auth-secret={SECRET}", f"--realm={REALM}", *(f"--listening-ip={ip}" for ip in listen),
        f"--relay-ip={relay_ip}", f"--listening-port={port}", *nat_args,
        f"--min-port={relay_ports[0]}", f"--max-port={relay_ports[1]}", "--log-file=stdout", "--simple-log",
        "--no-software-attribute", "--pidfile=/dev/null"], stdout=log, stderr=subprocess.STDOUT)
    wanted = [f"{ip}:{p}" for ip in listen for p in ((port, TURNS_PORT) if tls else (port,))]
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if turn.poll() is not None:
                log.seek(0)
                raise AssertionError(f"coturn exited: {log.read(4000).decode(errors='replace')}")
            out = subprocess.run(["ip", "netns", "exec", lab.namespaces[side], "ss", "-lntu"], capture_output=True,
                                 text=True, check=False).stdout
            if all(w in out for w in wanted) and "tcp" in out and "udp" in out:
                return turn
            time.sleep(0.1)
        raise AssertionError("coturn did not listen in time")
    finally:
        log.close()  # coturn keeps its own descriptor


def start_turn(lab: Lab, tls: tuple[Path, Path] | None = None) -> None:
    """coturn in the router on both its addresses, node and viewer cut apart, the viewer's packets to
    it counted; with ``tls`` (cert, key) also TLS on 5349."""
    lab.router_nft(NO_DIRECT_PATH)
    lab.router_nft(VIEWER_TURN_COUNTED)
    run_coturn(lab, "router", (ROUTER_NODE_IP, ROUTER_VIEWER_IP), ROUTER_NODE_IP, tls=tls)
