"""Child program of ``test_turn.py`` and ``test_nat.py``: the node or the viewer of one game session,
in a namespace of a Lab or a NatLab.

``python tests/netem/turnpeer.py node --advertise IP --ice JSON``: the node's real session path
(``SessionRuntime``, built-in game, 320x240@30) with the broker-style ICE server list ``JSON``.
``python tests/netem/turnpeer.py viewer --advertise IP --ice JSON [--relay-only]``: the test viewer
(aiortc, decodes and reads the game stamp) with that ICE server list.

Signaling is JSON lines over stdin/stdout relayed by the parent (the namespaces share no network
path but the TURN server): the viewer prints ``{"sig": offer}``, the parent hands it to the node,
which prints ``{"sig": [replies]}``; the parent hands those to the viewer.  The viewer then prints
``{"frames": n, "stamps": k, "local_types": [...], "relay_addresses": [...]}`` once it decoded 30
frames (or ``{"error": ...}``) and keeps the connection up until its stdin closes (the parent reads
the node's stats meanwhile: a closed peer is no path to report); the node runs until stdin closes.
Logs go to stderr.  ``viewer --gather-only`` only gathers (an offer, no peer) and prints
``{"local_types": [...], "relay_addresses": [...]}``: the candidate types ICE found with that
server list (e.g. none when the TURN server's TLS certificate is not trusted) and the addresses of
its relay candidates (what the TURN server handed out: behind a 1:1 NAT, its public address only
with coturn's ``--external-ip``).  TLS trust for ``turns:`` is the process's OpenSSL default
(``SSL_CERT_FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout

from aiortc import RTCConfiguration, RTCIceTransportPolicy, RTCPeerConnection

from streamer.desktop.game import read_stamp
from streamer.media.peer import rtc_configuration
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import Viewer

FRAMES = 30


def emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


async def read_line() -> dict[str, Any] | None:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return json.loads(line) if line.strip() else None


async def node(advertise: str, ice: list[dict[str, Any]]) -> int:
    spec = SessionSpec(id="turn-1", kind="game", width=320, height=240, fps=30, ice_servers=tuple(ice))

    async def on_event(name: str, info: dict[str, Any]) -> None:
        logging.info("node event %s %s", name, info)

    runtime = SessionRuntime(spec, RuntimeConfig(advertise_addresses=(advertise,)), on_event=on_event)
    await runtime.start()
    try:
        while (msg := await read_line()) is not None:
            if "stats" in msg:  # the test asks how the media travels, as a heartbeat would report it
                emit({"candidate": runtime.stats()["candidate"]})
                continue
            emit({"sig": await runtime.handle_signal(msg["sig"])})
    finally:
        await runtime.stop()
    return 0


async def gather(ice: list[dict[str, Any]]) -> int:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=rtc_configuration(ice).iceServers,
                                            iceTransportPolicy=RTCIceTransportPolicy.RELAY))
    try:
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())  # returns once gathering is complete
        # a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ <type> ...
        found = [line.split()[4:8] for line in pc.localDescription.sdp.splitlines()
                 if line.startswith("a=candidate:") and " typ " in line]
        emit({"local_types": sorted({c[3] for c in found}),
              "relay_addresses": sorted({c[0] for c in found if c[3] == "relay"})})
    finally:
        await pc.close()
    return 0


async def viewer(advertise: str, ice: list[dict[str, Any]], relay_only: bool) -> int:
    base = rtc_configuration(ice)
    policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
    # relay-only: offer no host address at all (advertising one would add a host candidate)
    v = Viewer(advertise=() if relay_only else (advertise,),
               configuration=RTCConfiguration(iceServers=base.iceServers, iceTransportPolicy=policy))

    async def handle_signal(msg: dict[str, Any]) -> list[dict[str, Any]]:
        emit({"sig": msg})
        reply = await read_line()
        return list(reply["sig"]) if reply else []

    try:
        await v.connect(handle_signal)
        await v.wait_frames(FRAMES)
        stamps = sum(1 for img in list(v.images) if read_stamp(img) is not None)
        local = [c for t in v.pc.getTransceivers() if t.receiver.transport is not None
                 for c in t.receiver.transport.transport.iceGatherer.getLocalCandidates()]
        emit({"frames": len(v.frames), "stamps": stamps, "local_types": sorted({c.type for c in local}),
              "relay_addresses": sorted({c.ip for c in local if c.type == "relay"})})
        await read_line()  # hold the connection until the parent has read the node's stats (then stdin closes)
    except Exception as exc:  # boundary: the parent reads the reason
        emit({"error": repr(exc)})
        return 1
    finally:
        await v.close()
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("node", "viewer"))
    parser.add_argument("--advertise", required=True)
    parser.add_argument("--ice", required=True, help="JSON list of ICE servers (the broker's format)")
    parser.add_argument("--relay-only", action="store_true")
    parser.add_argument("--gather-only", action="store_true")
    ns = parser.parse_args()
    ice = json.loads(ns.ice)
    if ns.role == "node":
        return asyncio.run(node(ns.advertise, ice))
    if ns.gather_only:
        return asyncio.run(gather(ice))
    return asyncio.run(viewer(ns.advertise, ice, ns.relay_only))


if __name__ == "__main__":
    sys.exit(main())
