"""Full path in Chromium: broker + a real render node + the viewer page streaming a desktop.

A ``render-node`` process (CPU encode, one seat, host candidates on 127.0.0.1) serves a desktop pool.
The page signs in, starts a session, must show decoded video at the requested size (read through the
page's getStats hook), type a shell command into the remote xterm (keyboard events -> data channel ->
XTest), which must create a file on this machine, survive a dropped signaling socket by re-signaling
the same session (no second session, no queue entry), and end the session with its End button.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import ADMIN, NODE
from tests.procs import Proc, session_user_env, stop_process
from tests.web.conftest import VIEWPORT, call, page_errors, screenshot, user_token

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

HOST = "webnode"


def _skip_reason() -> str | None:
    for tool in ("Xvfb", "xterm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the render node's desktop needs it)"
    try:
        import streamer.node.agent  # noqa: F401
    except ImportError as exc:
        return f"the render-node agent is not importable: {exc}"
    return None


@contextlib.asynccontextmanager
async def render_node(base: str, pool: str, log_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "NODE_BROKER_URL": base, "NODE_NODE_TOKEN": NODE, "NODE_HOST_ID": HOST, "NODE_POOL": pool,
           "NODE_ADVERTISE_ADDRESSES": "127.0.0.1", "NODE_SEATS": "1", "NODE_HEARTBEAT_INTERVAL_S": "1",
           "NODE_ENCODER": "libx264", "NODE_LOG_LEVEL": "info", "NODE_SHUTDOWN_GRACE_S": "0",
           **session_user_env()}
    with open(log_path, "ab") as log:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "streamer", env=env, stdout=log, stderr=log,
                                                    start_new_session=True)
    try:
        yield proc
    finally:
        await stop_process(proc)


async def metric_when(http: aiohttp.ClientSession, base: str, name: str, timeout_s: float) -> float:
    """The render node's sample of ``name`` on the broker's /metrics once it is above 0 (polled)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with http.get(f"{base}/metrics") as r:
            m = re.search(rf'^{name}{{host="{HOST}",pool="\w+"}} (\S+)$', await r.text(), re.M)
        if m and float(m.group(1)) > 0:
            return float(m.group(1))
        assert asyncio.get_running_loop().time() < deadline, f"{name} of {HOST} still 0 or absent"
        await asyncio.sleep(0.5)


async def wait_host(http: aiohttp.ClientSession, base: str, proc: asyncio.subprocess.Process) -> None:
    for _ in range(150):
        assert proc.returncode is None, "render-node exited early (see render-node.log)"
        async with http.get(f"{base}/api/v1/hosts/{HOST}", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            if r.status == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError("render-node did not register")


async def test_stream_type_reconnect_end(broker: Proc, http: aiohttp.ClientSession, browser, tmp_path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/desk", ADMIN, {"kind": "desktop", "max_sessions_per_gpu": 1,
                                                         "allow_resize": False, "disconnect_timeout_s": 60})
    marker = Path("/tmp") / f"rbweb{uuid.uuid4().hex}"  # letters and digits only: no Shift needed to type it
    async with render_node(base, "desk", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        token = await user_token(http, base, "viewer")
        page = await browser.new_page()
        errors = page_errors(page)
        await page.goto(f"{base}/")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        await page.locator('#pools article[data-pool="desk"] button').click()

        # video arrives and decodes at the size the page asked for
        await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        sid = await page.evaluate("window.renderBroker.sessionId")
        await page.wait_for_function("async () => { const s = await window.renderBroker.stats();"
                                     " return s && s.framesDecoded >= 10 && s.width > 0; }", timeout=10_000)
        stats = await page.evaluate("window.renderBroker.stats()")
        assert (stats["width"], stats["height"]) == (VIEWPORT["width"], VIEWPORT["height"]), stats
        assert stats["connectionState"] == "connected" and stats["codec"] == "H264", stats
        await page.wait_for_function("() => window.renderBroker.lastStats()?.inputRttMs > 0")  # ping/pong
        view = await call(http, "GET", f"{api}/sessions/{sid}", token)
        assert view["host"] == HOST and view["state"] in ("running", "disconnected")

        # type into the remote xterm: a file appears on this machine
        try:
            await page.mouse.click(VIEWPORT["width"] / 2, VIEWPORT["height"] / 2)  # focus the xterm window
            await page.keyboard.type(f"touch {marker}", delay=15)
            await page.keyboard.press("Enter")
            for _ in range(100):
                if marker.exists():
                    break
                await asyncio.sleep(0.1)
            assert marker.exists(), "the typed command did not run in the remote xterm"
            await page.keyboard.press("F8")
            await page.locator("#stats dl").wait_for()
            # wait until a second stats sample turned byte counts into a rate
            await page.wait_for_function("() => document.querySelector('#stats dl').textContent.includes('bit/s')")
            await screenshot(page, "client-stream.png", full_page=False)
        finally:
            marker.unlink(missing_ok=True)

        # a dropped signaling socket re-signals the same session: new peer connection, same id, no new session
        before = await page.evaluate("window.renderBroker.connections")
        await page.evaluate("window.renderBroker.dropSignaling()")
        await page.wait_for_function(f"() => window.renderBroker.connections > {before}"
                                     " && window.renderBroker.pc?.connectionState === 'connected'", timeout=15_000)
        assert await page.evaluate("window.renderBroker.sessionId") == sid
        await page.wait_for_function("async () => (await window.renderBroker.stats())?.framesDecoded > 5")
        live = await call(http, "GET", f"{api}/sessions", token)
        assert [s["id"] for s in live["sessions"]] == [sid]
        assert await page.locator("#reconnect").is_hidden()

        # End session: the page says why, the broker agrees
        await page.click("#btn-end")
        await page.locator('body[data-view="ended"]').wait_for()
        assert await page.inner_text("#ended-reason") == "You ended the session."
        view = await call(http, "GET", f"{api}/sessions/{sid}", token)
        assert view["state"] == "ended" and view["end_reason"] == "user"
        assert not errors, errors


PLAYER_X_JS = """() => {
  // centroid x (0..1) of the game's pure-green player square in the current video frame
  const v = document.querySelector('#video'), c = document.createElement('canvas');
  c.width = 320; c.height = 180;
  const g = c.getContext('2d', {willReadFrequently: true});
  g.drawImage(v, 0, 0, c.width, c.height);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let sx = 0, n = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 1] > 180 && d[i] < 90 && d[i + 2] < 90) { sx += (i / 4) % c.width; n += 1; }
  }
  return n ? sx / n / c.width : null;
}"""


async def test_game_stream_glass_to_glass_and_keys_move_player(broker: Proc, http: aiohttp.ClientSession, browser,
                                                                tmp_path) -> None:
    """A game session: 60 fps profile, glass-to-glass read from frame stamps, arrow keys steer the player."""
    try:
        import streamer.node.agent  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the render-node agent is not importable: {exc}")
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/arena", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
    async with render_node(base, "arena", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        token = await user_token(http, base, "player")
        page = await browser.new_page()
        errors = page_errors(page)
        await page.goto(f"{base}/")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        await page.locator('#pools article[data-pool="arena"] button').click()
        await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        sid = await page.evaluate("window.renderBroker.sessionId")
        assert (await call(http, "GET", f"{api}/sessions/{sid}", token))["profile"]["fps"] == 60

        # glass-to-glass from the stamps the built-in game draws (same clock: node and browser share the host)
        # one read that both waits and measures: stats() is null while no peer exists (and `?.` then gives
        # undefined, which is not null), so a wait and a second read could see different moments
        g2g = await (await page.wait_for_function(
            "async () => { const s = await window.renderBroker.stats();"
            " return typeof s?.glassToGlassMs === 'number' ? s.glassToGlassMs : false; }", timeout=10_000)).json_value()
        assert 0 < g2g < 1000, g2g
        # the page reports its samples to the node ("vs", every 2 s) and the node's heartbeat (every 1 s)
        # carries its histogram to the broker: browser -> data channel -> node -> heartbeat -> /metrics
        glass = await metric_when(http, base, "render_broker_stream_glass_to_glass_seconds_count", 10.0)
        assert glass > 0
        metrics = await (await http.get(f"{base}/metrics")).text()
        assert f'render_broker_session_starts_total{{host="{HOST}",pool="arena"}} 1.0' in metrics.splitlines()
        assert not re.search(r"^render_broker_session_start_failures_total\{.*\} [1-9]", metrics, re.M), metrics
        # receive-side buffering (web/playout.js): the node answered the playout-delay extension and the
        # page's floor policy owns the receiver's jitterBufferTarget (0 unless this machine's load made
        # the jitter over 20 ms: it is the same machine as the node)
        playout = await page.evaluate("""async () => { const pc = window.renderBroker.pc;
          const r = pc.getReceivers().find((x) => x.track.kind === 'video');
          const s = await window.renderBroker.stats();
          return [pc.remoteDescription.sdp.includes('rtp-hdrext/playout-delay'), r.jitterBufferTarget,
                  s.playoutMode, s.playoutTargetMs]; }""")
        negotiated, floor, mode, target = playout
        assert negotiated and mode == "low" and floor == target and 0 <= floor <= 250, playout
        await page.keyboard.press("F8")
        await page.locator("#stats", has_text="Glass to glass").wait_for()

        # arrow keys steer the player: key events -> data channel -> game -> video -> this page
        x0 = await page.evaluate(PLAYER_X_JS)
        assert x0 is not None, "no player square in the video"
        key, sign = ("ArrowLeft", -1) if x0 > 0.3 else ("ArrowRight", 1)  # away from the nearer edge
        await page.keyboard.down(key)
        try:
            moved = await page.wait_for_function(f"() => {{ const x = ({PLAYER_X_JS})();"
                                                 f" return x !== null && ({sign} * (x - {x0})) > 0.05 ? x : false; }}",
                                                 timeout=5_000, polling=100)
            x1 = await moved.json_value()
        finally:
            await page.keyboard.up(key)
        assert sign * (x1 - x0) > 0.05, (x0, x1)
        await page.wait_for_function("() => window.renderBroker.lastStats()?.bitrateBps > 0")  # overlay has rates
        # the page answers the node's delay probes (web/probe.js): the node's stats carry their round trip
        await page.wait_for_function("() => window.renderBroker.lastStats()?.node?.probe_rtt_ms >= 0", timeout=10_000)
        await page.locator("#stats", has_text="Probe RTT (node)").wait_for()
        await screenshot(page, "client-game.png", full_page=False)
        await page.click("#btn-end")
        await page.locator('body[data-view="ended"]').wait_for()
        assert not errors, errors
