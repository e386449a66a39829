"""A desktop session's clipboard both ways and its screen following the viewer's window.

Real Xvfb, real aiortc viewer (tests.streamer.viewer), real encoder: the viewer's ``cb`` lands in the
session's CLIPBOARD and never comes back; text copied in the session (xclip) reaches the viewer's
data channel; an ``rs`` message changes the size of the frames the viewer decodes, within the
node's limits; a malformed one is dropped and the stream goes on.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator

import pytest

from streamer.abr.viewport import fit, limits_for
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import DEADLINE_S, Viewer, until

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("Xvfb", "openbox", "xclip")),
                       reason="needs Xvfb, openbox and xclip (Debian packages xvfb, openbox, xclip)"),
]

# a 640x480 area budget, 800 px sides at most: small frames keep this fast on a loaded machine
CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), resize_max_pixels=640 * 480, resize_max_side=800)
LIMITS = limits_for(320, 240, 640 * 480, 800)


@pytest.fixture
async def desktop() -> AsyncIterator[tuple[SessionRuntime, Viewer]]:
    spec = SessionSpec(id="desk-io", kind="desktop", width=320, height=240, fps=30, app_command=("sleep", "600"))
    runtime = SessionRuntime(spec, CONFIG)
    await runtime.start()
    viewer = Viewer()
    try:
        await viewer.connect(runtime.handle_signal)
        yield runtime, viewer
    finally:
        await viewer.close()
        await runtime.stop()
    # the clipboard watcher's thread (and every other thread of the session) is gone
    assert not [t.name for t in threading.enumerate() if t.name.endswith("-desk-io")]


def _xclip(display: str, *args: str, text: bytes | None = None) -> str:
    """xclip's output; "" while the selection has no owner yet (xclip -o exits 1)."""
    if text is not None:  # the selection server xclip forks keeps no pipe of ours open
        subprocess.run(["xclip", "-selection", "clipboard", *args], input=text, env={"DISPLAY": display},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=DEADLINE_S)
        return ""
    out = subprocess.run(["xclip", "-selection", "clipboard", *args], env={"DISPLAY": display},
                         capture_output=True, timeout=DEADLINE_S)
    return out.stdout.decode() if out.returncode == 0 else ""


def _clipboards(viewer: Viewer) -> list[str]:
    return [m["text"] for m in viewer.messages if m.get("t") == "cb"]


async def test_clipboard_goes_both_ways_without_echo(desktop: tuple[SessionRuntime, Viewer]) -> None:
    runtime, viewer = desktop
    display = runtime.display_name
    assert display is not None
    pasted = "from the browser ✓"
    viewer.send({"t": "cb", "text": pasted})

    async def remote_text() -> str:
        return await asyncio.to_thread(_xclip, display, "-o")

    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while (text := await remote_text()) != pasted:
        assert asyncio.get_running_loop().time() < deadline, f"the session's clipboard holds {text!r}"
    # copied inside the session: reaches the viewer's data channel
    copied = "copied in the desktop\nsecond line 😀"
    await asyncio.to_thread(_xclip, display, "-in", text=copied.encode())
    await until(lambda: copied in _clipboards(viewer), "the session's clipboard never reached the viewer")
    # the viewer's own paste (xclip took the selection for it) was never sent back
    assert _clipboards(viewer) == [copied]


async def test_the_screen_follows_the_viewers_window_within_the_limits(
    desktop: tuple[SessionRuntime, Viewer],
) -> None:
    runtime, viewer = desktop
    first = await viewer.wait_frames(3)
    assert {(f.width, f.height) for f in first} == {(320, 240)}

    async def decoded(size: tuple[int, int]) -> None:
        await until(lambda: bool(viewer.frames) and (viewer.frames[-1].width, viewer.frames[-1].height) == size,
                    f"the viewer never decoded {size}")

    viewer.send({"t": "rs", "w": 480, "h": 270})
    await decoded((480, 270))
    # a 2x HiDPI window far over the budget: scaled down whole (same shape) to at most 640x480 pixels
    viewer.send({"t": "rs", "w": 2560, "h": 1440})
    hidpi = fit(2560, 1440, LIMITS)
    assert hidpi[0] * hidpi[1] <= 640 * 480 and abs(hidpi[0] / hidpi[1] - 16 / 9) < 0.01
    await decoded(hidpi)
    # a portrait phone: the 800 px side limit holds the height
    viewer.send({"t": "rs", "w": 1170, "h": 2532})
    portrait = fit(1170, 2532, LIMITS)
    assert portrait[1] == 800 and portrait[0] % 2 == 0
    await decoded(portrait)
    last = viewer.frames[-1]
    # malformed: dropped and counted, the stream goes on at its size
    dropped = runtime.stats()["input_dropped"]
    viewer.send({"t": "rs", "w": 10, "h": 100000})
    viewer.send({"t": "rs", "w": "wide", "h": 300})
    await until(lambda: runtime.stats()["input_dropped"] >= dropped + 2, "bad resizes were not dropped")
    before = len(viewer.frames)
    await viewer.wait_frames(5, after=before)
    assert (viewer.frames[-1].width, viewer.frames[-1].height) == (last.width, last.height)
    assert runtime.resizes == 3
    # a capture never grabbed outside the screen while it changed size: no frame failed
    assert runtime._pipeline is not None and runtime._pipeline.stats().failures == 0
    assert (runtime.stats()["width"], runtime.stats()["height"]) == (last.width, last.height)
