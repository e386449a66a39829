"""Sharing in Chromium: the owner's page makes a view-only link, a second page watches it, both decode the
very same frames, the owner hands the viewer control (its mouse aims the game's crosshair) and takes it
back, and "Stop" ends the viewer with a message and no reconnect.

A real broker and ``render-node`` (the built-in game: its frames carry their frame number, which both pages
read back with ``?stamps=all``).  The two pages are tabs of one browser, so one of them is a background
tab that Chromium may throttle: the frame numbers are collected over ~6 s and at least 2 must be common.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.conftest import ADMIN
from tests.procs import Proc
from tests.web.conftest import call, page_errors, user_token
from tests.web.test_client_game_input import CROSSHAIR_JS
from tests.web.test_client_stream import render_node, wait_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SAMPLE_S = 6.0  # how long both pages collect frame numbers
MIN_COMMON = 2  # frame numbers both pages must have decoded (a background tab may be throttled)


async def test_a_viewer_watches_the_owner_s_frames_until_the_owner_stops_sharing(
    broker: Proc, http: aiohttp.ClientSession, browser, tmp_path
) -> None:
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/arcade", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
    async with render_node(base, "arcade", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        token = await user_token(http, base, "owner")
        owner = await browser.new_page()
        errors = page_errors(owner)
        await owner.goto(f"{base}/?stamps=all")
        await owner.fill("#token", token)
        await owner.click("#signin-submit")
        await owner.locator('#pools article[data-pool="arcade"] button').click()
        await owner.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        assert await owner.locator("#btn-sharing").is_hidden()

        # "Share": a link, listed as "Sharing (1)"
        await owner.click("#btn-share")
        await owner.wait_for_function("window.renderBroker.shareLink !== null", timeout=10_000)
        link = await owner.evaluate("window.renderBroker.shareLink")
        assert "/watch?token=s1." in link
        await owner.locator("#btn-sharing", has_text="Sharing (1)").wait_for(timeout=10_000)

        viewer = await browser.new_page()
        errors += page_errors(viewer)
        await viewer.goto(f"{link}&stamps=all")
        await viewer.locator('body[data-state="watching"]').wait_for(state="attached", timeout=20_000)
        await viewer.wait_for_function("async () => (await window.renderBroker.framesDecoded()) >= 10",
                                       timeout=20_000)

        # one encode: both pages decode the same frames (frame numbers drawn into them by the node)
        await owner.bring_to_front()
        await asyncio.sleep(SAMPLE_S)
        seen_owner = set(await owner.evaluate("window.renderBroker.frameNumbers"))
        seen_viewer = set(await viewer.evaluate("window.renderBroker.frameNumbers"))
        common = seen_owner & seen_viewer
        assert len(common) >= MIN_COMMON, (len(seen_owner), len(seen_viewer), sorted(common)[:10])

        # the owner sees the viewer in the list ("Share" opened it; it refreshes while open), and stops that link
        assert await owner.locator("#share-panel").is_visible()
        await owner.locator("#share-list li", has_text="1 watching").wait_for(timeout=10_000)

        # control: view-only first (the page sends nothing), then handed over: the viewer's mouse aims
        assert await viewer.locator("#watch-control").is_hidden()
        await owner.locator("#share-list button[data-control=give]").click()
        await viewer.locator("#watch-control", has_text="You have control").wait_for(timeout=10_000)
        box = await viewer.locator("#video").bounding_box()
        assert box is not None
        frame = await viewer.evaluate("() => { const v = document.querySelector('#video'); "
                                      "return [v.videoWidth, v.videoHeight]; }")
        scale = min(box["width"] / frame[0], box["height"] / frame[1])  # object-fit: contain
        left, top = box["x"] + (box["width"] - frame[0] * scale) / 2, box["y"] + (box["height"] - frame[1] * scale) / 2
        for want in ((0.25, 0.3), (0.7, 0.6)):
            await viewer.mouse.move(left + want[0] * frame[0] * scale, top + want[1] * frame[1] * scale, steps=4)
            await viewer.wait_for_function(
                f"() => {{ const c = ({CROSSHAIR_JS})(); return c && Math.abs(c[0] - {want[0]}) < 0.03"
                f" && Math.abs(c[1] - {want[1]}) < 0.03; }}", timeout=10_000, polling=100)
        await owner.locator("#share-list button[data-control=take]").click()
        await viewer.locator("#watch-control").wait_for(state="hidden", timeout=10_000)
        assert await viewer.evaluate("window.renderBroker.control") is False
        connections = await viewer.evaluate("window.renderBroker.connections")
        await owner.locator("#share-list li button", has_text="Stop").click()
        await viewer.locator('body[data-state="stopped"]').wait_for(state="attached", timeout=10_000)
        assert await viewer.text_content("#watch-status") == "The owner stopped sharing this session"
        await owner.locator("#btn-sharing").wait_for(state="hidden", timeout=10_000)
        # no reconnect (a reload is refused too), while the owner streams on
        start = await owner.evaluate("async () => (await window.renderBroker.stats())?.framesDecoded || 0")
        await owner.wait_for_function(f"async () => ((await window.renderBroker.stats())?.framesDecoded || 0) >= "
                                      f"{start + 30}", timeout=20_000)
        assert await viewer.evaluate("window.renderBroker.connections") == connections
        assert await viewer.evaluate("window.renderBroker.pc") is None
        response = await viewer.reload()
        assert response is not None and response.status == 403
        await viewer.locator('body[data-state="stopped"]').wait_for(state="attached", timeout=10_000)
        assert await viewer.evaluate("window.renderBroker.connections") == 0
        assert errors == [], errors
