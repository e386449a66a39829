"""Clipboard both ways, a screen that follows the window, and the sound controls, in Chromium.

A real broker and ``render-node`` (as in ``test_client_stream.py``) run a desktop whose app is a
small script: it writes its ``DISPLAY`` to a file (so the test can read and set the session's X
clipboard with xclip) and waits.  The page (clipboard permissions granted) must:

- put text copied in the session into the system clipboard (navigator.clipboard.readText);
- send a paste to the session's CLIPBOARD and never get it back (no echo);
- type into an xterm on the session's display what a non-US keyboard and an IME produce: an AZERTY key
  press (``é`` on ``Digit2``), characters with no US key and an IME commit (CDP ``Input.insertText``),
  next to plain US keys;
- after a window resize, ask for the new size and decode frames of that size;
- mute and set the volume of its ``#sound`` element from the toolbar, remembered across a reload;
- send a gamepad (``navigator.getGamepads`` stood in for by an init script: no real pad here) only when
  its mapping is "standard", and tell the viewer once about one that is not; the node, which has no
  /dev/uinput here, says once in its log why desktop pads are dropped.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from streamer.desktop.uinput import probe_uinput
from tests.conftest import ADMIN
from tests.procs import Proc
from tests.web.conftest import call, page_errors, user_token
from tests.web.test_client_stream import render_node, wait_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PASTE_JS = """(text) => {
  const data = new DataTransfer();
  data.setData('text/plain', text);
  document.dispatchEvent(new ClipboardEvent('paste', { clipboardData: data, bubbles: true }));
}"""


def _xclip(display: str, text: str | None = None) -> str:
    if text is not None:
        subprocess.run(["xclip", "-selection", "clipboard", "-in"], input=text.encode(), env={"DISPLAY": display},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=15)
        return ""
    out = subprocess.run(["xclip", "-selection", "clipboard", "-o"], env={"DISPLAY": display}, capture_output=True,
                         timeout=15)
    return out.stdout.decode() if out.returncode == 0 else ""


# A stand-in for the Gamepad API (no pad can be attached here) and a record of the input channel's sends.
FAKE_PADS_JS = """(() => {
  window.__pads = [];
  Object.defineProperty(Navigator.prototype, 'getGamepads', { value: () => window.__pads, configurable: true });
  window.__sent = [];
  const send = RTCDataChannel.prototype.send;
  RTCDataChannel.prototype.send = function (data) {
    if (this.label === 'input' && typeof data === 'string') { try { window.__sent.push(JSON.parse(data)); } catch {} }
    return send.call(this, data);
  };
})();"""
PAD_JS = """(mapping) => { window.__pads = [{ index: 0, id: 'Test pad ' + (mapping || 'unmapped'), mapping,
  axes: [0.5, 0, 0, 0], buttons: Array.from({ length: 17 }, (_, i) => ({ value: i === 0 ? 1 : 0 })) }]; }"""


async def _until(check, what: str, deadline_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not (value := await check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)
    return value


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


async def _type_into_xterm(page, display: str, out: Path) -> None:  # type: ignore[no-untyped-def]
    env = {"DISPLAY": display, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": os.environ["PATH"]}
    xterm = await asyncio.create_subprocess_exec(
        "xterm", "-u8", "-title", "kbd-e2e", "-e", "sh", "-c", f"cat > {shlex.quote(str(out))}",
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        activate = await asyncio.create_subprocess_exec(
            "xdotool", "search", "--sync", "--name", "kbd-e2e", "windowactivate", "--sync", env=env)
        assert await asyncio.wait_for(activate.wait(), 15) == 0
        await _until(lambda: asyncio.to_thread(out.exists), "xterm's shell never started")
        await page.focus("#kbd-sink")  # where the client keeps the keyboard focus while streaming
        cdp = await page.context.new_cdp_session(page)
        # an AZERTY keyboard: the key US calls Digit2 types "é" (sent as a key code, it would type "2")
        azerty = {"code": "Digit2", "key": "é", "text": "é", "unmodifiedText": "é", "windowsVirtualKeyCode": 50}
        await cdp.send("Input.dispatchKeyEvent", {"type": "keyDown", **azerty})
        await cdp.send("Input.dispatchKeyEvent", {"type": "keyUp", **azerty})
        await page.keyboard.type("a€ß")  # "a" is a US key press; Playwright inserts "€" and "ß" as text
        await cdp.send("Input.imeSetComposition", {"text": "あ", "selectionStart": 1, "selectionEnd": 1})
        await cdp.send("Input.insertText", {"text": "あ"})  # the IME commits
        await page.keyboard.press("Enter")
        await cdp.detach()

        async def line() -> str:
            text = await asyncio.to_thread(_read, out)
            return text if text.endswith("\n") else ""

        assert await _until(line, "no line reached the xterm") == "éa€ßあ\n"
        assert await page.input_value("#kbd-sink") == ""  # emptied after each commit
    finally:
        xterm.terminate()
        await xterm.wait()


async def test_clipboard_resize_and_sound_controls(
    broker: Proc, http: aiohttp.ClientSession, browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    shared_tmp: Path,
) -> None:
    for tool in ("Xvfb", "openbox", "xclip", "xterm", "xdotool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package {tool.lower()})")
    display_file = shared_tmp / "display"  # written by the session's app, which may run as nobody
    app = f'echo "$DISPLAY" > {shlex.quote(str(display_file))}; exec sleep 600'
    monkeypatch.setenv("NODE_APP_COMMAND", shlex.join(["sh", "-c", app]))  # render_node copies os.environ
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/io", ADMIN, {"kind": "desktop", "max_sessions_per_gpu": 1,
                                                       "allow_resize": True})
    async with render_node(base, "io", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        await browser.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
        token = await user_token(http, base, "copier")
        page = await browser.new_page()
        await page.add_init_script(FAKE_PADS_JS)
        errors = page_errors(page)
        await page.goto(f"{base}/")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        await page.locator('#pools article[data-pool="io"] button').click()
        await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        await page.wait_for_function("() => window.renderBroker.dc && window.renderBroker.dc.readyState === 'open'")
        display = display_file.read_text().strip()
        assert display.startswith(":"), display

        # remote -> browser: copied in the session, it lands in the system clipboard
        remote = "copied in the remote desktop ✓"
        await asyncio.to_thread(_xclip, display, remote)
        await page.wait_for_function("() => window.renderBroker.clipboardWrites === 1", timeout=15_000)
        assert await page.evaluate("navigator.clipboard.readText()") == remote
        assert await page.evaluate("window.renderBroker.remoteClipboard") == remote

        # browser -> remote: a paste reaches the session's CLIPBOARD ...
        pasted = "pasted from the browser"
        await page.focus("#video")
        await page.evaluate(PASTE_JS, pasted)

        async def remote_has_paste() -> bool:
            return await asyncio.to_thread(_xclip, display) == pasted

        await _until(remote_has_paste, "the paste never reached the session's clipboard")
        # ... and never comes back: the next remote copy is the second "cb" the page gets, not the third
        second = "second remote copy"
        await asyncio.to_thread(_xclip, display, second)
        await page.wait_for_function(f"() => window.renderBroker.remoteClipboard === {second!r}", timeout=15_000)
        assert await page.evaluate("window.renderBroker.clipboardReceived") == 2

        # keyboard: what the user's layout and IME type arrives as those characters in a desktop app
        await _type_into_xterm(page, display, shared_tmp / "typed.txt")

        # resize: the window shrinks, the page asks for its new size and decodes frames of that size
        first = await page.evaluate("window.renderBroker.lastResize")
        assert first == "1280x720", first
        await page.set_viewport_size({"width": 900, "height": 506})
        await page.wait_for_function("() => window.renderBroker.lastResize === '900x506'", timeout=10_000)
        await page.wait_for_function("() => { const v = document.querySelector('#video');"
                                     " return v.videoWidth === 900 && v.videoHeight === 506; }", timeout=20_000)
        # the HiDPI opt-out is a remembered toggle
        await page.click("#btn-hidpi")
        assert await page.get_attribute("#btn-hidpi", "aria-pressed") == "false"
        assert await page.evaluate("localStorage.getItem('rb.hidpi')") == "0"

        # gamepads: a pad without the standard mapping is not sent (its buttons would be the wrong ones) ...
        await page.evaluate(PAD_JS, "")
        await page.wait_for_function("() => document.querySelector('#hint').textContent.includes("
                                     "'has no standard mapping')", timeout=5_000)
        assert not [m for m in await page.evaluate("window.__sent") if m["t"] == "gp"]
        # ... a standard one is, as the full state of its index
        await page.evaluate(PAD_JS, "standard")
        await page.wait_for_function("() => window.__sent.some((m) => m.t === 'gp')", timeout=5_000)
        pads = [m for m in await page.evaluate("window.__sent") if m["t"] == "gp"]
        assert pads == [{"t": "gp", "i": 0, "ax": [0.5, 0, 0, 0], "bt": [1] + [0] * 16}], pads
        await page.evaluate("window.__pads = []")
        missing = probe_uinput()
        if missing is not None:  # this machine: the node said why once, and drops desktop pad input
            log_text = (tmp_path / "render-node.log").read_text()
            assert log_text.count("desktop sessions get no gamepads") == 1 and missing in log_text

        # sound controls act on #sound and are remembered
        await page.click("#btn-mute")
        assert await page.evaluate("document.querySelector('#sound').muted") is True
        assert await page.get_attribute("#btn-mute", "aria-pressed") == "true"
        await page.fill("#volume", "30")
        state = await page.evaluate("window.renderBroker.sound")
        assert state == {"muted": False, "volume": 0.3}, state  # moving the slider up unmutes
        await page.click("#btn-mute")
        await page.click("#btn-end")
        await page.locator('body[data-view="ended"]').wait_for()
        await page.reload()
        assert await page.evaluate("window.renderBroker.sound") == {"muted": True, "volume": 0.3}
        assert await page.evaluate("window.renderBroker.hidpi") is False
        assert not errors, errors


async def test_a_2x_screen_gets_a_remote_screen_in_device_pixels_unless_turned_off(
    broker: Proc, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """devicePixelRatio 2: a 640x360 CSS window asks for (and decodes) 1280x720; HiDPI off: 640x360."""
    import os

    from bench.common import CHROMIUM, CHROMIUM_ARGS

    for tool in ("Xvfb", "openbox", "xterm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package")
    from playwright.async_api import async_playwright

    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/retina", ADMIN, {"kind": "desktop", "max_sessions_per_gpu": 1,
                                                           "allow_resize": True})
    async with render_node(base, "retina", tmp_path / "render-node.log") as node, async_playwright() as pw:
        await wait_host(http, base, node)
        ctx = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile-2x"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 640, "height": 360}, device_scale_factor=2)
        try:
            token = await user_token(http, base, "retina")
            page = await ctx.new_page()
            errors = page_errors(page)
            await page.goto(f"{base}/")
            assert await page.evaluate("window.devicePixelRatio") == 2
            await page.fill("#token", token)
            await page.click("#signin-submit")
            await page.locator('#pools article[data-pool="retina"] button').click()
            await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)
            await page.wait_for_function("() => window.renderBroker.lastResize === '1280x720'", timeout=10_000)
            video_size = ("() => { const v = document.querySelector('#video');"
                          " return `${v.videoWidth}x${v.videoHeight}`; }")
            await page.wait_for_function(f"() => ({video_size})() === '1280x720'", timeout=20_000)
            await page.click("#btn-hidpi")  # a weak link: CSS pixels, a quarter of the pixels to encode
            await page.wait_for_function(f"() => ({video_size})() === '640x360'", timeout=20_000)
            assert await page.evaluate("window.renderBroker.lastResize") == "640x360"
            await page.click("#btn-end")
            await page.locator('body[data-view="ended"]').wait_for()
            assert not errors, errors
        finally:
            await ctx.close()
