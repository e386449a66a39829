"""Game input in Chromium: a click on the built-in game captures the mouse (pointer lock), mouse motion
then goes out as relative "pr" messages that move the game's crosshair in the decoded video, a click
shoots, and the toolbar shows the game's controls (the node names them in its stats).

A real broker, a real render node (CPU encode) and Debian's Chromium; the page's data-channel sends are
recorded by an init script (RTCDataChannel.prototype.send wrapped) so the test can tell relative motion
from absolute.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.conftest import ADMIN
from tests.procs import Proc
from tests.web.conftest import call, page_errors, screenshot, user_token
from tests.web.test_client_stream import render_node, wait_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

RECORD_SENDS_JS = """(() => {
  window.__sent = [];
  const send = RTCDataChannel.prototype.send;
  RTCDataChannel.prototype.send = function (data) {
    if (this.label === 'input' && typeof data === 'string') { try { window.__sent.push(JSON.parse(data)); } catch {} }
    return send.call(this, data);
  };
})();"""

# Centre of the crosshair (pure magenta) in the current frame as fractions of the frame [x, y], and the
# fraction of the frame it covers; null when absent.  The columns of the vertical bar and the rows of the
# horizontal bar, as streamer.desktop.game.find_crosshair reads them.  Fractions: the quality ladder may
# send a smaller picture than the game draws.
CROSSHAIR_JS = """() => {
  const v = document.querySelector('#video');
  if (!v.videoWidth) return null;
  const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g = c.getContext('2d', {willReadFrequently: true});
  g.drawImage(v, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const cols = new Float64Array(c.width), rows = new Float64Array(c.height);
  let n = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i] > 150 && d[i + 2] > 150 && d[i + 1] < 110) {
      const p = i / 4; cols[p % c.width] += 1; rows[Math.floor(p / c.width)] += 1; n += 1;
    }
  }
  if (n < 16) return null;
  const centre = (a) => { const top = Math.max(...a); let s = 0, w = 0;
    a.forEach((k, j) => { if (k >= 0.4 * top) { s += j * k; w += k; } }); return s / w; };
  return [(centre(cols) + 0.5) / c.width, (centre(rows) + 0.5) / c.height, n / (c.width * c.height)];
}"""


async def test_pointer_lock_sends_relative_motion_that_aims_and_the_toolbar_shows_controls(
    broker: Proc, http: aiohttp.ClientSession, browser: Any, tmp_path: Any
) -> None:
    try:
        import streamer.node.agent  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the render-node agent is not importable: {exc}")
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/aim", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
    async with render_node(base, "aim", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        token = await user_token(http, base, "aimer")
        page = await browser.new_page()
        await page.add_init_script(RECORD_SENDS_JS)
        errors = page_errors(page)
        await page.goto(f"{base}/")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        await page.locator('#pools article[data-pool="aim"] button').click()
        await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)

        # the node says it runs the built-in game: the toolbar shows its controls
        controls = page.locator("#controls")
        await controls.wait_for(state="visible", timeout=10_000)
        assert await controls.inner_text() == "Arrows/WASD move · mouse aims · click shoots · Esc releases the mouse"
        await page.wait_for_function(CROSSHAIR_JS, timeout=10_000)
        sid = await page.evaluate("window.renderBroker.sessionId")
        profile = (await call(http, "GET", f"{api}/sessions/{sid}", token))["profile"]
        gw, gh = profile["width"], profile["height"]  # the game draws at the session's size
        box = await page.locator("#video").bounding_box()
        assert box is not None
        # the game's size fills the viewport 1:1 (VIEWPORT is the screen size the page asks for)
        assert (box["width"], box["height"]) == (gw, gh), (box, profile)

        def near(want: tuple[float, float]) -> str:
            """A page function: the crosshair within 3 game pixels of ``want`` (game pixels)."""
            return (f"() => {{ const c = ({CROSSHAIR_JS})(); return c && Math.abs(c[0] * {gw} - {want[0]}) <= 3"
                    f" && Math.abs(c[1] * {gh} - {want[1]}) <= 3 ? c : false; }}")

        # a click captures the mouse; the click itself lands where it was (pm) and fires a shot
        cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        await page.mouse.move(cx, cy)
        await page.mouse.click(cx, cy)
        await page.wait_for_function("() => document.pointerLockElement === document.querySelector('#video')",
                                     timeout=5_000)
        locked_at = await page.evaluate("window.__sent.length")
        at = (gw / 2, gh / 2)  # the click's own position ("pm" 0.5, 0.5) put the crosshair there
        await page.wait_for_function(near(at), timeout=10_000, polling=100)

        # locked motion: relative messages only, summed per frame, and the crosshair follows by as many pixels
        dx, dy = 160, -90  # page pixels, in steps as a mouse reports them
        for i in range(1, 11):
            await page.mouse.move(cx + dx * i / 10, cy + dy * i / 10)
        moved = await page.wait_for_function(
            f"""() => {{ const s = window.__sent.slice({locked_at}).filter((m) => m.t === 'pr');
                 const sx = s.reduce((a, m) => a + m.dx, 0), sy = s.reduce((a, m) => a + m.dy, 0);
                 return sx === {dx} && sy === {dy} ? s.length : false; }}""", timeout=5_000)
        count = await moved.json_value()
        assert 1 <= count <= 10, count  # coalesced: never more messages than motion events
        sent = await page.evaluate(f"window.__sent.slice({locked_at})")
        assert not [m for m in sent if m["t"] == "pm"], sent  # no absolute motion while locked
        want = (at[0] + dx, at[1] + dy)  # one frame pixel per mouse pixel (AIM_PX_PER_MOUSE_PX)
        await page.wait_for_function(near(want), timeout=10_000, polling=100)

        # a click while locked: a button message after the motion, no absolute position; the shot shows (the
        # crosshair's centre fills for 150 ms: it covers more of the frame, then less again)
        sampling = asyncio.ensure_future(page.evaluate(f"""async () => {{ const seen = [];
            const t0 = performance.now(); let first = 0;
            while (performance.now() - t0 < 8000 && !(first && performance.now() - first > 800)) {{
              const c = ({near(want)})(); if (c) {{ seen.push(c[2]); first = first || performance.now(); }}
              await new Promise((r) => setTimeout(r, 15)); }}
            return seen; }}"""))
        await page.wait_for_timeout(50)  # the sampling loop runs before the click
        await page.mouse.down()
        await page.mouse.up()
        seen = await sampling
        assert seen and max(seen) > 1.2 * seen[-1], seen
        tail = await page.evaluate(f"window.__sent.slice({locked_at})")
        assert [m["t"] for m in tail if m["t"] in ("pb", "pm")] == ["pb", "pb"], tail
        await screenshot(page, "client-game-aim.png", full_page=False)

        # Esc releases the mouse: the pointer is free again
        await page.evaluate("document.exitPointerLock()")
        await page.wait_for_function("() => document.pointerLockElement === null")
        await page.click("#btn-end")
        await page.locator('body[data-view="ended"]').wait_for()
        assert not errors, errors
