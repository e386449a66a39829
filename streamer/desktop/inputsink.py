"""Where a viewer's input goes: parse, count, answer pings, and inject into the display or the game.

Job: ``InputRouter`` takes each raw data-channel message, parses it with
``streamer.desktop.inputs.parse_input`` (malformed messages are counted and
dropped), answers pings at once and hands user input to the session's
``InputSink``: ``XInputSink`` for X displays (XTEST through
``streamer.desktop.xinput.XInjector``), ``GameSource`` for the built-in game.

Concurrency model: ``InputRouter.handle`` runs on the event loop (parsing
costs microseconds) and never blocks: ``XInputSink`` queues each event to its
one worker thread (``rb-input-<session>``), which owns the X connection and
keeps arrival order; ``GameSource`` queues events for the frame thread, which
owns the ``Game`` and applies them right before it renders the next frame.

Invariants: ``handle`` never raises; pings, probe answers, viewport resizes and viewer stats do not
count as user activity (``last_input_ms``); events are injected in arrival order;
``close`` releases held keys and buttons before the X connection goes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import av

from broker.protocol import NodeEventType
from streamer.desktop.capture import CaptureStats, GameCapture, GameRendererKind
from streamer.desktop.game import Game
from streamer.desktop.inputs import (
    Clipboard,
    Gamepad,
    InputCounters,
    InputError,
    InputEvent,
    Ping,
    ProbeAck,
    Resize,
    ViewerStats,
    parse_input,
)
from streamer.desktop.xinput import XInjector

log = logging.getLogger(__name__)


class InputSink(Protocol):
    """Where validated input goes; called on the event loop, must not block."""

    def submit(self, event: InputEvent) -> None: ...

    def release_all(self) -> None: ...  # the viewer left: release held keys and buttons


def wall_clock_ms() -> int:
    """Milliseconds since the epoch (what ``last_input_ms`` is reported in)."""
    return time.time_ns() // 1_000_000


class InputRouter:
    """Parses data-channel messages, answers pings, counts everything, forwards input to the sink.

    Lives as long as the session (counters and ``last_input_ms`` survive
    reconnects).  ``last_input_ms`` (ms since the epoch) moves on user input
    only: pings, probe answers, viewport resizes and viewer stats are automatic, not activity.
    """

    def __init__(
        self,
        sink: InputSink,
        clock_ms: Callable[[], int] = wall_clock_ms,
        *,
        on_clipboard: Callable[[str], None] | None = None,
        on_resize: Callable[[int, int], None] | None = None,
        on_viewer_stats: Callable[[tuple[float, ...]], None] | None = None,
    ) -> None:
        """``on_clipboard(text)`` sees each pasted text before the sink; ``on_resize(w, h)`` each viewport size;
        ``on_viewer_stats(glass_ms)`` the glass-to-glass samples of each ``vs``."""
        self._sink = sink
        self._clock_ms = clock_ms
        self._on_clipboard = on_clipboard
        self._on_resize = on_resize
        self._on_viewer_stats = on_viewer_stats
        self.counters = InputCounters()
        self.last_input_ms: int | None = None

    def handle(self, raw: str | bytes, reply: Callable[[dict[str, Any]], object]) -> None:
        """One message from the viewer.  Never raises."""
        result = parse_input(raw)
        self.counters.record(result)
        if isinstance(result, InputError):
            log.debug("input dropped (%s): %s", result.reason, result.detail)
            return
        if isinstance(result, Ping):
            ts: float | int = int(result.ts_ms) if result.ts_ms.is_integer() else result.ts_ms
            reply({"t": NodeEventType.PONG.value, "id": result.id, "ts": ts})
            return
        if isinstance(result, Resize):
            if self._on_resize is not None:  # counted; the runtime decides what size it sets
                self._call(self._on_resize, result.width, result.height)
            return
        if isinstance(result, ViewerStats):
            if self._on_viewer_stats is not None:  # counted; the session's histogram judges each value
                self._call(self._on_viewer_stats, result.glass_ms)
            return
        if isinstance(result, ProbeAck):
            return  # counted; probe answers belong on the probe channel (streamer.media.peer), not activity
        self.last_input_ms = self._clock_ms()
        if isinstance(result, Clipboard) and self._on_clipboard is not None:
            self._call(self._on_clipboard, result.text)
        try:
            self._sink.submit(result)
        except Exception:  # a sink bug must not kill the data channel handler
            log.exception("input sink failed on %s", result)

    @staticmethod
    def _call(hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:  # a hook bug must not kill the data channel handler
            log.exception("input hook %r failed", hook)

    def release_all(self) -> None:
        try:
            self._sink.release_all()
        except Exception:
            log.exception("input sink failed to release held input")

    @property
    def accepted(self) -> int:
        return sum(self.counters.accepted.values())

    @property
    def dropped(self) -> int:
        return sum(self.counters.dropped.values())


class GameSource:
    """The built-in game as a ``FrameSource`` and an ``InputSink``.

    ``Game`` belongs to the frame thread: input events wait in a queue and are
    applied there, right before the next render.
    """

    def __init__(self, game: Game, clock_ms: Callable[[], int], *, renderer: GameRendererKind = "cpu",
                 gl_device: int | None = None) -> None:
        self._game = game
        self._capture = GameCapture(game, clock_ms, renderer=renderer, gl_device=gl_device)
        self.backend = self._capture.backend  # "game" (numpy) or "game-gl"
        self.width, self.height = game.width, game.height
        self._events: queue.SimpleQueue[InputEvent | None] = queue.SimpleQueue()  # None: release all

    def submit(self, event: InputEvent) -> None:
        self._events.put(event)

    def release_all(self) -> None:
        self._events.put(None)

    def grab(self) -> av.VideoFrame:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if event is None:
                self._game.release_all()
            else:
                self._game.apply(event)
        return self._capture.grab()

    def stats(self) -> CaptureStats:
        return self._capture.stats()

    def prepare(self) -> None:
        """Start the renderer now (blocking); raises ``GameRendererUnavailable`` with the reason."""
        self._capture.prepare()

    @property
    def renderer_string(self) -> str | None:
        """What draws: "numpy" or OpenGL's GL_RENDERER (None until the GL renderer started)."""
        return self._capture.renderer_string

    def close(self) -> None:
        self._capture.close()


class XInputSink:
    """Desktop input: XTEST injection on one dedicated thread, in arrival order, off the event loop."""

    def __init__(self, injector: XInjector, executor: ThreadPoolExecutor) -> None:
        self._injector = injector
        self._executor = executor
        self._closed = False
        self.skipped = 0  # events with no X meaning (gamepads: no virtual pad device here)

    @classmethod
    async def open(cls, display_name: str, thread_name: str) -> XInputSink:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        try:
            injector = await asyncio.wrap_future(executor.submit(XInjector, display_name))
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(injector, executor)

    def submit(self, event: InputEvent) -> None:
        if isinstance(event, Gamepad):
            self.skipped += 1
            return
        self._run(self._inject, event)

    def release_all(self) -> None:
        self._run(self._injector.release_all)

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._closed:
            return
        try:
            self._executor.submit(fn, *args)
        except RuntimeError:  # shut down between the check and the submit
            pass

    def _inject(self, event: InputEvent) -> None:
        try:
            self._injector.inject(event)
        except Exception as exc:  # X errors must not kill the input thread
            log.warning("input injection failed for %s: %r", type(event).__name__, exc)

    def close(self) -> None:
        """Release held input, close the X connection, join the thread.  Blocking; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._executor.submit(self._injector.close)
        self._executor.shutdown(wait=True)
