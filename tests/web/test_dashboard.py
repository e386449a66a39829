"""Admin dashboard in Chromium against a real broker process.

Sets up pools, a registered host with heartbeat telemetry and a running session through the API,
then checks that the dashboard shows them, that its Drain button really drains the host (checked
through the API: a new session queues instead of landing there), and that a user token is refused
with the broker's 403 problem detail.  Screenshots go to artifacts/.
"""

from __future__ import annotations

import time
from datetime import datetime

import aiohttp
import pytest

from broker.autoscale.plans import DEFAULT_PLAN
from broker.db.engine import create_engine
from broker.db.repository import Repository
from tests.conftest import ADMIN, NODE
from tests.procs import Proc
from tests.web.conftest import call, page_errors, screenshot, user_token

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

HOST = "studio-h0"
SOFTWARE_REASON = "NVENC probe did not encode; software encode, 1 of the host's 1 software seat(s)"


async def seed_history(db_url: str, now_ms: int) -> None:
    """24 h of five-minute utilization samples for the charts (a workday curve), as the sampler writes them."""
    engine = create_engine(db_url)
    repo = Repository(engine)
    rows = []
    for i in range(24 * 12):
        ts = now_ms - (24 * 12 - i) * 300_000
        local = datetime.fromtimestamp(ts / 1000)
        busy = max(0.0, 1 - abs(local.hour + local.minute / 60 - 14) / 7)  # busiest at 14:00 local time
        for pool, seats in (("studio", 8), ("arcade", 2)):
            sessions = round(seats * busy * (0.95 if pool == "studio" else 0.7))
            queue = max(0, round((busy - 0.85) * 20)) if pool == "studio" else 0
            rows.append({"ts_ms": ts, "pool": pool, "sessions": sessions, "seats_used": sessions,
                         "seats_total": seats, "queue_length": queue, "hosts_up": 2 if pool == "studio" else 1})
    await repo.add_samples(rows)
    await engine.dispose()


async def setup_broker(http: aiohttp.ClientSession, base: str) -> tuple[str, str]:
    """Pools, one host with two GPUs and telemetry, one running session; returns (session id, user token)."""
    api = f"{base}/api/v1"
    await call(http, "PUT", f"{api}/pools/studio", ADMIN, {
        "kind": "desktop", "max_sessions_per_gpu": 2, "vram_per_session_mb": 4096,
        "description": "Blender and CAD workstations"})
    await call(http, "PUT", f"{api}/pools/arcade", ADMIN, {"kind": "game", "max_sessions_per_gpu": 1,
                                                           "strategy": "depth-first"})
    reg = await call(http, "POST", f"{api}/hosts", NODE, {
        "id": HOST, "pool": "studio", "address": "10.0.0.7:7000", "version": "0.1.0",
        "gpus": [{"index": 0, "model": "NVIDIA L4", "vram_mb": 23034, "encoder_session_limit": None, "nvenc": True},
                 {"index": 1, "model": "NVIDIA L4", "vram_mb": 23034, "encoder_session_limit": None, "nvenc": True}]})
    await call(http, "POST", f"{api}/hosts", NODE, {
        "id": "arcade-h0", "pool": "arcade", "address": "10.0.1.3:7000", "version": "0.1.0",
        "gpus": [{"index": 0, "model": "NVIDIA RTX 4000 Ada", "vram_mb": 20475, "nvenc": True},
                 # its NVENC probe failed: the node registered it for software encode
                 {"index": 1, "model": "NVIDIA RTX 4000 Ada", "vram_mb": 20475, "nvenc": False,
                  "encode": "software", "encoder_session_limit": 1, "reason": SOFTWARE_REASON}]})
    alice = await user_token(http, base, "alice")
    s = await call(http, "POST", f"{api}/sessions", alice, {"pool": "studio", "profile": {"width": 1920,
                                                                                          "height": 1080, "fps": 60}})
    assert s["state"] == "starting" and s["host"] == HOST
    node = reg["node_credential"]["token"]  # the host's own credential: the node token only registers
    await call(http, "PUT", f"{api}/hosts/{HOST}/sessions/{s['id']}/state", node, {"state": "running"})
    await call(http, "PUT", f"{api}/hosts/{HOST}/heartbeat", node, {
        "cpu_percent": 37.5,
        "gpus": [{"index": 0, "utilization": 63, "vram_used_mb": 6900, "vram_total_mb": 22491,
                  "encoder_utilization": 41, "encoder_sessions": 1, "encoder_fps": 60, "temperature_c": 66,
                  "power_w": 48.2, "throttle_reasons": ["gpu_idle", "sw_power_cap"]},
                 {"index": 1, "utilization": 4, "vram_used_mb": 420, "encoder_utilization": 0,
                  "encoder_sessions": 0, "temperature_c": 41, "power_w": 17.0}],
        "sessions": [{"id": s["id"], "state": "running", "fps": 59.8, "bitrate_bps": 14_200_000, "rtt_ms": 9.5,
                      "jitter_ms": 1.2, "loss": 0.001, "encoder": "h264_nvenc", "width": 1920, "height": 1080}]})
    return s["id"], alice


async def test_dashboard_shows_state_drains_and_refuses_users(broker: Proc, http: aiohttp.ClientSession,
                                                              browser, tmp_path) -> None:
    base = broker.url
    sid, _alice = await setup_broker(http, base)
    await seed_history(f"sqlite:///{tmp_path / 'broker.db'}", int(time.time() * 1000))

    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{base}/web/admin.html")
    await page.fill("#token", ADMIN)
    await page.click("#signin-submit")

    # pool, host and the running session appear
    pool_row = page.locator('#pools-table tr[data-pool="studio"]')
    await pool_row.wait_for()
    assert "1 / 4" in await pool_row.inner_text()  # 1 of 2 GPUs x 2 seats used
    host_row = page.locator(f'#hosts-table tr[data-host="{HOST}"]')
    await host_row.wait_for()
    host_text = await host_row.inner_text()
    for fragment in ("NVIDIA L4", "63 %", "6.7 GiB / 22.0 GiB", "41 %", "1 sess. · 60 fps", "66 °C", "48 W",
                     "throttled: sw_power_cap"):
        assert fragment in host_text, (fragment, host_text)
    assert "gpu_idle" not in host_text  # idle clocks are not flagged
    badges = host_row.locator('[data-testid="gpu-encode"]')
    assert await badges.all_inner_texts() == ["NVENC", "NVENC"]
    # a GPU registered for software encode is flagged as such, with the node's reason on hover
    arcade_gpu = page.locator('#hosts-table tr[data-host="arcade-h0"] .gpu[data-gpu="1"]')
    soft = arcade_gpu.locator('[data-testid="gpu-encode"]')
    assert await soft.inner_text() == "software encode" and await soft.is_visible()
    assert await soft.get_attribute("data-encode") == "software"
    assert await soft.get_attribute("title") == SOFTWARE_REASON
    assert "0/1 seats" in await arcade_gpu.inner_text()  # a software seat the broker can place on
    nvenc_badge = page.locator('#hosts-table tr[data-host="arcade-h0"] .gpu[data-gpu="0"] [data-testid="gpu-encode"]')
    assert await nvenc_badge.inner_text() == "NVENC"
    # visibly flagged: the warning colour, not the NVENC one
    soft_color = await soft.evaluate("e => getComputedStyle(e).color")
    assert soft_color != await nvenc_badge.evaluate("e => getComputedStyle(e).color")
    assert await host_row.locator('[data-testid="host-state"]').inner_text() == "up"
    session_row = page.locator(f'#sessions-table tr[data-session="{sid}"]')
    await session_row.wait_for()
    assert await session_row.get_attribute("data-state") == "running"
    session_text = await session_row.inner_text()
    assert "alice" in session_text and "1920\u00d71080@60" in session_text and "h264_nvenc" in session_text
    # charts drew the seeded history; the audit log lists the setup
    await page.locator('#charts article[data-pool="studio"] svg path').first.wait_for()
    await page.locator('#audit-table tr[data-action="host.register"]').first.wait_for()
    # no pool has a plan or a recommendation: both endpoints answer 404, the scaling section stays hidden
    assert await page.locator("#scaling-section").is_hidden()
    # a plan and a recommendation appear once the broker has them
    await call(http, "PUT", f"{base}/api/v1/pools/studio/plan", ADMIN, DEFAULT_PLAN.to_dict())
    await call(http, "POST", f"{base}/api/v1/pools/studio/simulate", ADMIN, {"days": 1, "source": "synthetic"})
    await page.evaluate("window.renderBrokerAdmin.refresh()")
    scaling = page.locator('#scaling article[data-pool="studio"]')
    await scaling.wait_for()
    scaling_text = await scaling.inner_text()
    assert "autoscaling on" in scaling_text and "weekdays" in scaling_text and "always-on" in scaling_text
    assert await scaling.locator("tr.current").count() == 1  # the phase running now is marked
    assert "autoscaling off" in await page.locator('#scaling article[data-pool="arcade"]').inner_text()
    await screenshot(page, "dashboard.png")

    # Drain from the UI; the API confirms and placement honours it
    await host_row.locator('button[data-action="drain"]').click()
    await host_row.locator('[data-testid="host-state"]', has_text="draining").wait_for()
    host = await call(http, "GET", f"{base}/api/v1/hosts/{HOST}", ADMIN)
    assert host["state"] == "draining"
    bob = await user_token(http, base, "bob")
    queued = await call(http, "POST", f"{base}/api/v1/sessions", bob, {"pool": "studio"})
    assert queued["state"] == "queued" and queued["host"] is None and queued["queue_position"] == 1
    host = await call(http, "GET", f"{base}/api/v1/hosts/{HOST}", ADMIN)
    assert host["sessions"] == [sid]
    await page.evaluate("window.renderBrokerAdmin.refresh()")
    await page.locator(f'#sessions-table tr[data-session="{queued["id"]}"][data-state="queued"]').wait_for()
    await page.locator('#audit-table tr[data-action="host.drain"]').first.wait_for()
    await screenshot(page, "dashboard-drained.png")

    # End a session from the dashboard (two-step confirm)
    end = page.locator(f'#sessions-table tr[data-session="{queued["id"]}"] button[data-action="end"]')
    await end.click()
    await page.locator(f'#sessions-table tr[data-session="{queued["id"]}"] button', has_text="Confirm end").click()
    await page.locator(f'#sessions-table tr[data-session="{queued["id"]}"]').wait_for(state="detached")
    ended = await call(http, "GET", f"{base}/api/v1/sessions/{queued['id']}", ADMIN)
    assert ended["state"] == "ended" and ended["end_reason"] == "admin"

    # A user token is refused with the broker's problem detail
    await page.click("#signout")
    await page.fill("#token", bob)
    await page.click("#signin-submit")
    err = page.locator("#signin-error")
    await err.wait_for()
    text = await err.inner_text()
    assert "HTTP 403" in text and "forbidden" in text and "admin token" in text, text
    assert await page.locator("#dashboard").is_hidden()
    await screenshot(page, "dashboard-refused.png", full_page=False)
    assert not errors, errors
