"""End to end with real processes: broker + render node + an aiortc viewer through the broker's signaling.

The viewer gets a session, connects over /api/v1/sessions/{id}/signal (relayed by the broker to the
node's command socket), decodes frames of the requested size, sends input and sees its effect in the
decoded video (game) or on disk (desktop); ending the session and killing the node free the seat and
leave no session process behind.  WebRTC runs on loopback: both peers advertise 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import string
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamer.desktop.game import find_player, read_stamp
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import broker_process, session_user_args, stop_process
from tests.streamer.viewer import Viewer, until

pytestmark = pytest.mark.e2e


def session_pids(kind: str) -> set[int]:
    """Pids of processes that run a session's display or app (Xvfb, openbox, xterm)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                exe = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if os.path.basename(exe) in {"Xvfb", "openbox", "xterm"}:
                    out.add(int(d.name))
    return out


@contextlib.asynccontextmanager
async def node_process(broker_url: str, pool: str, host_id: str, log: Path, shutdown_grace_s: float = 0,
                       seats: int = 1, extra: tuple[str, ...] = ()) -> AsyncIterator[asyncio.subprocess.Process]:
    """A ``render-node`` child (``extra``: more of its command-line settings); stopped with its group on exit."""
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "--broker-url", broker_url, "--node-token", NODE, "--pool", pool,
            "--host-id", host_id, "--seats", str(seats), "--advertise-addresses", "127.0.0.1",
            "--heartbeat-interval-s", "1", "--shutdown-grace-s", str(shutdown_grace_s), *session_user_args(),
            *extra, stdout=fh, stderr=fh, start_new_session=True)
    try:
        yield proc
    finally:
        await stop_process(proc)


async def wait_host(http: aiohttp.ClientSession, url: str, host_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        async with http.get(f"{url}/api/v1/hosts/{host_id}", headers=auth(ADMIN)) as r:
            if r.status == 200:
                host = await r.json()
                if host["state"] == "up" and host["alive"]:
                    return host
        assert time.monotonic() < deadline, f"host {host_id} never registered"
        await asyncio.sleep(0.1)


async def wait_state(http: aiohttp.ClientSession, url: str, sid: str, token: str, want: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        async with http.get(f"{url}/api/v1/sessions/{sid}", headers=auth(token)) as r:
            s = await r.json()
        if s["state"] in want:
            return s
        assert time.monotonic() < deadline, f"session stuck in {s['state']} (want {want})"
        await asyncio.sleep(0.1)


class BrokerSignal:
    """handle_signal for the Viewer, over the broker's signaling WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def __call__(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        await self.ws.send_json(msg)
        while True:
            reply = await asyncio.wait_for(self.ws.receive_json(), 30)
            if reply.get("type") in ("answer", "error"):
                return [reply]


def broker_env(redis_url: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    """A test broker's environment: this test's Redis prefix and SQLite under ``tmp_path``, a 3 s host lease."""
    return {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
            "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
            "BROKER_HOST_LEASE_TTL_S": "3", "BROKER_REAPER_INTERVAL_S": "0.5", "BROKER_LOG_LEVEL": "info"}


@pytest.fixture
async def system(redis_url: str, prefix: str, tmp_path: Path) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    env = broker_env(redis_url, prefix, tmp_path)
    async with broker_process(env, str(tmp_path / "broker.log")) as b, aiohttp.ClientSession() as http:
        yield b.url, http


async def start_session(http: aiohttp.ClientSession, url: str, pool: str, kind: str, user: str,
                        profile: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    async with http.put(f"{url}/api/v1/pools/{pool}", json={"kind": kind, "max_sessions_per_gpu": 1,
                                                            "vram_per_session_mb": 1024}, headers=auth(ADMIN)) as r:
        assert r.status in (200, 201)
    async with http.post(f"{url}/api/v1/tokens", json={"user": user}, headers=auth(ADMIN)) as r:
        token = (await r.json())["token"]
    async with http.post(f"{url}/api/v1/sessions", json={"pool": pool, "profile": profile}, headers=auth(token)) as r:
        assert r.status == 201, await r.text()
        return token, await r.json()


async def test_game_session_streams_and_reacts_to_input(system, tmp_path: Path) -> None:
    url, http = system
    token, s = await start_session(http, url, "game", "game", "gamer", {"width": 640, "height": 360, "fps": 30})
    async with node_process(url, "game", "node-game", tmp_path / "node.log"):
        await wait_host(http, url, "node-game")
        s = await wait_state(http, url, s["id"], token, {"running"})
        assert s["host"] == "node-game"
        # another user's token cannot open this session's signaling
        async with http.post(f"{url}/api/v1/tokens", json={"user": "intruder"}, headers=auth(ADMIN)) as r:
            other = (await r.json())["token"]
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={other}")
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal")

        viewer = Viewer()
        async with http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
            await viewer.connect(BrokerSignal(ws))
            frames = await viewer.wait_frames(20)
            assert {(f.width, f.height) for f in frames} == {(640, 360)}
            stamps = [read_stamp(img) for img in list(viewer.images)[-5:]]
            numbers = [st.frame_no for st in stamps if st is not None]
            assert len(numbers) >= 3 and numbers == sorted(numbers)
            before = find_player(viewer.images[-1])
            assert before is not None
            viewer.send({"t": "k", "c": "ArrowRight", "d": True})
            await until(lambda: (p := find_player(viewer.images[-1])) is not None and p[0] > before[0] + 20,
                        "the player did not move right on ArrowRight")
            viewer.send({"t": "k", "c": "ArrowRight", "d": False})
            viewer.send({"t": "ping", "id": 7, "ts": 1})
            await viewer.wait_message(lambda m: m.get("t") == "pong" and m.get("id") == 7, "pong")
            await wait_state(http, url, s["id"], token, {"running"})
            # ending the session frees the seat; the node stops streaming
            async with http.delete(f"{url}/api/v1/sessions/{s['id']}", headers=auth(token)) as r:
                assert r.status == 200
            bye = await asyncio.wait_for(ws.receive_json(), 10)
            assert bye["type"] == "bye" and bye["reason"] == "user"
        await viewer.close()
        async with http.get(f"{url}/api/v1/pools/game", headers=auth(ADMIN)) as r:
            assert (await r.json())["seats_used"] == 0


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed")
async def test_desktop_typing_and_node_kill_leave_nothing(system, tmp_path: Path) -> None:
    url, http = system
    before = session_pids("desktop")
    # letters only, so typing it needs no key map beyond KeyA..KeyZ, Slash and Period
    target = Path("/tmp") / ("rbtyped" + "".join(random.choice(string.ascii_lowercase) for _ in range(8)))
    token, s = await start_session(http, url, "desk", "desktop", "worker", {"width": 800, "height": 600, "fps": 30})
    async with node_process(url, "desk", "node-desk", tmp_path / "node.log") as node:
        await wait_host(http, url, "node-desk")
        s = await wait_state(http, url, s["id"], token, {"running"})
        assert session_pids("desktop") - before, "no Xvfb/openbox/xterm started for the session"
        viewer = Viewer(keep_images=False)
        async with http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
            await viewer.connect(BrokerSignal(ws))
            frames = await viewer.wait_frames(10)
            assert {(f.width, f.height) for f in frames} == {(800, 600)}
            for ch in f"echo hi > {target}":
                code = {" ": "Space", ">": "Period", ".": "Period", "/": "Slash"}.get(ch, f"Key{ch.upper()}")
                shift = ch == ">"
                if shift:
                    viewer.send({"t": "k", "c": "ShiftLeft", "d": True})
                viewer.send({"t": "k", "c": code, "d": True})
                viewer.send({"t": "k", "c": code, "d": False})
                if shift:
                    viewer.send({"t": "k", "c": "ShiftLeft", "d": False})
            viewer.send({"t": "k", "c": "Enter", "d": True})
            viewer.send({"t": "k", "c": "Enter", "d": False})
            await until(lambda: target.exists() and target.read_text().strip() == "hi", "typed command had no effect",
                        deadline_s=20)
            # the node dies without cleaning up: the kernel takes its session processes with it,
            # and the broker frees the seat once the heartbeat lease runs out
            os.killpg(node.pid, signal.SIGKILL)
            await node.wait()
            s = await wait_state(http, url, s["id"], token, {"ended"})
            assert s["end_reason"] == "host_lost"
        await viewer.close()
    target.unlink(missing_ok=True)
    await until(lambda: not (session_pids("desktop") - before), "session processes outlived the node", 10)
    async with http.get(f"{url}/api/v1/pools/desk", headers=auth(ADMIN)) as r:
        pool = await r.json()
    assert pool["seats_used"] == 0 and pool["hosts"]["down"] == 1


async def test_signaling_relays_across_two_broker_replicas(redis_url: str, prefix: str, tmp_path: Path) -> None:
    """The node holds its command socket on replica A; the viewer signals through replica B."""
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}", "BROKER_LOG_LEVEL": "info"}
    async with broker_process(env, str(tmp_path / "a.log")) as a, broker_process(env, str(tmp_path / "b.log")) as b, \
            aiohttp.ClientSession() as http:
        token, s = await start_session(http, a.url, "game", "game", "gamer", {"width": 320, "height": 240, "fps": 30})
        async with node_process(a.url, "game", "node-a", tmp_path / "node.log"):
            await wait_host(http, b.url, "node-a")
            await wait_state(http, b.url, s["id"], token, {"running"})
            viewer = Viewer()
            async with http.ws_connect(f"{b.url}/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
                await viewer.connect(BrokerSignal(ws))
                frames = await viewer.wait_frames(10)
                assert {(f.width, f.height) for f in frames} == {(320, 240)}
            await viewer.close()
            # the viewer left: the node reports it and the broker marks the session disconnected
            await wait_state(http, a.url, s["id"], token, {"disconnected"})


async def test_sigterm_drains_warns_and_waits_for_the_session_to_end(system, tmp_path: Path) -> None:
    """A rolling restart: SIGTERM drains the host and warns the viewer with a countdown; the live
    session keeps streaming; the node exits once the user ends it, long before the grace runs out."""
    url, http = system
    grace_s = 60
    token, s = await start_session(http, url, "game", "game", "gamer", {"width": 320, "height": 240, "fps": 30})
    async with node_process(url, "game", "node-roll", tmp_path / "node.log", shutdown_grace_s=grace_s) as node:
        await wait_host(http, url, "node-roll")
        await wait_state(http, url, s["id"], token, {"running"})
        viewer = Viewer()
        async with http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
            await viewer.connect(BrokerSignal(ws))
            await viewer.wait_frames(5)
            node.send_signal(signal.SIGTERM)
            warn = await viewer.wait_message(lambda m: m.get("t") == "warn", "the restart warning")
            assert warn["code"] == "node_restart" and warn["ends_in_s"] == grace_s
            async with http.get(f"{url}/api/v1/hosts/node-roll", headers=auth(ADMIN)) as r:
                assert (await r.json())["state"] == "draining"
            seen = len(viewer.frames)
            await viewer.wait_frames(5, after=seen)  # still streaming during the grace
            assert node.returncode is None
            t0 = time.monotonic()
            async with http.delete(f"{url}/api/v1/sessions/{s['id']}", headers=auth(token)) as r:
                assert r.status == 200
            assert await asyncio.wait_for(node.wait(), 20) == 0
            assert time.monotonic() - t0 < grace_s / 2
        await viewer.close()
        async with http.get(f"{url}/api/v1/audit?action=host.drain", headers=auth(ADMIN)) as r:
            entries = (await r.json())["entries"]
        assert any(e["target"] == "node-roll" and e["role"] == "node" and "SIGTERM" in e["detail"]["reason"]
                   for e in entries)
