"""Viewer page in Chromium: queue position from the events stream, then seated when the seat frees up.

A pool with exactly one seat (one host, one GPU, one session per GPU); no render node is needed for
queueing.  User 1 takes the seat through the API; user 2 signs in on the page, asks for a session and
must see queue position 1; when user 1's session ends (API), the page must follow the broker to
``starting`` and begin WebRTC signaling (an offer with a recvonly video m-line and the input data
channel).  Then the page's Cancel button ends the session and shows the reason.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.conftest import ADMIN, NODE
from tests.procs import Proc, broker_process
from tests.web.conftest import VIEWPORT, broker_env, call, page_errors, screenshot, user_token

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


async def test_queue_position_then_seated(broker: Proc, http: aiohttp.ClientSession, browser) -> None:
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/solo", ADMIN, {
        "kind": "desktop", "max_sessions_per_gpu": 1, "vram_per_session_mb": 4096, "allow_resize": True,
        "description": "One seat, for the queue test"})
    await call(http, "POST", f"{api}/hosts", NODE, {
        "id": "solo-h0", "pool": "solo", "address": "127.0.0.1:7000",
        "gpus": [{"index": 0, "model": "NVIDIA L4", "vram_mb": 23034}]})
    first = await user_token(http, base, "first")
    second = await user_token(http, base, "second")
    s1 = await call(http, "POST", f"{api}/sessions", first, {"pool": "solo"})
    assert s1["state"] == "starting"

    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{base}/")
    await page.fill("#token", second)
    await page.click("#signin-submit")
    card = page.locator('#pools article[data-pool="solo"]')
    await card.wait_for()
    assert "0" in await card.locator(".facts div").first.inner_text()  # no free seat
    await screenshot(page, "client-pools.png", full_page=False)
    await card.locator("button").click()

    # queued, position 1, live from the SSE stream
    await page.locator('body[data-view="queue"][data-session-state="queued"]').wait_for()
    await page.locator("#queue-position", has_text="1").wait_for()
    assert await page.inner_text("#queue-position") == "1"
    assert "next" in (await page.inner_text("#queue-eta")).lower()
    sid = await page.evaluate("window.renderBroker.sessionId")
    view = await call(http, "GET", f"{api}/sessions/{sid}", second)
    assert view["state"] == "queued" and view["queue_position"] == 1
    # the profile came from the viewport (even numbers)
    assert view["profile"]["width"] == VIEWPORT["width"] and view["profile"]["height"] == VIEWPORT["height"]
    assert view["profile"]["fps"] == 30
    await screenshot(page, "client-queue.png", full_page=False)

    # the seat frees up: the page follows the broker to "starting" without a reload
    await call(http, "DELETE", f"{api}/sessions/{s1['id']}", first)
    await page.locator('body[data-view="starting"][data-session-state="starting"]').wait_for()
    assert await page.evaluate("window.renderBroker.state") == "starting"
    assert "solo-h0" in await page.inner_text("#starting-sub")
    # signaling began: an offer with a recvonly video section and the input data channel
    await page.wait_for_function("() => window.renderBroker.pc && window.renderBroker.pc.localDescription"
                                 " && window.renderBroker.pc.iceGatheringState === 'complete'")
    sdp = await page.evaluate("window.renderBroker.pc.localDescription.sdp")
    assert "m=video" in sdp and "a=recvonly" in sdp and "webrtc-datachannel" in sdp
    assert await page.evaluate("window.renderBroker.dc.label") == "input"
    await screenshot(page, "client-starting.png", full_page=False)
    view = await call(http, "GET", f"{api}/sessions/{sid}", second)
    assert view["state"] == "starting" and view["host"] == "solo-h0"

    # Cancel ends it; the page says why
    await page.click("#starting-cancel")
    await page.locator('body[data-view="ended"]').wait_for()
    assert await page.inner_text("#ended-reason") == "You ended the session."
    view = await call(http, "GET", f"{api}/sessions/{sid}", second)
    assert view["state"] == "ended" and view["end_reason"] == "user"
    await screenshot(page, "client-ended.png", full_page=False)
    assert not errors, errors


async def test_admin_end_shows_reason_and_guest_refused(broker: Proc, http: aiohttp.ClientSession, browser) -> None:
    """An admin ending a queued session reaches the page as 'ended by admin'; guest sign-in shows the 403."""
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/empty", ADMIN, {"kind": "game"})  # no hosts: everyone queues
    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{base}/")
    await page.click("#guest")  # the broker runs without allow_guests
    err = page.locator("#signin-error")
    await err.wait_for()
    assert "guest access is disabled" in await err.inner_text()
    await screenshot(page, "client-signin.png", full_page=False)

    await page.fill("#token", await user_token(http, base, "carol"))
    await page.click("#signin-submit")
    await page.locator('#pools article[data-pool="empty"] button').click()
    await page.locator('body[data-session-state="queued"]').wait_for()
    sid = await page.evaluate("window.renderBroker.sessionId")
    view = await call(http, "GET", f"{api}/sessions/{sid}", ADMIN)
    assert view["profile"]["fps"] == 60  # game pools stream at 60 fps
    await call(http, "DELETE", f"{api}/sessions/{sid}", ADMIN)
    await page.locator('body[data-view="ended"]').wait_for()
    assert await page.inner_text("#ended-reason") == "An administrator ended your session."
    assert not errors, errors


async def test_warning_banner_then_max_duration_reason(redis_url: str, prefix: str, tmp_path: Path,
                                                       http: aiohttp.ClientSession, browser) -> None:
    """A broker "warning" event shows as a banner; the max-duration end shows its human reason."""
    env = broker_env(redis_url, prefix, tmp_path, BROKER_REAPER_INTERVAL_S="0.25", BROKER_WARN_BEFORE_END_S="300")
    async with broker_process(env, str(tmp_path / "broker.log")) as broker:
        base, api = broker.url, f"{broker.url}/api/v1"
        await call(http, "PUT", f"{api}/pools/short", ADMIN, {"max_sessions_per_gpu": 1, "max_duration_s": 4})
        reg = await call(http, "POST", f"{api}/hosts", NODE, {
            "id": "short-h0", "pool": "short", "address": "127.0.0.1:7000", "gpus": [{"index": 0, "vram_mb": 8192}]})
        page = await browser.new_page()
        errors = page_errors(page)
        await page.goto(f"{base}/")
        await page.fill("#token", await user_token(http, base, "dave"))
        await page.click("#signin-submit")
        await page.locator('#pools article[data-pool="short"] button').click()
        await page.locator('body[data-session-state="starting"]').wait_for()
        sid = await page.evaluate("window.renderBroker.sessionId")
        # act as the node: the session runs, so the reaper warns before max duration ends it
        await call(http, "PUT", f"{api}/hosts/short-h0/sessions/{sid}/state", reg["node_credential"]["token"],
                   {"state": "running"})
        banner = page.locator("#banner")
        await banner.wait_for()
        assert "maximum duration" in await banner.inner_text()
        await screenshot(page, "client-warning.png", full_page=False)
        await page.locator('body[data-view="ended"]').wait_for(timeout=10_000)
        assert await page.inner_text("#ended-reason") == "Your session reached its maximum duration."
        assert await banner.is_hidden()
        assert not errors, errors


async def test_queue_moves_and_estimates_wait(broker: Proc, http: aiohttp.ClientSession, browser) -> None:
    """Position 2 -> 1 live; after one seat was handed out the page estimates the wait from that rate."""
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/duo", ADMIN, {"max_sessions_per_gpu": 1})
    await call(http, "POST", f"{api}/hosts", NODE, {
        "id": "duo-h0", "pool": "duo", "address": "127.0.0.1:7000", "gpus": [{"index": 0, "vram_mb": 8192}]})
    seated_user, ahead_user = await user_token(http, base, "u1"), await user_token(http, base, "u2")
    seated = await call(http, "POST", f"{api}/sessions", seated_user, {"pool": "duo"})
    ahead = await call(http, "POST", f"{api}/sessions", ahead_user, {"pool": "duo"})
    assert (seated["state"], ahead["queue_position"]) == ("starting", 1)

    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{base}/")
    await page.fill("#token", await user_token(http, base, "u3"))
    await page.click("#signin-submit")
    await page.locator('#pools article[data-pool="duo"] button').click()
    await page.locator("#queue-position", has_text="2").wait_for()
    assert "estimating" in (await page.inner_text("#queue-eta")).lower()
    await call(http, "DELETE", f"{api}/sessions/{seated['id']}", seated_user)  # the head of the queue is seated
    await page.locator("#queue-position", has_text="1").wait_for()
    eta = await page.inner_text("#queue-eta")
    assert eta.startswith("You're next · about "), eta
    assert await page.evaluate("window.renderBroker.state") == "queued"
    assert not errors, errors
