"""coturn for the netem tests: started in a Lab's router namespace on both router addresses, with
``use-auth-secret`` (the broker's per-session credentials), after the router drops every packet
forwarded between node and viewer (they then share no path but the TURN server)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.netem.lab import ROUTER_NODE_IP, ROUTER_VIEWER_IP, Lab

SECRET = "lab-turn-secret"
REALM = "render-broker.test"
TURN_PORT = 3478
TURNS_PORT = 5349

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
# ... and no plain TCP to the TURN port either: only TLS on 5349 gets through.
VIEWER_PLAIN_TURN_BLOCKED = f"""table inet rbturntcp {{
  chain input {{
    type filter hook input priority -300; policy accept;
    iifname "rviewer" tcp dport {TURN_PORT} counter drop
    iifname "rviewer" tcp dport {TURNS_PORT} counter accept
  }}
}}
"""


def start_turn(lab: Lab, tls: tuple[Path, Path] | None = None) -> None:
    """coturn in the router on both its addresses; with ``tls`` (cert, key) also TLS on 5349."""
    lab.router_nft(NO_DIRECT_PATH)
    tls_args = [f"--cert={tls[0]}", f"--pkey={tls[1]}", f"--tls-listening-port={TURNS_PORT}"] if tls else ["--no-tls"]
    turn = lab.popen("router", [
        "turnserver", "-n", "--no-cli", *tls_args, "--no-dtls", "--use-auth-secret",
        f"--static-auth-secret={SECRET}", f"--realm={REALM}", f"--listening-ip={ROUTER_NODE_IP}",
        f"--listening-ip={ROUTER_VIEWER_IP}", f"--relay-ip={ROUTER_NODE_IP}", f"--listening-port={TURN_PORT}",
        "--min-port=49160", "--max-port=49260", "--log-file=stdout", "--simple-log", "--no-software-attribute",
        "--pidfile=/dev/null"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wanted = [f"{ROUTER_VIEWER_IP}:{TURN_PORT}"] + ([f"{ROUTER_VIEWER_IP}:{TURNS_PORT}"] if tls else [])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if turn.poll() is not None:
            raise AssertionError(f"coturn exited: {turn.stdout.read() if turn.stdout else ''}")
        out = subprocess.run(["ip", "netns", "exec", lab.router_ns, "ss", "-lntu"], capture_output=True, text=True,
                             check=False).stdout
        if all(w in out for w in wanted) and "tcp" in out and "udp" in out:
            return
        time.sleep(0.1)
    raise AssertionError("coturn did not listen in time")
