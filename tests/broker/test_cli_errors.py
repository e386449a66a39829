"""Operator mistakes get one clear line, not a traceback; tokens never reach a log line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from broker.cli import RedactTokens
from broker.settings import BrokerSettings
from rbcommon.settings import load
from tests.conftest import ADMIN, NODE, SECRET
from tests.procs import broker_process


def test_a_bad_setting_value_is_one_line_naming_the_setting() -> None:
    with pytest.raises(SystemExit) as exc:
        load(BrokerSettings, ["--port", "abc"], {}, "BROKER_")
    assert str(exc.value).startswith("--port: bad value 'abc'")
    with pytest.raises(SystemExit) as exc:
        load(BrokerSettings, [], {"BROKER_HOST_LEASE_TTL_S": "soon"}, "BROKER_")
    assert str(exc.value).startswith("BROKER_HOST_LEASE_TTL_S: bad value 'soon'")


def test_tokens_in_urls_are_redacted_from_log_lines() -> None:
    record = logging.LogRecord("aiohttp.access", logging.INFO, __file__, 1, '"GET %s HTTP/1.1" %d',
                               (f"/api/v1/sessions/x/events?access_token={ADMIN}&v=2", 200), None)
    assert RedactTokens().filter(record)
    line = record.getMessage()
    assert ADMIN not in line and "access_token=[redacted]&v=2" in line


async def test_a_busy_port_is_one_line_and_exit_2(redis_url: str, prefix: str, tmp_path: Path) -> None:
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d")}
    async with broker_process(env, str(tmp_path / "a.log")) as first:
        port = first.url.rsplit(":", 1)[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker", "serve", env={**os.environ, **env, "BROKER_PORT": port},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    text = err.decode()
    assert "Traceback" not in text, text
    assert f"render-broker: cannot listen on 127.0.0.1:{port}" in text


def test_a_malformed_http_request_is_one_warning_line_not_a_traceback() -> None:
    from aiohttp.http_exceptions import BadHttpMessage

    from broker.cli import QuietBadRequests

    try:
        raise BadHttpMessage("Invalid header value char:\n\n  b'X-Probe: \\x00'\n            ^")
    except BadHttpMessage:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                   ("127.0.0.1",), sys.exc_info())
    assert QuietBadRequests().filter(record)
    assert record.exc_info is None and record.levelno == logging.WARNING
    assert record.getMessage().startswith("bad HTTP request answered 400: 400, message: Invalid header value char:")
    assert "\n" not in record.getMessage()
    other = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "boom", None, None)
    assert QuietBadRequests().filter(other) and other.levelno == logging.ERROR  # anything else is untouched


@pytest.mark.parametrize(("env", "expected"), [
    ({"BROKER_TURN_URLS": "turn:t.example.test,turns:t.example.test?transport=udp"},
     "render-broker: turn_urls: 'turns:t.example.test?transport=udp': turns (TLS) runs over tcp"),
    ({"BROKER_TURN_URLS": "stun:t.example.test"}, "render-broker: turn_urls: 'stun:t.example.test': expected a turn"),
    ({"BROKER_STUN_URLS": "stun.example.test:3478"}, "render-broker: stun_urls: 'stun.example.test:3478': expected"),
])
async def test_a_bad_ice_url_is_one_line_naming_the_setting_and_exit_2(tmp_path: Path, env: dict[str, str],
                                                                       expected: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "serve", env={**os.environ, "BROKER_DATA_DIR": str(tmp_path / "d"), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    text = err.decode()
    assert "Traceback" not in text and expected in text, text
