"""The dashboard's canary card in Chromium against a real broker process: it shows the pool's rollout
(candidate, share, hosts per class) and its Roll back button really rolls back (checked through the API:
the candidate's host is drained and the rollout stands rolled back)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.conftest import ADMIN, NODE
from tests.procs import Proc
from tests.web.conftest import call, page_errors

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


async def test_rollout_card_shows_the_canary_and_rolls_it_back(broker: Proc, http: aiohttp.ClientSession,
                                                              browser) -> None:
    api = f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/studio", ADMIN, {"max_sessions_per_gpu": 2, "vram_per_session_mb": 4096})
    for host, version in (("studio-s0", "1.4.0"), ("studio-c0", "1.5.0-rc1")):
        await call(http, "POST", f"{api}/hosts", NODE, {
            "id": host, "pool": "studio", "address": f"{host}:7000", "version": version,
            "gpus": [{"index": 0, "model": "NVIDIA L4", "vram_mb": 23034}]})
    await call(http, "PUT", f"{api}/pools/studio/rollout", ADMIN, {"candidate_version": "1.5.0-rc1", "share_pct": 25})

    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{broker.url}/web/admin.html")
    await page.fill("#token", ADMIN)
    await page.click("#signin-submit")
    card = page.locator('#rollouts article[data-pool="studio"]')
    await card.wait_for()
    text = await card.inner_text()
    for fragment in ("1.5.0-rc1", "25 % of new sessions", "1 candidate / 1 stable", "active", "Not judged yet"):
        assert fragment in text, (fragment, text)
    assert "v1.5.0-rc1" in await page.locator('#hosts-table tr[data-host="studio-c0"]').inner_text()

    await card.locator('button[data-action="rollback"]').click()
    await page.locator('#rollouts article[data-pool="studio"][data-state="rolled_back"]').wait_for()
    view = await call(http, "GET", f"{api}/pools/studio/rollout", ADMIN)
    assert view["state"] == "rolled_back" and view["last"]["reason"] == "admin"
    hosts = {h["id"]: h["state"] for h in (await call(http, "GET", f"{api}/hosts", ADMIN))["hosts"]}
    assert hosts == {"studio-s0": "up", "studio-c0": "draining"}
    assert errors == []
