"""Two tabs of one user in Chromium: the second is offered "continue here", the first is told it moved.

A real broker and ``render-node`` (the built-in game: no display needed).  Page 1 streams; page 2,
signed in as the same user, finds the live session and is told it is open in another tab (page 1
keeps streaming).  "Continue here" moves the stream to page 2; page 1 shows "moved" and does not
reconnect by itself; "Take it back" moves it back.  Closing the tab that lost the session leaves no
mark; closing the one that holds it marks the session left (the short close grace).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.conftest import ADMIN
from tests.procs import Proc
from tests.web.conftest import call, page_errors, user_token
from tests.web.test_client_stream import render_node, wait_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FRAMES_JS = "async () => (await window.renderBroker.stats())?.framesDecoded || 0"


async def _sign_in(page, base: str, token: str) -> None:  # type: ignore[no-untyped-def]
    await page.goto(f"{base}/")
    await page.fill("#token", token)
    await page.click("#signin-submit")


async def _decodes(page, more: int) -> None:  # type: ignore[no-untyped-def]
    """The page decodes ``more`` frames beyond what it has decoded now."""
    start = await page.evaluate(FRAMES_JS)
    await page.wait_for_function(f"async () => ((await window.renderBroker.stats())?.framesDecoded || 0) >= "
                                 f"{start + more}", timeout=20_000)


async def test_a_second_tab_continues_here_and_the_first_is_told(
    broker: Proc, http: aiohttp.ClientSession, browser, tmp_path, redis_url: str, prefix: str
) -> None:
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/arcade", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
    async with render_node(base, "arcade", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        token = await user_token(http, base, "player")
        first = await browser.new_page()
        errors = page_errors(first)
        await _sign_in(first, base, token)
        await first.locator('#pools article[data-pool="arcade"] button').click()
        await first.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        await _decodes(first, 10)

        # the second tab finds the live session and is asked; the first keeps streaming meanwhile
        second = await browser.new_page()
        errors += page_errors(second)
        await _sign_in(second, base, token)
        await second.locator('body[data-elsewhere="in_use"]').wait_for(timeout=20_000)
        assert await second.text_content("#elsewhere-title") == "This session is open in another tab"
        assert await second.evaluate("window.renderBroker.pc") is None
        await _decodes(first, 30)
        assert await first.evaluate("window.renderBroker.elsewhere") is None

        # "Continue here": the stream moves, the first tab is told and stays put
        connections = await first.evaluate("window.renderBroker.connections")
        await second.click("#elsewhere-here")
        await second.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        await first.locator('body[data-elsewhere="moved"]').wait_for(timeout=10_000)
        assert await first.text_content("#elsewhere-title") == "This session moved to another tab"
        await _decodes(second, 60)  # two seconds of the second tab streaming ...
        assert await first.evaluate("window.renderBroker.connections") == connections  # ... and no reconnect
        assert await first.evaluate("window.renderBroker.pc") is None
        assert await first.evaluate("window.renderBroker.elsewhere") == "moved"

        # "Take it back"
        await first.click("#elsewhere-here")
        await second.locator('body[data-elsewhere="moved"]').wait_for(timeout=10_000)
        await first.wait_for_function("() => window.renderBroker.elsewhere === null")
        await _decodes(first, 10)
        assert not errors, errors

        # closing tabs: the one that lost the session leaves nothing behind; the one that holds it tells
        # the broker (pagehide -> keepalive POST /leave), which marks the session for the short grace
        sid = await first.evaluate("window.renderBroker.sessionId")
        key = f"{prefix}:session:{sid}"
        r = aioredis.from_url(redis_url)
        try:
            await second.goto("about:blank")
            assert await r.hget(key, "left_ms") in (None, b"0")
            await first.goto("about:blank")
            deadline = time.monotonic() + 10
            while int(await r.hget(key, "left_ms") or 0) == 0:
                assert time.monotonic() < deadline, "the closing tab never told the broker"
                await asyncio.sleep(0.05)
        finally:
            await r.aclose()
