"""The stream self-test's X source: the stamped pattern painted into a private Xvfb and grabbed by the capture
sessions use.

Job:
- ``choose_source(requested, xvfb_path, backends, capture_backend)``: pure; ``auto`` is ``x11`` when Xvfb and a
  capture backend are here, else ``pattern`` (frames fed straight to the encoder), with the reason.
- ``XPatternPainter``: one X client of a display: an override-redirect window at (0, 0) the size of the
  captured region, the pointer parked outside that region (x11grab draws the cursor, as in sessions), and
  ``paint(bgra)``: core ``PutImage`` requests through python-xlib (already the node's X library for input and
  RandR: no new dependency), split to the server's request size limit, then a round trip, so the server has
  drawn the picture before ``paint`` returns.
- ``PaintedCapture``: a ``FrameSource`` whose ``grab`` paints frame ``n`` of the self-test picture
  (``framecheck.source_picture``), then grabs the screen through the wrapped capture (``open_capture``:
  x11grab or mss, the backend the node's sessions use).  Painting and grabbing in lockstep means every frame
  is grabbed once and never torn (a grab between two ``PutImage`` requests of one frame cannot happen).
  ``prime()`` paints frame 0 and grabs until the capture shows a stamp: the grabs before it are skipped and
  counted (``stale_skipped``): x11grab hands out the frames its stream probe grabbed when it was opened, 17
  black frames measured here.
- ``x11_source(...)``: an async context manager: Xvfb (``VirtualDisplay``, no window manager, no app), the
  painter, the capture, primed; everything closed on the way out, also on a failure or cancellation.

Concurrency model: the display is the event loop's (asyncio subprocess); the painter's X connection and the
capture are used by one thread at a time: ``prime`` in a worker thread, then ``grab`` on the frame thread.
Invariants: the painted window covers exactly the captured region and nothing else draws on this display;
after ``x11_source`` exits, no Xvfb, X connection or capture of ours is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, cast

import av
import numpy as np
import numpy.typing as npt
from Xlib import X
from Xlib import display as xdisplay
from Xlib.error import DisplayError as XDisplayError
from Xlib.error import XError

from streamer.desktop.capture import CaptureError, CaptureStats, FrameSource, open_capture
from streamer.desktop.display import DisplayConfig, VirtualDisplay
from streamer.desktop.game import read_stamp
from streamer.node.framecheck import Mangle, source_picture

SOURCES: Final = ("auto", "x11", "pattern")
CAPTURE_BACKENDS: Final = ("auto", "x11grab", "mss")
SCREEN_MARGIN_PX: Final = 32  # the screen is this much wider and taller than the capture: the pointer parks there
PRIME_MAX_GRABS: Final = 300  # grabs before the capture must show the painted stamp (17 stale measured, x11grab)
PUT_IMAGE_HEADER_BYTES: Final = 24  # core PutImage request header


@dataclass(frozen=True)
class SourceChoice:
    source: Literal["x11", "pattern"]
    reason: str


def capture_backends() -> tuple[str, ...]:
    """The capture backends this process has: x11grab when PyAV's FFmpeg has it; mss (a dependency) always."""
    return (("x11grab",) if "x11grab" in av.formats_available else ()) + ("mss",)


def choose_source(requested: str, xvfb_path: str | None, backends: Sequence[str],
                  capture_backend: str = "auto") -> SourceChoice:
    """Where the self-test's frames come from.  Pure.  Raises ValueError for an unknown value or an ``x11``
    this host cannot do (no Xvfb, or not the capture backend asked for)."""
    if requested not in SOURCES:
        raise ValueError(f"selftest source must be one of {', '.join(SOURCES)}, got {requested!r}")
    if capture_backend not in CAPTURE_BACKENDS:
        raise ValueError(f"capture backend must be one of {', '.join(CAPTURE_BACKENDS)}, got {capture_backend!r}")
    if requested == "pattern":
        return SourceChoice("pattern", "asked for: the pattern is fed straight to the encoder, no capture")
    usable = [b for b in backends if capture_backend in ("auto", b)]
    missing = "no Xvfb on PATH" if xvfb_path is None else "" if usable else f"no {capture_backend} capture"
    if missing and requested == "x11":
        raise ValueError(f"selftest source x11 cannot run here: {missing}")
    if missing:
        return SourceChoice("pattern", f"auto: {missing}, so the pattern is fed straight to the encoder")
    how = "asked for" if requested == "x11" else "auto"
    return SourceChoice("x11", f"{how}: painted into a private Xvfb ({xvfb_path}), grabbed by the sessions' "
                               f"capture ({capture_backend}: {' or '.join(usable)})")


class Painter(Protocol):
    def paint(self, bgra: npt.NDArray[np.uint8], first_row: int = 0) -> None: ...

    def close(self) -> None: ...


class XPatternPainter:
    """An X window at (0, 0) of ``width x height`` that shows the BGRA pictures it is given (see module doc)."""

    def __init__(self, display: str, width: int, height: int) -> None:
        self.width, self.height = width, height
        try:
            self._dpy = xdisplay.Display(display)
        except (XDisplayError, OSError) as exc:
            raise CaptureError(f"the self-test painter cannot connect to {display}: {exc}") from exc
        try:
            screen = self._dpy.screen()
            formats = {f.depth: f.bits_per_pixel for f in self._dpy.display.info.pixmap_formats}
            if screen.root_depth != 24 or formats.get(24) != 32:
                raise CaptureError(f"{display} has depth {screen.root_depth} ({formats.get(24)} bits a pixel at "
                                   "depth 24): the painter draws 32-bit BGRX pixels only")
            self._window = screen.root.create_window(
                0, 0, width, height, 0, screen.root_depth, X.InputOutput, X.CopyFromParent,
                override_redirect=True, background_pixmap=X.NONE)  # no background: nothing repaints over ours
            self._gc = self._window.create_gc()
            self._window.map()
            # park the pointer in the margin right of and below the captured region: x11grab draws the cursor
            screen.root.warp_pointer(screen.width_in_pixels - 1, screen.height_in_pixels - 1)
            max_bytes = self._dpy.display.info.max_request_length * 4 - PUT_IMAGE_HEADER_BYTES
            self._rows_per_request = max(1, max_bytes // (width * 4))
            self._dpy.sync()
        except (XError, CaptureError):
            self._dpy.close()
            raise

    def paint(self, bgra: npt.NDArray[np.uint8], first_row: int = 0) -> None:
        """Show rows ``first_row:`` of ``bgra`` (``height x width x 4``); returns once the server has drawn them."""
        if bgra.shape != (self.height, self.width, 4):
            raise ValueError(f"expected {self.height} x {self.width} x 4, got {bgra.shape}")
        for y in range(first_row, self.height, self._rows_per_request):
            rows = np.ascontiguousarray(bgra[y: y + self._rows_per_request])
            self._window.put_image(self._gc, 0, y, self.width, rows.shape[0], X.ZPixmap, 24, 0, rows.tobytes())
        self._dpy.sync()  # a round trip: the capture's own connection sees the picture from now on

    def close(self) -> None:
        with contextlib.suppress(XError, OSError):
            self._dpy.close()


class PaintedCapture:
    """A ``FrameSource``: paint frame ``n`` of the self-test picture, then grab it with ``capture`` (module doc)."""

    def __init__(self, painter: Painter, capture: FrameSource, mangle: Mangle | None = None) -> None:
        self.painter = painter  # replaceable by a test or drill (a faulty painter)
        self.capture = capture
        self.backend = capture.backend
        self.width, self.height = capture.width, capture.height
        self.frames = 0  # frames painted (the next frame's number)
        self.stale_skipped = 0  # grabs before the capture showed the first painted stamp
        self._mangle = mangle

    def _paint_next(self) -> None:
        picture = source_picture(self.width, self.height, self.frames, time.time_ns() // 1_000_000, self._mangle)
        self.painter.paint(picture)
        self.frames += 1

    def prime(self, max_grabs: int = PRIME_MAX_GRABS) -> int:
        """Paint frame 0 and grab until the capture shows a stamp; returns the grabs skipped before it."""
        self._paint_next()
        for _ in range(max_grabs):
            if read_stamp(self.capture.grab().to_ndarray(format="bgr24")) is not None:
                return self.stale_skipped
            self.stale_skipped += 1
        raise CaptureError(f"the {self.backend} capture never showed the painted stamp in {max_grabs} grabs")

    def grab(self) -> av.VideoFrame:
        self._paint_next()
        return self.capture.grab()

    def stats(self) -> CaptureStats:
        return self.capture.stats()

    def close(self) -> None:
        self.capture.close()


@contextlib.asynccontextmanager
async def x11_source(width: int, height: int, *, capture_backend: str = "auto", xvfb: str = "Xvfb",
                     mangle: Mangle | None = None) -> AsyncIterator[PaintedCapture]:
    """A primed ``PaintedCapture`` on a private Xvfb; closes capture, painter and display on the way out."""
    display = VirtualDisplay(DisplayConfig(width=width + SCREEN_MARGIN_PX, height=height + SCREEN_MARGIN_PX,
                                           window_manager=None, xvfb=xvfb))
    await display.start()
    painter: XPatternPainter | None = None
    capture: FrameSource | None = None
    try:
        painter = await asyncio.to_thread(XPatternPainter, display.name, width, height)
        backend = cast(Literal["auto", "x11grab", "mss"], capture_backend)
        capture = await asyncio.to_thread(open_capture, display.name, width, height, backend=backend)
        source = PaintedCapture(painter, capture, mangle)
        await asyncio.to_thread(source.prime)
        yield source
    finally:
        if capture is not None:
            await asyncio.to_thread(capture.close)
        if painter is not None:
            await asyncio.to_thread(painter.close)
        await display.close()
