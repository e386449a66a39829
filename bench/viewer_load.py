"""The viewers' half of ``bench/bench_viewers.py``: N SDK viewers in one process, started, measured, ended.

``run_viewers`` signs N guests in, starts a session each through ``rbclient.start`` (every
viewer decodes every frame and reads its stamp), waits on ``go`` (the caller's warm-up, or a
signal from the parent process), then measures a window: each viewer's ``StatsSummary`` and
this process's CPU over it.  ``worker`` runs it in a child process (``multiprocessing`` spawn)
so the viewers of one benchmark can use more than one core; the parent's ``go`` event starts
every child's window at the same moment.

Concurrency: one asyncio loop per process; aiortc decodes each viewer's video on its own thread.
Every session it started is ended (``DELETE``) before it returns, also on error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rbclient import Broker, StatsSummary, Stream, ViewerStats, start

POOL = "game"
START_TIMEOUT_S = 60.0  # every viewer streaming within this


@dataclass(frozen=True)
class ViewerResult:
    index: int
    summary: StatsSummary
    codec: str | None
    encoder: str | None


@dataclass(frozen=True)
class LoadResult:
    viewers: list[ViewerResult]
    cpu_s: float  # this process's CPU over the window
    window_s: float


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def run_viewers(base: str, n: int, profile: dict[str, Any], seconds: float, go: Callable[[], Awaitable[None]],
                      *, pool: str = POOL, first_index: int = 0, host_addresses: tuple[str, ...] = ("127.0.0.1",),
                      ready: Callable[[], None] | None = None) -> LoadResult:
    clients = [Broker(base) for _ in range(n)]
    streams: list[Stream] = []
    try:
        for c in clients:
            await c.sign_in_guest()
        async with asyncio.timeout(START_TIMEOUT_S):
            streams = list(await asyncio.gather(*(
                start(c, pool, end_on_failure=True, host_addresses=host_addresses, **profile) for c in clients)))
            await asyncio.gather(*(s.wait_frames(1) for s in streams))
        if ready is not None:
            ready()
        await go()
        for s in streams:
            s.stats = ViewerStats()  # the window starts now
        cpu0, t0 = own_cpu_s(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, t1 = own_cpu_s(), time.monotonic()
        return LoadResult([ViewerResult(first_index + i, s.stats.summary(), s.stats.node.get("codec"),
                                        s.stats.node.get("encoder")) for i, s in enumerate(streams)],
                          cpu1 - cpu0, t1 - t0)
    finally:
        for s in streams:
            with contextlib.suppress(Exception):
                await s.end()
        for c in clients:
            await c.close()


def worker(base: str, n: int, profile: dict[str, Any], seconds: float, first_index: int, pool: str,
           host_addresses: tuple[str, ...], ready_q: Any, go_event: Any, out_q: Any) -> None:
    """A child process's viewers: ``ready_q`` gets None once they stream, ``go_event`` starts the window,
    ``out_q`` gets the ``LoadResult`` (or the error's text)."""

    async def go() -> None:
        await asyncio.get_running_loop().run_in_executor(None, go_event.wait)

    try:
        result: LoadResult | str = asyncio.run(run_viewers(
            base, n, profile, seconds, go, pool=pool, first_index=first_index, host_addresses=host_addresses,
            ready=lambda: ready_q.put(None)))
    except Exception as exc:  # the task boundary of a child process: report, the parent raises
        result = f"{type(exc).__name__}: {exc}"
        ready_q.put(result)
    out_q.put(result)
