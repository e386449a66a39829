"""A guest comes back to its session after closing the tab (Chromium).

A real broker with guests allowed and a real ``render-node`` (the built-in game).  Page 1 signs in as a
guest and streams; it is closed (its pagehide marks the session left: the short close grace runs); a new
page of the same browser profile opens the site, signs in as the same guest from localStorage and streams
the same session, which stays running (the guest's only one: nothing was duplicated).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import ADMIN
from tests.procs import Proc, broker_process
from tests.web.conftest import broker_env, call, page_errors
from tests.web.test_client_stream import render_node, wait_host
from tests.web.test_client_tabs import _decodes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
async def guest_broker(redis_url: str, prefix: str, tmp_path: Path) -> AsyncIterator[Proc]:
    env = broker_env(redis_url, prefix, tmp_path, BROKER_ALLOW_GUESTS="true")
    async with broker_process(env, str(tmp_path / "broker.log")) as proc:
        yield proc


async def test_a_guest_resumes_its_session_after_closing_the_tab(
    guest_broker: Proc, http: aiohttp.ClientSession, browser, tmp_path
) -> None:
    base, api = guest_broker.url, f"{guest_broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/arcade", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1})
    async with render_node(base, "arcade", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        first = await browser.new_page()
        errors = page_errors(first)
        await first.goto(f"{base}/")
        await first.click("#guest")
        await first.locator('#pools article[data-pool="arcade"] button').click()
        await first.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        await _decodes(first, 10)
        sid = await first.evaluate("window.renderBroker.sessionId")
        guest = await first.text_content("#who-name")
        assert sid and guest and guest.startswith("guest-")
        await first.close()

        second = await browser.new_page()
        errors += page_errors(second)
        await second.goto(f"{base}/")
        await second.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        await _decodes(second, 30)
        assert await second.evaluate("window.renderBroker.sessionId") == sid
        assert await second.text_content("#who-name") == guest
        sessions = (await call(http, "GET", f"{api}/sessions", ADMIN))["sessions"]
        assert [(s["id"], s["state"]) for s in sessions if s["user"] == guest] == [(sid, "running")]
        assert errors == [], errors
