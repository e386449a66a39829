"""Interop end to end: broker + render node processes, a webrtcbin-like viewer through the public API.

The viewer is an aiortc peer with an RSA-2048 DTLS certificate and OpenSSL's broad cipher list
(``test_interop.RsaCertificate``: what GStreamer 1.22's webrtcbin presents by default).  It signs
in with a minted token, creates a game session, opens the signaling WebSocket with
``?access_token=``, trickles its candidates *before* its candidate-less offer (the order a
trickling stack may produce), decodes stamped frames, moves the player with a key, and ends the
session with DELETE.  WebRTC runs on loopback: both peers advertise 127.0.0.1.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCSessionDescription

from streamer.desktop.game import find_player, read_stamp
from streamer.node.agent import NodeAgent
from tests.conftest import ADMIN, auth
from tests.streamer.media.test_interop import rsa_viewer, setup_lines, split_candidates
from tests.streamer.node.test_node_e2e import node_process, start_session, system, wait_host, wait_state
from tests.streamer.viewer import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
__all__ = ["system"]  # the broker fixture, imported for pytest


async def test_an_rsa_viewer_trickling_before_its_offer_streams_through_the_broker(
    system: tuple[str, aiohttp.ClientSession], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, http = system
    token, s = await start_session(http, url, "game", "game", "native", {"width": 640, "height": 360, "fps": 30})
    async with node_process(url, "game", "node-interop", tmp_path / "node.log"):
        await wait_host(http, url, "node-interop")
        s = await wait_state(http, url, s["id"], token, {"running"})
        viewer = rsa_viewer(monkeypatch)
        try:
            async with http.ws_connect(f"{url}{s['signaling']['url']}?access_token={token}") as ws:
                offer = await viewer.offer()
                bare, candidates = split_candidates(offer["sdp"])
                for msg in [*candidates, {"type": "candidate", "candidate": "", "sdpMid": candidates[0]["sdpMid"]}]:
                    await ws.send_json(msg)
                await ws.send_json({"type": "offer", "sdp": bare})
                reply = await ws.receive_json(timeout=30)
                assert reply["type"] == "answer", reply
                assert set(setup_lines(reply["sdp"])) == {"passive"}
                # the node never trickles: its candidates are in the answer
                assert re.search(r"a=candidate:\S+ \d+ udp \d+ 127\.0\.0\.1 \d+ typ host", reply["sdp"])
                await viewer.pc.setRemoteDescription(RTCSessionDescription(sdp=reply["sdp"], type="answer"))

                frames = await viewer.wait_frames(20)
                assert {(f.width, f.height) for f in frames} == {(640, 360)}
                stamps = [read_stamp(img) for img in list(viewer.images)[-5:]]
                numbers = [st.frame_no for st in stamps if st is not None]
                assert len(numbers) >= 3 and numbers == sorted(numbers)
                await until(lambda: viewer.channel.readyState == "open", "the input channel did not open")
                before = find_player(viewer.images[-1])
                assert before is not None
                viewer.send({"t": "k", "c": "ArrowRight", "d": True})
                await until(lambda: (p := find_player(viewer.images[-1])) is not None and p[0] > before[0] + 20,
                            "the player did not move right on ArrowRight")  # fmt: skip
                viewer.send({"t": "k", "c": "ArrowRight", "d": False})
                await wait_state(http, url, s["id"], token, {"running"})

                async with http.delete(f"{url}/api/v1/sessions/{s['id']}", headers=auth(token)) as r:
                    assert r.status == 200
                bye = await ws.receive_json(timeout=10)
                assert bye == {"type": "bye", "reason": "user"}
        finally:
            await viewer.close()
        async with http.get(f"{url}/api/v1/pools/game", headers=auth(ADMIN)) as r:
            assert (await r.json())["seats_used"] == 0


def agent_forwards_signal_events() -> bool:
    """Whether the node agent sends the runtime's ``signal`` events (unprompted errors) to the viewer."""
    return '"signal"' in inspect.getsource(NodeAgent._on_runtime_event)


@pytest.mark.skipif(not agent_forwards_signal_events(),
                    reason="streamer/node/agent.py does not forward SessionRuntime 'signal' events to the broker yet "
                           "(its _on_runtime_event ignores them), so ice_failed/dtls_failed stay on the node")
async def test_a_dtls_failure_reaches_the_viewer_over_signaling(
    system: tuple[str, aiohttp.ClientSession], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An RSA viewer that insists on being the DTLS server (a=setup:passive) cannot complete DTLS with
    # the node's ECDHE-ECDSA suites: the node tells it so over signaling, unprompted.
    url, http = system
    token, s = await start_session(http, url, "game", "game", "native", {"width": 320, "height": 240, "fps": 30})
    async with node_process(url, "game", "node-dtls", tmp_path / "node.log"):
        await wait_host(http, url, "node-dtls")
        s = await wait_state(http, url, s["id"], token, {"running"})
        viewer = rsa_viewer(monkeypatch)
        try:
            async with http.ws_connect(f"{url}{s['signaling']['url']}?access_token={token}") as ws:
                offer = await viewer.offer()
                await ws.send_json({"type": "offer", "sdp": offer["sdp"].replace("a=setup:actpass", "a=setup:passive")})
                reply = await ws.receive_json(timeout=30)
                assert reply["type"] == "answer" and set(setup_lines(reply["sdp"])) == {"active"}
                await viewer.pc.setRemoteDescription(RTCSessionDescription(sdp=reply["sdp"], type="answer"))
                error = await ws.receive_json(timeout=20)
                assert error["type"] == "error" and error["code"] == "dtls_failed", error
                assert "RSA" in error["detail"]
        finally:
            await viewer.close()
    assert "viewer connection failed: dtls_failed" in (tmp_path / "node.log").read_text()
