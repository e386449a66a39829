"""A GStreamer webrtcbin viewer against a real broker and render node, through the public API only.

The client is what issue 24's third-party author built: GStreamer 1.22's ``webrtcbin`` from
Debian packages (``scripts/setup.sh`` installs them), with its defaults: an RSA-2048 DTLS
certificate and an ``a=setup:actpass`` offer, candidates trickled after the offer.  Its media half
runs in the system Python (``webrtcbin_client.py``: Debian's ``python3-gi``); this test is its
signaling half: a minted user token, ``POST /api/v1/sessions``, the signaling WebSocket with
``?access_token=``, the answer and candidates relayed, ``DELETE`` at the end.

It checks what the issue's author measured by hand: the stream connects with no client-side
workaround, frames decode at the session's size, the frame stamps count up, a key moves the
player, ``ping`` gets ``pong``, and ending the session says ``bye`` and frees the seat.
Skipped, with the reason, where the Debian packages are missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from streamer.desktop.game import find_player, read_stamp
from tests.conftest import ADMIN, NODE, auth
from tests.procs import stop_process
from tests.streamer.node.test_node_e2e import start_session, system, wait_host, wait_state
from tests.streamer.viewer import until

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-gi is built for it, not for the project's virtualenv
CLIENT = Path(__file__).with_name("webrtcbin_client.py")
GST_ELEMENTS = ("webrtcbin", "nicesrc", "dtlssrtpdec", "srtpdec", "rtph264depay", "h264parse", "avdec_h264",
                "videoconvert", "appsink")
DEBIAN_PACKAGES = ("python3-gi gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 gir1.2-gst-plugins-bad-1.0 "
                   "gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-nice gstreamer1.0-libav")
W, H = 640, 360


def gstreamer_missing() -> str | None:
    """Why webrtcbin cannot run here (None when it can)."""
    probe = ("import gi; gi.require_version('Gst','1.0'); gi.require_version('GstWebRTC','1.0'); "
             "gi.require_version('GstSdp','1.0'); from gi.repository import Gst, GstWebRTC, GstSdp; Gst.init(None); "
             f"print(' '.join(e for e in {GST_ELEMENTS!r} if Gst.ElementFactory.find(e) is None))")
    try:
        done = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{SYSTEM_PYTHON} cannot run: {exc}"
    if done.returncode != 0:
        return f"{SYSTEM_PYTHON} has no GStreamer 1.x gi bindings ({done.stderr.strip().splitlines()[-1:]})"
    if done.stdout.strip():
        return f"GStreamer elements missing: {done.stdout.strip()}"
    return None


MISSING = gstreamer_missing()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}; Debian packages: {DEBIAN_PACKAGES}"),
]
__all__ = ["system"]  # the broker fixture, imported for pytest


@contextlib.asynccontextmanager
async def node_process(broker_url: str, pool: str, host_id: str,
                       log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A render node that gathers ICE candidates on the machine's interfaces (aioice's default).

    Not on 127.0.0.1 only, as the aiortc e2e tests do: libnice (webrtcbin's ICE) skips loopback,
    so both sides meet on the interface addresses, as a native client on another machine would.
    """
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "--broker-url", broker_url, "--node-token", NODE, "--pool", pool,
            "--host-id", host_id, "--seats", "1", "--heartbeat-interval-s", "1", stdout=fh, stderr=fh,
            start_new_session=True)
    try:
        yield proc
    finally:
        await stop_process(proc)


class Webrtcbin:
    """The webrtcbin client process and what it reported."""

    def __init__(self, proc: asyncio.subprocess.Process, out_dir: Path) -> None:
        self.proc = proc
        self.out_dir = out_dir
        self.signals: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # offer/candidates for the socket
        self.frames: list[tuple[int, int]] = []
        self.messages: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.channel_open = False

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            msg = json.loads(line)
            if "type" in msg:
                await self.signals.put(msg)
            elif msg["ev"] == "frame":
                self.frames.append((msg["w"], msg["h"]))
            elif msg["ev"] == "message":
                self.messages.append(json.loads(msg["data"]))
            elif msg["ev"] == "channel_open":
                self.channel_open = True
            else:
                self.events.append(msg)

    async def tell(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        await self.proc.stdin.drain()

    def image(self) -> np.ndarray:
        """The newest decoded frame the client wrote (BGR)."""
        data = (self.out_dir / "latest.bgr").read_bytes()
        return np.frombuffer(data, np.uint8).reshape(H, W, 3)


@contextlib.asynccontextmanager
async def webrtcbin_client(out_dir: Path) -> AsyncIterator[Webrtcbin]:
    with open(out_dir / "webrtcbin.log", "ab") as log:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(SYSTEM_PYTHON, str(CLIENT), str(out_dir), stdin=subprocess.PIPE,
                                                    stdout=subprocess.PIPE, stderr=log)
    client = Webrtcbin(proc, out_dir)
    reader = asyncio.create_task(client.read())
    try:
        yield client
    finally:
        with contextlib.suppress(ConnectionError):
            await client.tell({"quit": True})
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def relay(ws: aiohttp.ClientWebSocketResponse, client: Webrtcbin, from_node: list[dict[str, Any]]) -> None:
    """Signaling both ways: the client's offer and candidates up, the node's replies down."""

    async def up() -> None:
        while True:
            await ws.send_json(await client.signals.get())

    async def down() -> None:
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            msg = json.loads(frame.data)
            from_node.append(msg)
            if msg.get("type") in ("answer", "candidate"):
                await client.tell(msg)

    await asyncio.gather(up(), down())


async def test_webrtcbin_streams_a_game_with_its_default_rsa_certificate(
    system: tuple[str, aiohttp.ClientSession], tmp_path: Path
) -> None:
    url, http = system
    token, s = await start_session(http, url, "game", "game", "gst-user", {"width": W, "height": H, "fps": 30})
    async with node_process(url, "game", "node-gst", tmp_path / "node.log"):
        await wait_host(http, url, "node-gst")
        s = await wait_state(http, url, s["id"], token, {"running"})
        from_node: list[dict[str, Any]] = []
        async with webrtcbin_client(tmp_path) as client, \
                http.ws_connect(f"{url}{s['signaling']['url']}?access_token={token}") as ws:
            relaying = asyncio.create_task(relay(ws, client, from_node))
            try:
                await until(lambda: any(m.get("type") in ("answer", "error") for m in from_node) or relaying.done(),
                            "no reply to webrtcbin's offer", deadline_s=30)
                answer = next(m for m in from_node if m.get("type") in ("answer", "error"))
                assert answer["type"] == "answer", answer
                assert "a=setup:passive" in answer["sdp"] and "a=setup:active" not in answer["sdp"]
                await until(lambda: len(client.frames) >= 30 or bool(client.events and relaying.done()),
                            f"webrtcbin decoded {len(client.frames)} frames; its events: {client.events[-5:]}",
                            deadline_s=30)
                assert set(client.frames) == {(W, H)}
                assert not [m for m in from_node if m.get("type") == "error"]

                stamps: list[int] = []

                def newer_stamp() -> bool:
                    stamp = read_stamp(client.image())
                    if stamp is not None and (not stamps or stamp.frame_no > stamps[-1]):
                        stamps.append(stamp.frame_no)
                    return len(stamps) >= 3

                await until(newer_stamp, f"frame stamps did not count up: {stamps}")

                await until(lambda: client.channel_open, "the input channel did not open")
                start = find_player(client.image())
                assert start is not None
                await client.tell({"send": {"t": "k", "c": "ArrowRight", "d": True}})
                await until(lambda: (p := find_player(client.image())) is not None and p[0] > start[0] + 20,
                            "the player did not move right on ArrowRight")  # fmt: skip
                await client.tell({"send": {"t": "k", "c": "ArrowRight", "d": False}})
                await client.tell({"send": {"t": "ping", "id": 9, "ts": 1.5}})
                await until(lambda: {"t": "pong", "id": 9, "ts": 1.5} in client.messages, "no pong")
                await wait_state(http, url, s["id"], token, {"running"})

                async with http.delete(f"{url}/api/v1/sessions/{s['id']}", headers=auth(token)) as r:
                    assert r.status == 200
                await until(lambda: {"type": "bye", "reason": "user"} in from_node, "no bye after DELETE")
            finally:
                relaying.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await relaying
        async with http.get(f"{url}/api/v1/pools/game", headers=auth(ADMIN)) as r:
            assert (await r.json())["seats_used"] == 0
