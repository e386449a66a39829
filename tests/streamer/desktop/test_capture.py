"""Capture from a real Xvfb with x11grab and mss; game frames through the same interface."""

from __future__ import annotations

import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from fractions import Fraction

import numpy as np
import pytest
from Xlib import X
from Xlib import display as xdisplay

from streamer.desktop import capture
from streamer.desktop.capture import (
    CaptureError,
    GameCapture,
    MssCapture,
    X11GrabCapture,
    bgra_frame,
    open_capture,
)
from streamer.desktop.display import DisplayConfig, VirtualDisplay
from streamer.desktop.game import Game, Stamp, read_stamp

needs_xvfb = pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed (Debian package xvfb)")
pytestmark = pytest.mark.timeout(60)

WIDTH, HEIGHT = 640, 360
# A window with a known colour at a known place: BGR (10, 20, 200) at (32, 48) size 64x40.
BOX_X, BOX_Y, BOX_W, BOX_H = 32, 48, 64, 40
BOX_BGR = (10, 20, 200)


@pytest.fixture
async def display() -> AsyncIterator[VirtualDisplay]:
    config = DisplayConfig(width=WIDTH, height=HEIGHT, max_width=1280, max_height=720, window_manager=None)
    async with VirtualDisplay(config) as d:
        yield d


@pytest.fixture
def coloured_box(display: VirtualDisplay) -> Iterator[None]:
    """Map an undecorated window filled with BOX_BGR; it lives as long as this connection."""
    dpy = xdisplay.Display(display.name)
    screen = dpy.screen()
    b, g, r = BOX_BGR
    window = screen.root.create_window(
        BOX_X,
        BOX_Y,
        BOX_W,
        BOX_H,
        0,
        screen.root_depth,
        X.InputOutput,
        X.CopyFromParent,
        background_pixel=(r << 16) | (g << 8) | b,
        override_redirect=True,
    )
    window.map()
    dpy.sync()
    yield
    dpy.close()


def _box_pixels(array: np.ndarray) -> np.ndarray:
    return array[BOX_Y + 2 : BOX_Y + BOX_H - 2, BOX_X + 2 : BOX_X + BOX_W - 2, :3]


@needs_xvfb
@pytest.mark.usefixtures("coloured_box")
def test_x11grab_frames(display: VirtualDisplay) -> None:
    cap = X11GrabCapture(display.name, WIDTH, HEIGHT, draw_mouse=False)
    try:
        frames = [cap.grab() for _ in range(5)]
    finally:
        cap.close()
    for frame in frames:
        assert (frame.width, frame.height, frame.format.name) == (WIDTH, HEIGHT, "bgr0")
        assert frame.time_base == Fraction(1, 1_000_000)
    pts = [f.pts for f in frames]
    assert pts == sorted(pts) and len(set(pts)) == len(pts)
    array = frames[-1].to_ndarray(format="bgr24")  # only the test converts
    assert (_box_pixels(array) == BOX_BGR).all()
    stats = cap.stats()
    assert stats.backend == "x11grab" and stats.frames == 5
    assert 0 < stats.p50_ms <= stats.max_ms and stats.last_ms > 0 and stats.mean_ms > 0


@needs_xvfb
@pytest.mark.usefixtures("coloured_box")
def test_mss_frames_and_arrays(display: VirtualDisplay) -> None:
    cap = MssCapture(display.name, WIDTH, HEIGHT, draw_mouse=False)
    try:
        array = cap.grab_array()
        frame = cap.grab()
    finally:
        cap.close()
    assert array.shape == (HEIGHT, WIDTH, 4) and array.dtype == np.uint8
    assert (_box_pixels(array) == BOX_BGR).all()
    assert (frame.width, frame.height, frame.format.name) == (WIDTH, HEIGHT, "bgra")
    assert frame.pts is not None and frame.time_base == Fraction(1, 1_000_000)
    assert (_box_pixels(frame.to_ndarray()) == BOX_BGR).all()
    assert cap.stats().frames == 2


@needs_xvfb
def test_capture_of_a_region_smaller_than_the_screen(display: VirtualDisplay) -> None:
    cap = open_capture(display.name, 320, 200)
    try:
        frame = cap.grab()
    finally:
        cap.close()
    assert (frame.width, frame.height) == (320, 200)


@needs_xvfb
async def test_capture_after_resize(display: VirtualDisplay) -> None:
    await display.resize(1280, 720)
    for backend in ("x11grab", "mss"):
        cap = open_capture(display.name, 1280, 720, backend=backend)  # type: ignore[arg-type]
        try:
            frame = cap.grab()
        finally:
            cap.close()
        assert (frame.width, frame.height) == (1280, 720)


@needs_xvfb
def test_open_capture_prefers_x11grab(display: VirtualDisplay) -> None:
    cap = open_capture(display.name, WIDTH, HEIGHT)
    cap.close()
    assert cap.backend == "x11grab"


@needs_xvfb
def test_open_capture_falls_back_to_mss(display: VirtualDisplay, monkeypatch: pytest.MonkeyPatch) -> None:
    class BrokenX11Grab:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise CaptureError("no x11grab in this FFmpeg")

    monkeypatch.setattr(capture, "X11GrabCapture", BrokenX11Grab)
    cap = open_capture(display.name, WIDTH, HEIGHT)
    try:
        assert cap.backend == "mss"
        assert cap.grab().format.name == "bgra"
    finally:
        cap.close()
    with pytest.raises(CaptureError):
        open_capture(display.name, WIDTH, HEIGHT, backend="x11grab")


def test_x11grab_on_a_missing_display_fails_cleanly() -> None:
    with pytest.raises(CaptureError, match="x11grab cannot open"):
        X11GrabCapture(":4000", 320, 240)


@needs_xvfb
def test_grab_after_close_raises(display: VirtualDisplay) -> None:
    for backend in ("x11grab", "mss"):
        cap = open_capture(display.name, WIDTH, HEIGHT, backend=backend)  # type: ignore[arg-type]
        cap.close()
        cap.close()  # idempotent
        with pytest.raises(CaptureError, match="closed"):
            cap.grab()


@needs_xvfb
def test_close_from_another_thread_waits_for_the_grab(display: VirtualDisplay) -> None:
    cap = X11GrabCapture(display.name, WIDTH, HEIGHT)
    results: list[object] = []
    three_frames = threading.Event()

    def loop() -> None:
        try:
            while True:
                results.append(cap.grab())
                if len(results) == 3:
                    three_frames.set()
        except CaptureError as exc:
            results.append(exc)

    worker = threading.Thread(target=loop)
    worker.start()
    assert three_frames.wait(timeout=10)
    cap.close()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert isinstance(results[-1], CaptureError)


def test_game_capture_frames_carry_the_clock() -> None:
    now = [1_764_700_000_000]
    cap = GameCapture(Game(WIDTH, HEIGHT), clock_ms=lambda: now[0])
    first = cap.grab()
    now[0] += 33
    second = cap.grab()
    assert first.format.name == "bgra" and (first.width, first.height) == (WIDTH, HEIGHT)
    assert (first.pts, second.pts) == (1_764_700_000_000_000, 1_764_700_000_033_000)
    # Frames are copies: the game's buffer moved on, the first frame did not.
    assert read_stamp(first.to_ndarray()) == Stamp(0, 1_764_700_000_000)
    assert read_stamp(second.to_ndarray()) == Stamp(1, 1_764_700_000_033)
    assert cap.stats().frames == 2


@pytest.mark.parametrize(("width", "height"), [(640, 360), (53, 37)])
def test_bgra_frame_copies_exactly(width: int, height: int) -> None:
    array = np.random.default_rng(0).integers(0, 256, (height, width, 4), dtype=np.uint8)
    frame = bgra_frame(array)
    assert frame.format.name == "bgra"
    assert (frame.to_ndarray() == array).all()
    with pytest.raises(ValueError):
        bgra_frame(array[..., :3])
