"""A staged desktop session with real processes: started before anyone asks, handed out without a restart.

Broker + render node (a desktop pool with ``staged: 1``): the node starts the staged session's display,
WM and app before any user asks; a user's request is handed that very session (same id, running), an
aiortc viewer streams it through the broker's signaling, and the display, WM and app processes are the
ones started for the staged session (same pids: nothing was restarted).  Once the user ends it, the
freed seat is staged again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ADMIN, auth
from tests.streamer.node.test_node_e2e import BrokerSignal, node_process, system, wait_host  # noqa: F401
from tests.streamer.viewer import Viewer

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed")]

DISPLAY_EXES = {"Xvfb", "openbox", "xterm"}


def children(parent: int) -> dict[int, str]:
    """The display, WM and app processes whose parent is ``parent`` (the node): pid -> executable."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            exe = os.path.basename((d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and exe in DISPLAY_EXES:
                out[int(d.name)] = exe
    return out


async def pool_view(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/api/v1/pools/desk", headers=auth(ADMIN)) as r:
        assert r.status == 200
        return dict(await r.json())


async def until_staged_ready(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        pool = await pool_view(http, url)
        if pool["staged_sessions"]["ready"] == 1:
            return pool
        assert time.monotonic() < deadline, f"no staged session ready: {pool['staged_sessions']}"
        await asyncio.sleep(0.1)


async def test_a_staged_desktop_is_handed_out_and_streams_without_a_restart(system, tmp_path: Path) -> None:  # noqa: F811
    url, http = system
    async with http.put(f"{url}/api/v1/pools/desk", json={"kind": "desktop", "max_sessions_per_gpu": 1,
                                                           "vram_per_session_mb": 1024, "staged": 1},
                        headers=auth(ADMIN)) as r:
        assert r.status == 201, await r.text()
    async with http.post(f"{url}/api/v1/tokens", json={"user": "worker"}, headers=auth(ADMIN)) as r:
        token = (await r.json())["token"]
    async with node_process(url, "desk", "node-desk", tmp_path / "node.log") as node:
        await wait_host(http, url, "node-desk")
        pool = await until_staged_ready(http, url)
        assert pool["seats_used"] == 1 and pool["seats_free"] == 0  # the staged session holds the only seat
        staged_procs = children(node.pid)
        assert sorted(staged_procs.values()) == ["Xvfb", "openbox", "xterm"], staged_procs
        async with http.get(f"{url}/api/v1/sessions", headers=auth(token)) as r:
            assert (await r.json())["sessions"] == []  # nobody's

        async with http.post(f"{url}/api/v1/sessions", json={"pool": "desk", "profile": {
                "width": 1280, "height": 720, "fps": 30}}, headers=auth(token)) as r:
            assert r.status == 201, await r.text()
            s = await r.json()
        assert s["state"] == "running" and s["user"] == "worker" and s["host"] == "node-desk"

        viewer = Viewer(keep_images=False)
        async with http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
            await viewer.connect(BrokerSignal(ws))
            frames = await viewer.wait_frames(10)
            assert {(f.width, f.height) for f in frames} == {(1280, 720)}
            assert children(node.pid) == staged_procs  # the same display, WM and app: nothing restarted
            async with http.delete(f"{url}/api/v1/sessions/{s['id']}", headers=auth(token)) as r:
                assert r.status == 200
            bye = await asyncio.wait_for(ws.receive_json(), 10)
            assert bye["type"] == "bye" and bye["reason"] == "user"
        await viewer.close()

        # the freed seat is staged again: a new session, new processes
        await until_staged_ready(http, url)
        deadline = time.monotonic() + 20
        while set(children(node.pid)) & set(staged_procs):
            assert time.monotonic() < deadline, "the handed-out session's processes outlived it"
            await asyncio.sleep(0.1)
