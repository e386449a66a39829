"""Session starts and start failures by reason: a real agent starts real session runtimes that fail (an
encoder that cannot open, a display whose X server cannot run, a node that refuses root sessions, a
malformed command), its heartbeat carries the counts and the broker exports them (a real broker app on
real Redis + SQLite).  The exception -> reason mapping and the ICE/DTLS path are checked on their own."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import StartFailure
from encoder import EncoderOpenError, NoEncoderError
from streamer.desktop.capture import CaptureError, GameRendererUnavailable
from streamer.desktop.display import DisplayError
from streamer.desktop.xinput import InjectError
from streamer.media.session import SessionRefused
from streamer.node.agent import NodeAgent
from streamer.node.settings import NodeSettings
from streamer.node.starts import StartCounts, start_failure_reason
from tests.conftest import ADMIN, NODE, auth

pytestmark = pytest.mark.timeout(60)


class CannotOpen:
    """An encoder that fails to open, as NVENC does on a machine without a driver."""

    def __init__(self, backend: Any, _config: Any) -> None:
        raise EncoderOpenError(backend.name, "stand-in: Cannot load libcuda.so.1")


@pytest.mark.parametrize(("exc", "reason"), [
    (SessionRefused("root"), StartFailure.REFUSED),
    (DisplayError("Xvfb exited"), StartFailure.DISPLAY),
    (CaptureError("x11grab cannot open"), StartFailure.DISPLAY),
    (GameRendererUnavailable("no EGL"), StartFailure.DISPLAY),
    (InjectError("no XTEST"), StartFailure.DISPLAY),
    (EncoderOpenError("h264_nvenc", "no driver"), StartFailure.ENCODER),
    (NoEncoderError("no usable encoder", ["libx264: failed"]), StartFailure.ENCODER),
    (ValueError("size must be even"), StartFailure.ERROR),
    (RuntimeError("a bug"), StartFailure.ERROR),
])
def test_what_a_start_raised_names_the_reason(exc: BaseException, reason: StartFailure) -> None:
    assert start_failure_reason(exc) is reason


def test_only_connection_failures_count_from_the_runtime() -> None:
    counts = StartCounts()
    assert counts.heartbeat_fields() == {"session_starts_total": 0,
                                         "session_start_failures_total": dict.fromkeys(map(str, StartFailure), 0)}
    assert counts.connection_failed("ice_failed") is StartFailure.ICE_FAILED
    assert counts.connection_failed("dtls_failed") is StartFailure.DTLS_FAILED
    assert counts.connection_failed("no_encoder") is None  # not a connection failure: ignored
    failures = counts.heartbeat_fields()["session_start_failures_total"]
    assert failures["ice_failed"] == failures["dtls_failed"] == 1 and sum(failures.values()) == 2


def start_command(sid: str, kind: str, width: int = 320) -> dict[str, Any]:
    return {"id": sid, "kind": kind, "gpu": "0", "user": "u1", "profile": {"width": width, "height": 240, "fps": 30}}


async def run_start(agent: NodeAgent, cmd: dict[str, Any]) -> None:
    agent._start_session(cmd)
    await asyncio.wait_for(agent._starting[cmd["id"]], 30)
    assert cmd["id"] not in agent.sessions  # it failed: nothing runs


def failures(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^render_broker_session_start_failures_total{host="st1",pool="p1",reason="(\w+)"} (\S+)$',
                        text, re.M)}


async def test_failed_starts_are_counted_by_reason_and_reach_the_broker(
    aiohttp_client, settings_factory, clock, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from broker.app import create_app

    api = await aiohttp_client(create_app(settings_factory(), clock=clock))
    assert (await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))).status == 201
    agent = NodeAgent(NodeSettings(broker_url=str(api.make_url("")), node_token=NODE, host_id="st1", pool="p1",
                                   seats=1, heartbeat_interval_s=3600, watchdog=False, audio=False))
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        # a game whose encoder cannot open (the probes and the choice are real, the open fails)
        with monkeypatch.context() as patch:
            patch.setattr("streamer.media.session.VideoEncoder", CannotOpen)
            await run_start(agent, start_command("enc", "game"))
        # a desktop whose X server cannot run (no Xvfb on the PATH), on a node that allows root sessions
        agent.runtime_config = dataclasses.replace(agent.runtime_config, app_refusal=None)
        with monkeypatch.context() as patch:
            patch.setenv("PATH", str(tmp_path))
            await run_start(agent, start_command("disp", "desktop"))
        # a desktop on a node that refuses to run session programs as root
        agent.runtime_config = dataclasses.replace(agent.runtime_config, app_refusal="would run as root")
        await run_start(agent, start_command("ref", "desktop"))
        await run_start(agent, start_command("odd", "game", width=321))  # a malformed command
        # the runtime says a session's first viewer connection failed ICE (a start failure, counted once)
        await agent._on_runtime_event("odd", "signal", {"msg": {"type": "error", "code": "ice_failed"},
                                                        "start_failure": "ice_failed"})
        await agent._on_runtime_event("odd", "signal", {"msg": {"type": "error", "code": "ice_failed"}})
        await agent.heartbeat()
        text = await (await api.get("/metrics")).text()
        assert 'render_broker_session_starts_total{host="st1",pool="p1"} 4.0' in text.splitlines()
        assert failures(text) == {"refused": 1.0, "display": 1.0, "encoder": 1.0, "error": 1.0, "ice_failed": 1.0,
                                  "dtls_failed": 0.0}
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
