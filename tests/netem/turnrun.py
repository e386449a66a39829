"""The parent side of ``turnpeer.py``: run an aiortc node and viewer (or a gathering viewer) in two
namespaces of a ``Netns`` topology and relay their signaling over pipes.

Synchronous, for tests: each call blocks until the peers report, at most ``DEADLINE_S``.  The peers
are started with ``lab.popen``, so ``lab.close()`` stops whatever a failing test leaves running.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from broker.auth import turn_credentials
from tests.netem.coturn import SECRET
from tests.netem.lab import Netns

PEER = str(Path(__file__).with_name("turnpeer.py"))
DEADLINE_S = 60.0


def ice(turn_url: str, session_id: str) -> list[dict[str, Any]]:
    """The ICE server list exactly as the broker hands it out (``broker.service.ice_servers``)."""
    user, password = turn_credentials(SECRET, session_id, time.time(), 600)
    return [{"urls": [turn_url], "username": user, "credential": password}]


def _line(stream: IO[str], proc: subprocess.Popen[str], deadline: float, what: str) -> dict[str, Any]:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()
            if not line:
                raise AssertionError(f"{what}: the peer exited ({proc.poll()})")
            return dict(json.loads(line))
    raise AssertionError(f"{what}: nothing within {DEADLINE_S} s")


def stream(lab: Netns, node_ice: list[dict[str, Any]], viewer_ice: list[dict[str, Any]], *, node_ip: str,
           viewer_ip: str, ca: Path | None = None) -> dict[str, Any]:
    """A game session from a node in ``lab``'s ``node`` namespace (offering ``node_ip``) to a
    relay-only viewer in its ``viewer`` namespace; ``ca``: a CA file both sides trust.  Returns the
    viewer's report (``frames``, ``stamps``, ``local_types``, ``relay_addresses`` or ``error``) with
    ``node_candidate``, the path the node reports for the session (its heartbeat's)."""
    env = {**os.environ, "SSL_CERT_FILE": str(ca)} if ca else None
    common: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "bufsize": 1,
                              "env": env}
    node = lab.popen("node", [sys.executable, PEER, "node", "--advertise", node_ip, "--ice", json.dumps(node_ice)],
                     **common)
    viewer = lab.popen("viewer", [sys.executable, PEER, "viewer", "--advertise", viewer_ip, "--relay-only",
                                  "--ice", json.dumps(viewer_ice)], **common)
    assert node.stdin and node.stdout and viewer.stdin and viewer.stdout
    deadline = time.monotonic() + DEADLINE_S
    offer = _line(viewer.stdout, viewer, deadline, "viewer offer")
    node.stdin.write(json.dumps(offer) + "\n")
    answer = _line(node.stdout, node, deadline, "node answer")
    viewer.stdin.write(json.dumps(answer) + "\n")
    result = _line(viewer.stdout, viewer, deadline, "viewer frames")
    if "error" not in result:
        node.stdin.write(json.dumps({"stats": True}) + "\n")
        result["node_candidate"] = _line(node.stdout, node, deadline, "node stats")["candidate"]
    node.stdin.close()
    viewer.stdin.close()
    return result


def start_gather(lab: Netns, side: str, ice_servers: list[dict[str, Any]],
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A relay-only viewer in ``side`` that only gathers candidates; read it with ``gathered``."""
    return lab.popen(side, [sys.executable, PEER, "viewer", "--advertise", "0.0.0.0", "--gather-only",
                            "--ice", json.dumps(ice_servers)], stdout=subprocess.PIPE, text=True, env=env)


def gathered(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """What a ``start_gather`` viewer found: ``local_types`` and ``relay_addresses``."""
    out, _ = proc.communicate(timeout=DEADLINE_S)
    return dict(json.loads(out))
