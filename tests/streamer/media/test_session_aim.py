"""Relative mouse end to end: a real aiortc viewer sends ``pr`` on the input channel; the built-in
game's crosshair moves in the decoded frames and a click shows a shot; a desktop session's X pointer
moves by the motion.  ``stats`` tells the viewer which controls to show."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import numpy as np
import pytest
from Xlib import display as xdisplay

from broker.protocol import ControlScheme
from streamer.desktop.game import CROSSHAIR_BGR, find_crosshair
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import Viewer, until

pytestmark = pytest.mark.timeout(60)

CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100)
GAME_W, GAME_H = 640, 360
TOLERANCE_PX = 3.0  # the crosshair's centre in a decoded (lossy) frame


@pytest.fixture
async def viewer() -> AsyncIterator[Viewer]:
    v = Viewer()
    yield v
    await v.close()


def _near(found: tuple[float, float] | None, want: tuple[float, float]) -> bool:
    return found is not None and abs(found[0] - want[0]) <= TOLERANCE_PX and abs(found[1] - want[1]) <= TOLERANCE_PX


def _magenta_pixels(image: np.ndarray) -> int:
    b, g, r = (image[..., i].astype(np.int16) for i in range(3))
    assert CROSSHAIR_BGR == (255, 0, 255)
    return int(((b > 150) & (r > 150) & (g < 110)).sum())


async def test_relative_motion_moves_the_crosshair_and_a_click_shoots(viewer: Viewer) -> None:
    runtime = SessionRuntime(SessionSpec(id="aim-1", kind="game", width=GAME_W, height=GAME_H, fps=30), CONFIG)
    await runtime.start()
    try:
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(5)
        stats = await viewer.wait_message(lambda m: m.get("t") == "stats", "stats")
        assert stats["controls"] == ControlScheme.BUILTIN_GAME == "builtin_game"

        start = find_crosshair(viewer.images[-1])
        assert start is not None
        for _ in range(4):  # as the web client sends it: one summed motion per animation frame
            viewer.send({"t": "pr", "dx": 30, "dy": -10})
        want = (start[0] + 120, start[1] - 40)
        await until(lambda: _near(find_crosshair(viewer.images[-1]), want),
                    f"the crosshair did not move from {start} to {want}")  # fmt: skip
        plain = _magenta_pixels(viewer.images[-1])
        viewer.send({"t": "pb", "b": 1, "d": True})
        viewer.send({"t": "pb", "b": 1, "d": False})
        # the shot box fills the crosshair's centre for 150 ms: a few frames at 30 fps
        await until(lambda: _magenta_pixels(viewer.images[-1]) > plain * 1.2, "no shot was drawn")
        viewer.send({"t": "pr", "dx": -5000, "dy": 0})  # past POINTER_MAX_DELTA: dropped, the aim stays
        viewer.send({"t": "ping", "id": 1, "ts": 1.0})
        await viewer.wait_message(lambda m: m.get("t") == "pong", "pong")  # the bad message was handled first
        assert runtime.stats()["input"]["dropped"] == {"out_of_range": 1}
        assert runtime.stats()["input"]["accepted"]["pr"] == 4
        assert _near(find_crosshair(viewer.images[-1]), want)
    finally:
        await runtime.stop()


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("Xvfb", "openbox")),
                    reason="desktop sessions need Xvfb and openbox (Debian packages xvfb, openbox)")
async def test_relative_motion_moves_the_desktop_pointer(viewer: Viewer) -> None:
    spec = SessionSpec(id="aim-desk", kind="desktop", width=800, height=600, fps=15, app_command=("sleep", "120"))
    runtime = SessionRuntime(spec, CONFIG)
    await runtime.start()
    try:
        name = runtime.display_name
        assert name is not None
        dpy = xdisplay.Display(name)

        def pointer() -> tuple[int, int]:
            reply = dpy.screen().root.query_pointer()
            return int(reply.root_x), int(reply.root_y)

        try:
            await viewer.connect(runtime.handle_signal)
            await viewer.wait_frames(2)
            stats = await viewer.wait_message(lambda m: m.get("t") == "stats", "stats")
            assert stats["controls"] is None  # a desktop: nothing extra to show
            viewer.send({"t": "pm", "x": 0.5, "y": 0.5})
            await until(lambda: pointer() == (400, 300), "the absolute move did not arrive")
            viewer.send({"t": "pr", "dx": 25, "dy": -40})
            viewer.send({"t": "pr", "dx": 5, "dy": 0})
            await until(lambda: pointer() == (430, 260), f"the relative motion did not arrive: {pointer()}")
        finally:
            dpy.close()
    finally:
        await runtime.stop()
