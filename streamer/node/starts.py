"""Session starts and start failures of one render node, by reason, for the heartbeat.

Job: ``start_failure_reason`` turns the exception a session's start raised into a
``broker.protocol.StartFailure`` (refused, display, encoder, error); ``StartCounts`` counts the starts
the node attempted and the failures by reason, ``ice_failed``/``dtls_failed`` included (the session's
first viewer connection failed before any viewer had connected: the runtime says so once per session).
A viewer that connects again later and fails is no start failure, and there are no extra (shared or
guest) viewers: a session has one viewer at a time, a new offer replaces it.
The counts are node-cumulative (reset only by a node restart), reported in every heartbeat as
``session_starts_total`` and ``session_start_failures_total`` (every reason, zeros included, so the
broker exports each series from the node's first heartbeat on and ``rate()`` sees the first failure).

Concurrency: a plain object owned by the agent's event loop.  Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from broker.protocol import SignalError, StartFailure
from encoder import EncoderOpenError, NoEncoderError
from streamer.desktop.capture import CaptureError
from streamer.desktop.clipboard import ClipboardError
from streamer.desktop.display import DisplayError
from streamer.desktop.glgame import GlUnavailableError
from streamer.desktop.xinput import InjectError
from streamer.media.session import SessionRefused

# what failed to come up -> the reason; the first match wins, anything else is ERROR
_DISPLAY_ERRORS: tuple[type[BaseException], ...] = (DisplayError, CaptureError, InjectError, ClipboardError,
                                                    GlUnavailableError)
_ENCODER_ERRORS: tuple[type[BaseException], ...] = (EncoderOpenError, NoEncoderError)
# the signaling error codes of a viewer connection that failed -> the reason
_CONNECTION_FAILURES: dict[str, StartFailure] = {
    SignalError.ICE_FAILED.value: StartFailure.ICE_FAILED,
    SignalError.DTLS_FAILED.value: StartFailure.DTLS_FAILED,
}


def start_failure_reason(exc: BaseException) -> StartFailure:
    """Why a session's start failed, from what its start raised."""
    if isinstance(exc, SessionRefused):
        return StartFailure.REFUSED
    if isinstance(exc, _DISPLAY_ERRORS):
        return StartFailure.DISPLAY
    if isinstance(exc, _ENCODER_ERRORS):
        return StartFailure.ENCODER
    return StartFailure.ERROR


class StartCounts:
    """Starts attempted and start failures by reason since the node started."""

    def __init__(self) -> None:
        self.starts = 0
        self.failures: dict[StartFailure, int] = dict.fromkeys(StartFailure, 0)

    def started(self) -> None:
        """A session's start begins (staged sessions included, once their delay is over)."""
        self.starts += 1

    def failed(self, reason: StartFailure) -> None:
        self.failures[reason] += 1

    def connection_failed(self, code: object) -> StartFailure | None:
        """The runtime's ``start_failure`` code (its first viewer connection failed): count it; the reason,
        or None for a code that is not a connection failure (ignored)."""
        reason = _CONNECTION_FAILURES.get(str(code))
        if reason is not None:
            self.failed(reason)
        return reason

    def heartbeat_fields(self) -> dict[str, Any]:
        return {"session_starts_total": self.starts,
                "session_start_failures_total": {r.value: n for r, n in self.failures.items()}}
