"""One-machine launcher: a broker with embedded defaults plus local render nodes.

Used by ``scripts/run.sh``.  Starts ``render-broker serve`` (embedded Redis,
SQLite in the data dir), creates a ``desktop`` and a ``game`` pool, starts one
render node per pool advertising 127.0.0.1, prints the URLs and tokens, and on
Ctrl-C / SIGTERM stops the nodes, then the broker: nothing is left running.
Settings come from the same ``BROKER_*`` variables the broker reads.  Run as root (a container, a
CI machine), the nodes run desktop sessions as ``nobody`` unless ``NODE_SESSION_USER`` says otherwise:
a session is a shell, and a guest must not get a root one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import aiohttp

from rbcommon.procs import terminate_group
from rbcommon.realtime import forbid_realtime

NODE_SEATS = 2  # sessions per local node (CPU encode: ~1 core per 720p30 stream)
ROOT_FALLBACK_SESSION_USER = "nobody"  # whom desktop sessions run as when this runs as root


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as http:
        while asyncio.get_running_loop().time() < deadline:
            if proc.returncode is not None:
                raise RuntimeError("the broker exited during start-up")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url + "/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise TimeoutError("broker not ready")


async def run() -> int:
    env = dict(os.environ)
    if os.geteuid() == 0 and not env.get("NODE_ALLOW_ROOT_SESSIONS"):
        env.setdefault("NODE_SESSION_USER", ROOT_FALLBACK_SESSION_USER)
    port = env.get("BROKER_PORT", "8080")
    host = env.get("BROKER_HOST", "127.0.0.1")
    admin, node = env["BROKER_ADMIN_TOKEN"], env["BROKER_NODE_TOKEN"]
    url = f"http://{host}:{port}"
    procs: list[asyncio.subprocess.Process] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        broker = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker", "serve", env=env,
                                                      start_new_session=True)
        procs.append(broker)
        await _wait_ready(url, broker)
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin}"}) as http:
            for name, kind, fps in (("desktop", "desktop", 30), ("game", "game", 60)):
                async with http.put(f"{url}/api/v1/pools/{name}", json={
                        "kind": kind, "strategy": "breadth-first", "max_sessions_per_gpu": NODE_SEATS,
                        "vram_per_session_mb": 1024, "description": f"local {kind} pool ({fps} fps)"}) as r:
                    r.raise_for_status()
        for pool in ("desktop", "game"):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "streamer", "--broker-url", url, f"--node-token={node}", "--pool", pool,
                "--host-id", f"local-{pool}", "--seats", str(NODE_SEATS), "--advertise-addresses", "127.0.0.1",
                "--shutdown-grace-s", "0",  # Ctrl-C on a demo machine stops now, not after a rolling-restart grace
                env=env, start_new_session=True))
        print(f"\nrender-broker is up:\n  client:    {url}/\n  dashboard: {url}/admin\n"
              f"  admin token: {admin}\n  pools: desktop, game (guests allowed: "
              f"{env.get('BROKER_ALLOW_GUESTS', 'false')}; desktop sessions run as "
              f"{env.get('NODE_SESSION_USER') or 'your user'})\nCtrl-C stops everything.\n", flush=True)
        waiters = [asyncio.create_task(p.wait()) for p in procs]
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([*waiters, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        for p in reversed(procs):  # nodes first (they deregister), then the broker
            await terminate_group(p, 10.0)
    return 0


def main() -> int:
    forbid_realtime()  # the broker and nodes it starts inherit it (rbcommon.realtime: no SCHED_FIFO/RR)
    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
