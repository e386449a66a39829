"""In-process fan-out of the broker's Redis pub/sub traffic.

One pattern subscription per process (``<prefix>:ev:*``, ``<prefix>:node:*``,
``<prefix>:sig:*``) feeds every local listener (SSE/WebSocket event streams,
node command sockets, signaling relays).  Listeners get a bounded queue; a slow
listener loses its oldest messages rather than stalling the others (event
streams re-read authoritative state on every message, so a dropped message is
never a lost state).

Concurrency: one reader task (started by the app's cleanup context) owns the
PubSub connection and reconnects with backoff when Redis goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

QUEUE_DEPTH = 256  # messages buffered per listener before the oldest is dropped


class Hub:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._patterns = [f"{prefix}:ev:*", f"{prefix}:node:*", f"{prefix}:sig:*"]
        self._listeners: dict[str, set[asyncio.Queue[bytes]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hub-reader")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready.wait(), 5)

    async def stop(self) -> None:
        """Stop the reader: by flag first (it polls every 250 ms), then by cancellation."""
        self._stopping = True
        if self._task:
            _done, pending = await asyncio.wait([self._task], timeout=2.5)
            for t in pending:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(t, 1.0)

    @contextlib.asynccontextmanager
    async def listen(self, *channels: str) -> AsyncIterator[asyncio.Queue[bytes]]:
        """A queue receiving every message published on ``channels`` while the context is open."""
        q: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_DEPTH)
        for ch in channels:
            self._listeners[ch].add(q)
        try:
            yield q
        finally:
            for ch in channels:
                self.unlisten(q, ch)

    def listener_count(self, channel: str) -> int:
        """How many local queues listen on ``channel`` now."""
        return len(self._listeners.get(channel, ()))

    def unlisten(self, q: asyncio.Queue[bytes], channel: str) -> None:
        """Stop delivering ``channel`` to ``q`` before its ``listen`` context closes (idempotent)."""
        listeners = self._listeners.get(channel)
        if listeners is not None:
            listeners.discard(q)
            if not listeners:
                del self._listeners[channel]

    def _dispatch(self, channel: str, data: bytes) -> None:
        for q in list(self._listeners.get(channel, ())):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(data)

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.psubscribe(*self._patterns)
                self.ready.set()
                backoff = 0.1
                while not self._stopping:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.25)
                    if msg is None or msg["type"] != "pmessage":
                        continue
                    ch = msg["channel"]
                    self._dispatch(ch.decode() if isinstance(ch, bytes) else ch, msg["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # task boundary: log, back off, reconnect
                self.ready.clear()
                log.warning("pub/sub connection lost (%s); retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
