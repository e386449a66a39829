"""Fixtures for the browser tests: a real broker process and headless Debian Chromium via Playwright.

Chromium is never downloaded: Playwright drives /usr/bin/chromium through
``launch_persistent_context`` with a fresh user-data dir and the flags in FACTS.md.
Tests that need it skip (with the reason) where it is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.common import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import Proc, broker_process

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
VIEWPORT = {"width": 1280, "height": 720}


def broker_env(redis_url: str, prefix: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for ``python -m broker serve`` on the test's Redis prefix and its own SQLite file."""
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "data"),
           "BROKER_DATABASE_URL": f"sqlite:///{tmp_path / 'broker.db'}", "BROKER_REAPER_INTERVAL_S": "3600",
           "BROKER_SAMPLE_INTERVAL_S": "3600", "BROKER_HOST_LEASE_TTL_S": "300", "BROKER_LOG_LEVEL": "warning",
           "BROKER_AUTOSCALE_INTERVAL_S": "0"}  # the autoscaler stays off: tests drain hosts themselves
    env.update(extra)
    return env


@pytest.fixture
async def broker(redis_url: str, prefix: str, tmp_path: Path) -> AsyncIterator[Proc]:
    """A real broker process (serving web/ too) on the test's Redis prefix."""
    async with broker_process(broker_env(redis_url, prefix, tmp_path), str(tmp_path / "broker.log")) as proc:
        yield proc


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh headless Chromium context (Playwright, Debian's binary, fresh profile)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed")
    profile = tmp_path / "chromium-profile"
    async with async_playwright() as pw:
        ctx = await pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT,
            color_scheme="dark")
        ctx.set_default_timeout(10_000)
        try:
            yield ctx
        finally:
            await ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


def page_errors(page: Any) -> list[str]:
    """Collect uncaught page errors and console errors; the test asserts the list stays empty.

    Chromium logs every 4xx response as "Failed to load resource"; expected ones (the optional scaling
    endpoints' 404, a refused token's 403) are part of the tests, so those network lines are not errors.
    """
    errors: list[str] = []

    def on_console(msg: Any) -> None:
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            errors.append(f"console.{msg.type}: {msg.text}")

    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", on_console)
    return errors


async def screenshot(page: Any, name: str, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    if full_page:
        await page.evaluate("window.scrollTo(0, 0)")  # sticky header at the top of the capture
    await page.screenshot(path=str(path), full_page=full_page)
    return path


async def call(http: aiohttp.ClientSession, method: str, url: str, token: str, body: Any = None,
               expect: tuple[int, ...] = (200, 201)) -> Any:
    """One API call; asserts the status and returns the JSON body."""
    async with http.request(method, url, json=body, headers=auth(token)) as r:
        text = await r.text()
        assert r.status in expect, f"{method} {url} -> {r.status}: {text}"
        return await r.json() if text else None


async def user_token(http: aiohttp.ClientSession, base: str, user: str) -> str:
    data = await call(http, "POST", f"{base}/api/v1/tokens", ADMIN, {"user": user, "ttl_s": 3600})
    return str(data["token"])
