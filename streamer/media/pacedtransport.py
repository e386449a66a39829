"""A paced view of a DTLS transport for one video sender.

Job: ``PacedTransport`` stands in for an ``RTCDtlsTransport`` as one ``RTCRtpSender`` sees it
(``streamer.media.peer.FeedbackSender.transport``).  The sender's RTP packets are queued in a
``streamer.media.pacer.PacingQueue`` and a task on the event loop puts them on the real transport
at the pacing rate, re-stamping abs-send-time as each leaves; RTCP goes straight through.  Other
senders (audio) and the data channels (input, delay probes) use the real transport and never wait
behind video.  Retransmissions (``priority``) jump the media queue.

aiortc seam: ``RTCRtpSender`` sends every packet with ``await self.transport._send_rtp(bytes)``
(media in ``_run_rtp``, retransmissions in ``_retransmit``, RTCP in ``_send_rtcp``); every other
use of ``transport`` (stats, registration, state) is forwarded to the real transport unchanged.
``_send_rtp`` returns once the packet is queued, so aiortc's sender counts it as sent then (its
stats' packet and byte counts run ahead of the wire by the pacer's queue, at most about one frame
interval).

Concurrency model: asyncio, one event loop.  ``_send_rtp`` never waits; one drain task per
transport sleeps until the pacer's next release or a new packet.  A ``ConnectionError`` from the
real transport drops the queue and is raised to the sender on its next packet, which ends aiortc's
send loop as an unpaced send would have.

Invariants: packets reach the real transport in the order the pacer releases them; ``close``
cancels the drain task and drops what is queued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from aiortc import clock
from aiortc.rtp import is_rtcp

from streamer.media.pacer import PacingQueue, abs_send_time, restamp_abs_send_time

log = logging.getLogger(__name__)

MIN_SLEEP_S: Final = 0.002  # the drain task's shortest sleep: fewer wake-ups, at most 2 ms of budget per release


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class PacedTransport:
    """Forwards to ``inner`` (an ``RTCDtlsTransport``); RTP through ``queue`` (see module docstring)."""

    def __init__(self, inner: Any, queue: PacingQueue[bytes]) -> None:
        self.inner = inner
        self.queue = queue
        self.abs_send_time_id: int | None = None  # the negotiated extension id, set by the sender
        self.priority = False  # set around a retransmission's send: it goes before media
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: ConnectionError | None = None
        self._closed = False

    def __getattr__(self, name: str) -> Any:  # everything but RTP sending is the real transport's
        return getattr(self.inner, name)

    async def _send_rtp(self, data: bytes) -> None:
        if is_rtcp(data):
            await self.inner._send_rtp(data)
            return
        if self._error is not None:
            raise self._error
        if self._closed or self.inner.state != "connected":
            raise ConnectionError("Cannot send encrypted RTP, not connected")
        self.queue.push(data, len(data), _now_ms(), priority=self.priority)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())
        self._wake.set()

    async def _drain(self) -> None:
        queue = self.queue
        try:
            while True:
                now = _now_ms()
                due = queue.pop_due(now)
                if due:
                    ext_id = self.abs_send_time_id
                    for data in due:
                        if ext_id is not None:
                            data = restamp_abs_send_time(data, ext_id, abs_send_time(clock.current_ntp_time()))
                        await self.inner._send_rtp(data)
                    now = _now_ms()
                nxt = queue.next_due_ms(now)
                if nxt is None:
                    self._wake.clear()
                    await self._wake.wait()
                else:
                    await asyncio.sleep(max(MIN_SLEEP_S, (nxt - now) / 1000.0))
        except ConnectionError as exc:
            self._error = exc
            queue.clear()
        except asyncio.CancelledError:
            raise
        except Exception:  # task boundary: a failed drain must not leave the sender waiting unseen
            log.exception("pacer drain failed")
            self._error = ConnectionError("pacer failed")

    def close(self) -> None:
        """Stop the drain task; queued packets are dropped."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
