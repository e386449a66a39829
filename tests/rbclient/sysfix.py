"""A real broker (guests allowed) and render nodes for the client SDK's end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import broker_process, stop_process


@contextlib.asynccontextmanager
async def broker(redis_url: str, prefix: str, tmp_path: Path) -> AsyncIterator[str]:
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_ALLOW_GUESTS": "true", "BROKER_HOST_LEASE_TTL_S": "3", "BROKER_REAPER_INTERVAL_S": "0.5",
           "BROKER_LOG_LEVEL": "info"}
    async with broker_process(env, str(tmp_path / "broker.log")) as b:
        yield b.url


async def game_pool(url: str, pool: str = "game") -> None:
    async with aiohttp.ClientSession() as http, \
            http.put(f"{url}/api/v1/pools/{pool}", json={"kind": "game", "max_sessions_per_gpu": 1,
                                                         "vram_per_session_mb": 1024}, headers=auth(ADMIN)) as r:
        assert r.status in (200, 201), await r.text()


@contextlib.asynccontextmanager
async def node(url: str, pool: str, host_id: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A render node with one seat, ICE host candidate 127.0.0.1 (the clients offer it too)."""
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "--broker-url", url, "--node-token", NODE, "--pool", pool,
            "--host-id", host_id, "--seats", "1", "--advertise-addresses", "127.0.0.1",
            "--heartbeat-interval-s", "1", stdout=fh, stderr=fh, start_new_session=True)
    try:
        yield proc
    finally:
        await stop_process(proc)


async def seats_used(url: str, pool: str = "game") -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/api/v1/pools/{pool}", headers=auth(ADMIN)) as r:
        return int((await r.json())["seats_used"])
