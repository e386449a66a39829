"""The remote clipboard: XFixes owner changes on a real Xvfb read as text (xclip as the owner)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator

import pytest

from streamer.desktop.clipboard import ClipboardSync, ClipboardWatcher
from streamer.desktop.display import DisplayConfig, VirtualDisplay

needs_x = pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("xclip") is None,
                             reason="Xvfb and xclip are needed (Debian packages xvfb, xclip)")
DEADLINE_S = 15.0


def test_sync_passes_each_new_text_once_and_never_the_viewers_own() -> None:
    sync = ClipboardSync()
    assert sync.from_remote("copied in the desktop")
    assert not sync.from_remote("copied in the desktop")  # same text, new owner: not again
    sync.from_viewer("pasted by the viewer")
    assert not sync.from_remote("pasted by the viewer")  # xclip re-announces the paste: no echo
    assert sync.from_remote("copied again")
    assert not sync.from_remote("")


class Received:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.cond = threading.Condition()

    def __call__(self, text: str, selection: str) -> None:
        with self.cond:
            self.items.append((text, selection))
            self.cond.notify_all()

    def wait_for(self, count: int) -> list[tuple[str, str]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= count, DEADLINE_S), self.items
            return list(self.items)


@pytest.fixture
async def display() -> AsyncIterator[VirtualDisplay]:
    async with VirtualDisplay(DisplayConfig(width=320, height=240, window_manager=None)) as d:
        yield d


def _xclip(display: VirtualDisplay, text: bytes, selection: str = "clipboard") -> None:
    subprocess.run(["xclip", "-selection", selection, "-in"], input=text, env={"DISPLAY": display.name},
                   check=True, timeout=DEADLINE_S)


@needs_x
@pytest.mark.timeout(60)
async def test_watcher_reads_each_new_owners_text(display: VirtualDisplay) -> None:
    got = Received()
    watcher = ClipboardWatcher(display.name, got, selections=("CLIPBOARD", "PRIMARY"), max_chars=400_000)
    await asyncio.to_thread(watcher.start)
    try:
        text = "héllo wörld 😀\nline two"
        await asyncio.to_thread(_xclip, display, text.encode())
        assert (await asyncio.to_thread(got.wait_for, 1))[0] == (text, "CLIPBOARD")
        await asyncio.to_thread(_xclip, display, b"selected", "primary")
        assert (await asyncio.to_thread(got.wait_for, 2))[1] == ("selected", "PRIMARY")
        # 300 kB: more than one request holds, so xclip sends it as an INCR transfer
        big = "0123456789abcdef" * 20_000
        await asyncio.to_thread(_xclip, display, big.encode())
        assert (await asyncio.to_thread(got.wait_for, 3))[2] == (big, "CLIPBOARD")
    finally:
        await asyncio.to_thread(watcher.close)
    assert not watcher._thread.is_alive()


@needs_x
@pytest.mark.timeout(60)
async def test_watcher_drops_text_over_the_limit(display: VirtualDisplay) -> None:
    got = Received()
    watcher = ClipboardWatcher(display.name, got, max_chars=10)
    await asyncio.to_thread(watcher.start)
    try:
        await asyncio.to_thread(_xclip, display, b"eleven char")
        await asyncio.to_thread(_xclip, display, b"ten chars!")
        assert await asyncio.to_thread(got.wait_for, 1) == [("ten chars!", "CLIPBOARD")]
        assert watcher.counts["too_long"] == 1
    finally:
        await asyncio.to_thread(watcher.close)
