"""Start real broker processes for multi-replica tests, and stop them without leftovers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from broker.embedded import free_port
from rbcommon.procs import terminate_group


@dataclass
class Proc:
    proc: asyncio.subprocess.Process
    url: str


async def wait_ready(url: str, proc: asyncio.subprocess.Process, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before becoming ready")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url + "/readyz") as r:
                    if r.status == 200:
                        return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} not ready after {timeout_s} s")
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def broker_process(env: dict[str, str], log_path: str) -> AsyncIterator[Proc]:
    """A ``render-broker serve`` child on a free port; terminated (then killed) on exit."""
    port = free_port()
    full = {**os.environ, **env, "BROKER_PORT": str(port), "BROKER_HOST": "127.0.0.1"}
    with open(log_path, "ab") as log:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker", "serve", env=full,
                                                    stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc)
        yield Proc(proc, url)
    finally:
        await stop_process(proc)


async def stop_process(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> None:
    """Stop a child started with ``start_new_session=True`` and everything in its process group."""
    await terminate_group(proc, timeout_s)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# Desktop sessions of a node this test run starts: as root (CI) the node refuses to run them as root, so its
# session programs run as nobody (which is what a production node run as root should be told too).
SESSION_USER = "nobody"


def session_user_env() -> dict[str, str]:
    """``NODE_*`` environment for a test node that runs desktop sessions (empty when not root)."""
    return {"NODE_SESSION_USER": SESSION_USER} if os.geteuid() == 0 else {}


def session_user_args() -> list[str]:
    """The same as command-line arguments."""
    return ["--session-user", SESSION_USER] if os.geteuid() == 0 else []
