"""Touch in Chromium on a 390 px wide phone viewport (touch emulation): the toolbar sits above the
video and never covers the remote screen; a tap clicks where it lands (the built-in game's crosshair
goes there and shoots, read back from the decoded video); a one-finger drag holds the button while the
pointer follows; a two-finger drag scrolls; the Keyboard button opens an input whose typing is sent as
keys.  Touches go through Chromium's own touch pipeline (Playwright's touchscreen and CDP
Input.dispatchTouchEvent), not synthetic DOM events.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from bench.common import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import ADMIN
from tests.procs import Proc
from tests.web.conftest import call, page_errors, screenshot, user_token
from tests.web.test_client_game_input import CROSSHAIR_JS, RECORD_SENDS_JS
from tests.web.test_client_stream import render_node, wait_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PHONE = {"width": 390, "height": 844}

# the video's picture (object-fit: contain) in page coordinates
PICTURE_JS = """() => { const v = document.querySelector('#video'), b = v.getBoundingClientRect();
  const s = Math.min(b.width / v.videoWidth, b.height / v.videoHeight);
  const w = v.videoWidth * s, h = v.videoHeight * s;
  return {x: b.left + (b.width - w) / 2, y: b.top + (b.height - h) / 2, width: w, height: h}; }"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


async def test_touch_taps_drags_scrolls_types_and_the_toolbar_never_covers_the_screen(
    broker: Proc, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package")
    try:
        from playwright.async_api import async_playwright

        import streamer.node.agent  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"needs the render-node agent and playwright: {exc}")
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/touch", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
    profile_dir = tmp_path / "chromium-profile"
    async with render_node(base, "touch", tmp_path / "render-node.log") as node, async_playwright() as pw:
        await wait_host(http, base, node)
        token = await user_token(http, base, "thumbs")
        ctx = await pw.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, viewport=PHONE,
            has_touch=True, color_scheme="dark")
        ctx.set_default_timeout(10_000)
        try:
            page = ctx.pages[0] if ctx.pages else await ctx.new_page()
            await page.add_init_script(RECORD_SENDS_JS)
            errors = page_errors(page)
            await page.goto(f"{base}/")
            await page.fill("#token", token)
            await page.click("#signin-submit")
            await page.locator('#pools article[data-pool="touch"] button').tap()
            await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)
            await page.wait_for_function(CROSSHAIR_JS, timeout=10_000)
            sid = await page.evaluate("window.renderBroker.sessionId")
            profile = (await call(http, "GET", f"{api}/sessions/{sid}", token))["profile"]
            gw, gh = profile["width"], profile["height"]

            # layout: the toolbar is above the picture, every control fits the screen, nothing overlaps
            await page.locator("#btn-keyboard").wait_for(state="visible")
            hint = await page.inner_text("#hint")
            assert hint == "Tap clicks · drag holds the button · two fingers scroll · Keyboard types"
            await page.locator("#controls").wait_for(state="visible")  # the game's controls line, in the toolbar
            assert await page.inner_text("#controls") == "Tap to aim and shoot · drag to sweep the aim"
            picture = await page.evaluate(PICTURE_JS)
            toolbar = await page.locator(".toolbar").bounding_box()
            assert toolbar is not None and not _overlap(toolbar, picture), (toolbar, picture)
            below = toolbar["y"] + toolbar["height"]
            # the picture sits below the toolbar and uses all the height left (the video area shrank instead)
            assert picture["y"] >= below and picture["height"] >= PHONE["height"] - below - 1, (toolbar, picture)
            buttons = await page.locator(".toolbar button:visible").all()
            shown = {await b.get_attribute("id") for b in buttons}
            assert {"btn-fullscreen", "btn-stats", "btn-keyboard", "btn-end"} <= shown, shown
            boxes = [await b.bounding_box() for b in buttons]
            for box in boxes:
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
                assert not _overlap(box, picture)
            await screenshot(page, "client-touch.png", full_page=False)

            def near(fx: float, fy: float) -> str:
                """A page function: the crosshair within 4 game pixels of (fx, fy) (fractions of the picture)."""
                return (f"() => {{ const c = ({CROSSHAIR_JS})(); return c && Math.abs(c[0] - {fx}) * {gw} <= 4"
                        f" && Math.abs(c[1] - {fy}) * {gh} <= 4 ? c : false; }}")

            def at(fx: float, fy: float) -> tuple[float, float]:
                return picture["x"] + fx * picture["width"], picture["y"] + fy * picture["height"]

            # tap: the pointer goes there, then a click; the game's crosshair jumps there and shoots (its
            # centre fills for 150 ms: the crosshair covers more of the frame, then less again)
            sent0 = await page.evaluate("window.__sent.length")
            sampling = asyncio.ensure_future(page.evaluate(f"""async () => {{ const seen = [];
                const t0 = performance.now(); let first = 0;
                while (performance.now() - t0 < 8000 && !(first && performance.now() - first > 800)) {{
                  const c = ({near(0.3, 0.6)})(); if (c) {{ seen.push(c[2]); first = first || performance.now(); }}
                  await new Promise((r) => setTimeout(r, 15)); }}
                return seen; }}"""))
            await page.wait_for_timeout(50)  # the sampling loop runs before the finger lands
            await page.touchscreen.tap(*at(0.3, 0.6))
            seen = await sampling
            assert seen, "the crosshair never came to the tapped point"
            assert max(seen) > 1.2 * seen[-1], seen  # the shot showed, and it ended
            tapped = [m for m in await page.evaluate(f"window.__sent.slice({sent0})") if m["t"] in ("pm", "pb")]
            assert [m["t"] for m in tapped] == ["pm", "pb", "pb"], tapped
            assert [m["d"] for m in tapped[1:]] == [True, False] and tapped[0]["x"] == pytest.approx(0.3, abs=0.01)

            # one-finger drag: button down where the finger landed, the pointer follows, button up at the end
            cdp = await ctx.new_cdp_session(page)
            x0, y0 = at(0.7, 0.4)
            x1, y1 = at(0.5, 0.75)
            sent0 = await page.evaluate("window.__sent.length")
            await cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x0, "y": y0}]})
            for i in range(1, 9):
                point = {"x": x0 + (x1 - x0) * i / 8, "y": y0 + (y1 - y0) * i / 8}
                await cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [point]})
            await cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
            await page.wait_for_function(near(0.5, 0.75), polling=50)
            dragged = [m for m in await page.evaluate(f"window.__sent.slice({sent0})") if m["t"] in ("pm", "pb")]
            kinds = [m["t"] for m in dragged]
            assert kinds[:2] == ["pm", "pb"] and kinds[-1] == "pb" and kinds.count("pb") == 2, kinds
            assert dragged[1]["d"] is True and dragged[-1]["d"] is False and kinds.count("pm") >= 5
            assert dragged[0]["x"] == pytest.approx(0.7, abs=0.01) and dragged[-2]["y"] == pytest.approx(0.75, abs=0.01)

            # two-finger drag upwards by 120 px: the wheel scrolls down by 3 notches, no button is pressed
            sent0 = await page.evaluate("window.__sent.length")
            xa, ya = at(0.4, 0.7)
            xb = xa + 60
            await cdp.send("Input.dispatchTouchEvent", {"type": "touchStart",
                                                        "touchPoints": [{"x": xa, "y": ya, "id": 1},
                                                                        {"x": xb, "y": ya, "id": 2}]})
            for i in range(1, 7):
                y = ya - 20 * i
                await cdp.send("Input.dispatchTouchEvent", {"type": "touchMove",
                                                            "touchPoints": [{"x": xa, "y": y, "id": 1},
                                                                            {"x": xb, "y": y, "id": 2}]})
            await cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
            await page.wait_for_function(f"""() => window.__sent.slice({sent0}).filter((m) => m.t === 'pw')
                                              .reduce((a, m) => a + m.dy, 0) >= 2.99""")
            scrolled = await page.evaluate(f"window.__sent.slice({sent0})")
            assert not [m for m in scrolled if m["t"] == "pb"], scrolled
            assert sum(m["dy"] for m in scrolled if m["t"] == "pw") == pytest.approx(3.0, abs=0.01)

            # the Keyboard button focuses the hidden input; what is typed there goes out as keys
            await page.locator("#btn-keyboard").tap()
            await page.wait_for_function("() => document.activeElement?.id === 'osk'")
            sent0 = await page.evaluate("window.__sent.length")
            await page.keyboard.type("dA!")
            await page.keyboard.press("Enter")
            want = [("KeyD", True), ("KeyD", False), ("ShiftLeft", True), ("KeyA", True), ("KeyA", False),
                    ("ShiftLeft", False), ("ShiftLeft", True), ("Digit1", True), ("Digit1", False),
                    ("ShiftLeft", False), ("Enter", True), ("Enter", False)]
            await page.wait_for_function(f"() => window.__sent.slice({sent0}).filter((m) => m.t === 'k').length"
                                         f" >= {len(want)}")
            keys = [(m["c"], m["d"]) for m in await page.evaluate(f"window.__sent.slice({sent0})") if m["t"] == "k"]
            assert keys == want, keys
            assert await page.input_value("#osk") == ""
            assert not errors, errors
        finally:
            await ctx.close()
            shutil.rmtree(profile_dir, ignore_errors=True)
