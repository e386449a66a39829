"""Grab frames of an X display (or of the built-in game) as ``av.VideoFrame``s.

Job: one small interface, ``FrameSource.grab() -> av.VideoFrame``, over
- ``X11GrabCapture``: PyAV's ``x11grab`` device (XShm inside FFmpeg), frames in
  ``bgr0``; the primary path;
- ``MssCapture``: ``mss`` (XShm through XCB), a numpy ``H x W x 4`` BGRA array
  wrapped in a ``bgra`` frame; the fallback when x11grab cannot open;
- ``GameCapture``: renders ``streamer.desktop.game.Game`` frames (``bgra``),
  with numpy or with OpenGL on an EGL device (``streamer.desktop.glgame``).
``open_capture`` picks x11grab and falls back to mss.  Frames leave in the
source's own 32-bit BGR layout: the encoder converts once if it must (NVENC
takes bgr0/bgra as is).

Pacing: ``grab()`` grabs *now* and does not wait for a frame slot; the
caller's frame loop paces (and may change fps live).  x11grab is therefore
opened with a nominal ``framerate`` far above any real rate
(``X11GRAB_NOMINAL_FPS``): its internal pacer then never sleeps, where a
30 fps pacer would add up to a frame of latency and jitter against ours.

Timestamps: every frame has ``time_base`` 1/1_000_000 and ``pts`` in
microseconds of wall-clock time at the grab (x11grab's own convention; mss and
game frames follow it).  Encoders restamp as they need.

Concurrency model: blocking; ``grab`` runs in one worker thread (the session's
frame thread).  ``stats()`` may be called from any thread (a lock guards the
counters).  ``close()`` may be called from another thread: it waits for an
in-flight ``grab`` (a lock) so FFmpeg/XCB state is never freed under it;
``grab`` after ``close`` raises ``CaptureError``.  ``GameCapture``'s GL
renderer is created inside the first ``grab`` (the frame thread) and released
by ``close`` on whichever thread calls it; the renderer binds its EGL context
only for the length of each call, so that hand-over is safe.

Invariants: a source captures a fixed ``width x height`` region at the top
left; after the display is resized the caller opens a new source.  No pixel
format conversion happens here.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal, Protocol

import av
import mss
import numpy as np
import numpy.typing as npt

from streamer.desktop.game import Game
from streamer.desktop.glgame import GlGameRenderer, GlUnavailableError

log = logging.getLogger(__name__)

X11GRAB_NOMINAL_FPS: Final = 1000  # frames/s: high enough that x11grab's own pacer never sleeps
STATS_WINDOW: Final = 300  # frames in the rolling window behind p50_ms (10 s at 30 fps)
TIME_BASE: Final = Fraction(1, 1_000_000)  # pts unit: microseconds

Backend = Literal["auto", "x11grab", "mss"]
GameRendererKind = Literal["cpu", "gl"]  # numpy, or OpenGL through EGL (streamer.desktop.glgame)


class CaptureError(Exception):
    """A capture could not be opened or a grab failed."""


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """Per-frame grab cost in milliseconds (wall time of ``grab()``, which does not pace)."""

    backend: str
    frames: int
    last_ms: float
    mean_ms: float  # since open
    p50_ms: float  # over the last STATS_WINDOW frames
    max_ms: float  # since open


class FrameSource(Protocol):
    """What the session's frame loop needs from a capture."""

    backend: str
    width: int
    height: int

    def grab(self) -> av.VideoFrame: ...

    def stats(self) -> CaptureStats: ...

    def close(self) -> None: ...


class _Recorder:
    """Thread-safe rolling stats of grab durations."""

    def __init__(self, backend: str) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._window: deque[float] = deque(maxlen=STATS_WINDOW)
        self._frames = 0
        self._total_ms = 0.0
        self._max_ms = 0.0
        self._last_ms = 0.0

    def add(self, ms: float) -> None:
        with self._lock:
            self._window.append(ms)
            self._frames += 1
            self._total_ms += ms
            self._last_ms = ms
            self._max_ms = max(self._max_ms, ms)

    def snapshot(self) -> CaptureStats:
        with self._lock:
            return CaptureStats(
                backend=self._backend,
                frames=self._frames,
                last_ms=self._last_ms,
                mean_ms=self._total_ms / self._frames if self._frames else 0.0,
                p50_ms=statistics.median(self._window) if self._window else 0.0,
                max_ms=self._max_ms,
            )


def _wall_pts() -> int:
    return time.time_ns() // 1000


def bgra_frame(array: npt.NDArray[np.uint8]) -> av.VideoFrame:
    """Copy an ``H x W x 4`` BGRA array into a new ``bgra`` frame (one copy, no conversion).

    Measured about twice as fast as ``av.VideoFrame.from_ndarray`` here (PyAV 18):
    one numpy copy straight into the frame's plane, honouring its line size.
    """
    height, width = int(array.shape[0]), int(array.shape[1])
    if array.shape != (height, width, 4) or array.dtype != np.uint8:
        raise ValueError(f"expected H x W x 4 uint8, got {array.shape} {array.dtype}")
    frame = av.VideoFrame(width, height, "bgra")
    plane = frame.planes[0]
    rows = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(height, plane.line_size)
    rows[:, : width * 4] = array.reshape(height, width * 4)
    return frame


class X11GrabCapture:
    """FFmpeg's x11grab: ``bgr0`` frames of the region ``width x height`` at (0, 0)."""

    backend = "x11grab"

    def __init__(self, display: str, width: int, height: int, *, draw_mouse: bool = True) -> None:
        self.width, self.height = width, height
        self._lock = threading.Lock()
        self._recorder = _Recorder(self.backend)
        options = {
            "video_size": f"{width}x{height}",
            "framerate": str(X11GRAB_NOMINAL_FPS),
            "draw_mouse": "1" if draw_mouse else "0",
        }
        try:
            self._container: av.container.InputContainer | None = av.open(display, format="x11grab", options=options)
        except (av.FFmpegError, OSError) as exc:
            raise CaptureError(f"x11grab cannot open {display} at {width}x{height}: {exc}") from exc
        self._frames: Iterator[av.VideoFrame] = self._container.decode(video=0)

    def grab(self) -> av.VideoFrame:
        """The screen now, as a ``bgr0`` frame."""
        with self._lock:
            if self._container is None:
                raise CaptureError("capture closed")
            start = time.perf_counter()
            try:
                frame = next(self._frames)
            except (av.FFmpegError, StopIteration) as exc:
                raise CaptureError(f"x11grab failed: {exc!r}") from exc
            self._recorder.add((time.perf_counter() - start) * 1000)
        return frame

    def stats(self) -> CaptureStats:
        return self._recorder.snapshot()

    def close(self) -> None:
        with self._lock:
            if self._container is not None:
                self._container.close()
                self._container = None


class MssCapture:
    """mss (XShm via XCB): BGRA numpy arrays, wrapped as ``bgra`` frames by ``grab``."""

    backend = "mss"

    def __init__(self, display: str, width: int, height: int, *, draw_mouse: bool = True) -> None:
        self.width, self.height = width, height
        self._lock = threading.Lock()
        self._recorder = _Recorder(self.backend)
        self._region = {"left": 0, "top": 0, "width": width, "height": height}
        try:
            self._sct: mss.MSS | None = mss.MSS(display=display, with_cursor=draw_mouse)
        except mss.ScreenShotError as exc:
            raise CaptureError(f"mss cannot open {display}: {exc}") from exc

    def _grab_locked(self) -> npt.NDArray[np.uint8]:
        if self._sct is None:
            raise CaptureError("capture closed")
        try:
            shot = self._sct.grab(self._region)
        except mss.ScreenShotError as exc:
            raise CaptureError(f"mss grab failed: {exc}") from exc
        return np.frombuffer(shot.raw, dtype=np.uint8).reshape(self.height, self.width, 4)

    def grab_array(self) -> npt.NDArray[np.uint8]:
        """The screen now as an ``H x W x 4`` BGRA array (a fresh buffer per call)."""
        with self._lock:
            start = time.perf_counter()
            array = self._grab_locked()
            self._recorder.add((time.perf_counter() - start) * 1000)
        return array

    def grab(self) -> av.VideoFrame:
        """The screen now, as a ``bgra`` frame."""
        with self._lock:
            start = time.perf_counter()
            pts = _wall_pts()
            frame = bgra_frame(self._grab_locked())
            self._recorder.add((time.perf_counter() - start) * 1000)
        frame.pts, frame.time_base = pts, TIME_BASE
        return frame

    def stats(self) -> CaptureStats:
        return self._recorder.snapshot()

    def close(self) -> None:
        with self._lock:
            if self._sct is not None:
                self._sct.close()
                self._sct = None


class GameRendererUnavailable(CaptureError):
    """The game's GL renderer cannot run here; ``reason`` says why (from ``GlUnavailableError``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"GL game renderer unavailable: {reason}")
        self.reason = reason


class GameCapture:
    """Frames of the built-in game, rendered at the time ``clock_ms()`` returns (ms since the epoch).

    ``renderer="cpu"`` (default) draws with ``game.render`` (numpy, plus whatever a
    ``Game`` subclass adds).  ``renderer="gl"`` steps ``game.scene`` and draws it
    with ``GlGameRenderer`` on EGL device ``gl_device`` (None: EGL's first), which
    is created by the first ``grab``, so on the frame thread and off the event
    loop.  If it cannot start, that grab and every later one raise
    ``GameRendererUnavailable`` with the reason (no retry per frame); a caller
    that wants to fail before streaming calls ``prepare()`` in a worker thread.
    """

    def __init__(
        self,
        game: Game,
        clock_ms: Callable[[], int],
        *,
        renderer: GameRendererKind = "cpu",
        gl_device: int | None = None,
    ) -> None:
        if renderer not in ("cpu", "gl"):
            raise ValueError(f"renderer must be 'cpu' or 'gl', got {renderer!r}")
        self.game = game
        self.width, self.height = game.width, game.height
        self.renderer: GameRendererKind = renderer
        self.gl_device = gl_device
        self.backend = "game" if renderer == "cpu" else "game-gl"
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._recorder = _Recorder(self.backend)
        self._gl: GlGameRenderer | None = None
        self._gl_failure: str | None = None
        self._closed = False

    @property
    def renderer_string(self) -> str | None:
        """What draws: "numpy", GL_RENDERER once the GL renderer runs, None before that."""
        if self.renderer == "cpu":
            return "numpy"
        gl = self._gl
        return None if gl is None else gl.renderer_string

    def prepare(self) -> None:
        """Start the renderer now (blocking: EGL start-up takes tens of ms); raises ``GameRendererUnavailable``."""
        with self._lock:
            if self._closed:
                raise CaptureError("capture closed")
            if self.renderer == "gl":
                self._gl_renderer()

    def _gl_renderer(self) -> GlGameRenderer:
        if self._gl is None:
            if self._gl_failure is not None:
                raise GameRendererUnavailable(self._gl_failure)
            try:
                self._gl = GlGameRenderer(self.game.width, self.game.height, device_index=self.gl_device)
            except GlUnavailableError as exc:
                self._gl_failure = exc.reason
                raise GameRendererUnavailable(exc.reason) from exc
            log.info("game renders with OpenGL on %s (EGL device %s)", self._gl.renderer_string, self.gl_device)
        return self._gl

    def _render(self, now_ms: int) -> npt.NDArray[np.uint8]:
        if self.renderer == "cpu":
            return self.game.render(now_ms)
        gl = self._gl_renderer()
        scene = self.game.scene(now_ms)
        if gl.size != (scene.width, scene.height):
            gl.resize(scene.width, scene.height)
        return gl.render(scene)

    def grab(self) -> av.VideoFrame:
        """Render the next game frame as a ``bgra`` frame (a copy: the renderer reuses its buffer)."""
        with self._lock:
            if self._closed:
                raise CaptureError("capture closed")
            start = time.perf_counter()
            now_ms = self._clock_ms()
            frame = bgra_frame(self._render(now_ms))
            self._recorder.add((time.perf_counter() - start) * 1000)
        frame.pts, frame.time_base = now_ms * 1000, TIME_BASE
        return frame

    def stats(self) -> CaptureStats:
        return self._recorder.snapshot()

    def close(self) -> None:
        """Release the GL renderer if one runs (any thread; waits for an in-flight grab).  Idempotent."""
        with self._lock:
            self._closed = True
            gl, self._gl = self._gl, None
            if gl is not None:
                gl.close()


def open_capture(
    display: str, width: int, height: int, *, backend: Backend = "auto", draw_mouse: bool = True
) -> FrameSource:
    """Open a capture of ``display`` (e.g. ``":3"``): x11grab, else mss when ``backend="auto"``."""
    if backend in ("auto", "x11grab"):
        try:
            return X11GrabCapture(display, width, height, draw_mouse=draw_mouse)
        except CaptureError as exc:
            if backend == "x11grab":
                raise
            log.warning("x11grab unavailable, falling back to mss: %s", exc)
    return MssCapture(display, width, height, draw_mouse=draw_mouse)
