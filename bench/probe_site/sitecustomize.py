"""What a broker's event loop waits behind: a probe ``bench_fleet.py --probe`` loads into its brokers.

Python imports ``sitecustomize`` at start from the first ``sys.path`` entry that has one; the
benchmark puts this folder first on the brokers' ``PYTHONPATH`` and sets ``FLEET_PROBE_OUT``.
In a broker process (and nowhere else) it records, stamped with ``time.monotonic()`` (one clock
for every process on the machine):

- every garbage collection: wall and CPU time (``time.thread_time``), generation;
- event-loop stalls: a tick re-armed every 2 ms; a watcher thread that sees it over 8 ms late
  samples the loop thread's stack each millisecond until it fires, and the stall records its wall
  time, the loop thread's CPU time over it (little CPU: the process waited for a core) and the
  most frequent stacks;
- how long each seating (``POST /api/v1/sessions``), heartbeat and end took inside the handler,
  and each of their Lua round trips (``LiveStore._run``).

It writes ``FLEET_PROBE_OUT-<pid>.json`` every 2 s.  The sampling thread costs the broker some
CPU and GIL hand-offs: figures from a probed run are for finding causes, not for the tables.
"""

from __future__ import annotations

import os
import sys

OUT = os.environ.get("FLEET_PROBE_OUT", "")
TICK_S = 0.002
STALL_S = 0.008


def _install() -> None:
    import asyncio
    import asyncio.base_events
    import collections
    import gc
    import json
    import threading
    import time
    from typing import Any

    from aiohttp import web

    rec: dict[str, list[Any]] = {"gc": [], "stall": [], "req": [], "lua": [], "errors": []}
    gc_start = [0.0, 0.0]
    last = [time.monotonic(), 0.0]  # the loop tick's last run: monotonic, loop thread CPU
    main = threading.main_thread().ident

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0], gc_start[1] = time.monotonic(), time.thread_time()
        else:
            rec["gc"].append((gc_start[0], (time.monotonic() - gc_start[0]) * 1000,
                              (time.thread_time() - gc_start[1]) * 1000, info["generation"]))

    gc.callbacks.append(on_gc)

    def stack(frame: Any, depth: int = 8) -> str:
        out = []
        while frame is not None and len(out) < depth:
            out.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return " < ".join(out)

    def watch() -> None:
        stalled, start, cpu0 = False, 0.0, 0.0
        samples: collections.Counter[str] = collections.Counter()
        while True:
            time.sleep(0.001)
            try:
                if time.monotonic() - last[0] > STALL_S:
                    if not stalled:
                        stalled, start, cpu0, samples = True, last[0], last[1], collections.Counter()
                    frame = sys._current_frames().get(main or 0)
                    if frame is not None:
                        samples[stack(frame)] += 1
                elif stalled:
                    stalled = False
                    rec["stall"].append((start, (last[0] - start) * 1000, (last[1] - cpu0) * 1000,
                                         samples.most_common(3)))
            except Exception as exc:  # keep sampling; the report shows how often this happened
                rec["errors"].append(repr(exc))

    def flush() -> None:
        path = f"{OUT}-{os.getpid()}.json"
        while True:
            time.sleep(2)
            try:
                with open(path + ".tmp", "w") as fh:
                    json.dump(rec, fh)
                os.replace(path + ".tmp", path)
            except OSError as exc:
                rec["errors"].append(repr(exc))

    run_forever = asyncio.base_events.BaseEventLoop.run_forever

    def probed_run_forever(self: asyncio.base_events.BaseEventLoop) -> None:
        def tick() -> None:
            last[1] = time.thread_time()
            last[0] = time.monotonic()
            self.call_later(TICK_S, tick)

        self.call_soon(tick)
        from broker.store.live import LiveStore

        run = LiveStore._run

        async def timed_run(store: LiveStore, name: str, *args: Any) -> Any:
            t = time.monotonic()
            try:
                return await run(store, name, *args)
            finally:
                if name in ("create_session", "heartbeat", "end_session"):
                    rec["lua"].append((name, t, (time.monotonic() - t) * 1000))

        LiveStore._run = timed_run  # type: ignore[method-assign]
        threading.Thread(target=watch, daemon=True).start()
        threading.Thread(target=flush, daemon=True).start()
        run_forever(self)

    asyncio.base_events.BaseEventLoop.run_forever = probed_run_forever  # type: ignore[method-assign]

    @web.middleware
    async def timed(request: web.Request, handler: Any) -> Any:
        t = time.monotonic()
        try:
            return await handler(request)
        finally:
            p = request.path
            kind = ("seat" if request.method == "POST" and p == "/api/v1/sessions" else
                    "hb" if p.endswith("/heartbeat") else "end" if request.method == "DELETE" else "")
            if kind:
                rec["req"].append((kind, t, (time.monotonic() - t) * 1000))

    init = web.Application.__init__

    def probed_init(self: web.Application, *a: Any, middlewares: Any = (), **kw: Any) -> None:
        init(self, *a, middlewares=[timed, *middlewares], **kw)

    web.Application.__init__ = probed_init  # type: ignore[method-assign]


if OUT and " broker " in " " + " ".join(getattr(sys, "orig_argv", [])) + " ":
    _install()
