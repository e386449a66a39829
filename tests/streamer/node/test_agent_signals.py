"""An offer the runtime never answers holds up nothing else on the node's command socket.

A real agent's command handler and a real game ``SessionRuntime`` (built-in renderer, real encoder,
a real aiortc viewer's offer); only ``ViewerPeer.answer`` is replaced by one that never returns (the
stuck offer seen in an SDK e2e run).  The command socket is a stand-in that records what the node sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamer.media import peer as peer_module
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from streamer.node import agent as agent_module
from streamer.node.agent import NodeAgent
from streamer.node.settings import NodeSettings
from tests.conftest import NODE
from tests.streamer.viewer import Viewer

pytestmark = pytest.mark.timeout(60)


class Socket:
    """What the agent uses of its command socket: ``send_json``."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_json(self, data: dict[str, Any]) -> None:
        self.sent.append(data)


class StuckAnswers:
    """``ViewerPeer.answer`` that never returns (the first ``stuck`` times), and records closed peers."""

    def __init__(self, stuck: int) -> None:
        self.stuck = stuck
        self.started = asyncio.Event()
        self.peers: list[Any] = []
        self.closed: list[Any] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        answer, close = peer_module.ViewerPeer.answer, peer_module.ViewerPeer.close
        this = self

        async def stuck_answer(peer: Any, *args: Any, **kwargs: Any) -> str:
            if this.stuck <= 0:
                return await answer(peer, *args, **kwargs)
            this.stuck -= 1
            this.peers.append(peer)
            this.started.set()
            await asyncio.Event().wait()  # never
            raise AssertionError("unreachable")

        async def recorded_close(peer: Any) -> None:
            this.closed.append(peer)
            await close(peer)

        monkeypatch.setattr(peer_module.ViewerPeer, "answer", stuck_answer)
        monkeypatch.setattr(peer_module.ViewerPeer, "close", recorded_close)


@pytest.fixture
async def node() -> AsyncIterator[tuple[NodeAgent, SessionRuntime]]:
    agent = NodeAgent(NodeSettings(broker_url="http://127.0.0.1:9", node_token=NODE, host_id="sig1", pool="p1",
                                   seats=1, watchdog=False, advertise_addresses=["127.0.0.1"]))
    runtime = SessionRuntime(SessionSpec(id="g1", kind="game", width=320, height=240, fps=30),
                             RuntimeConfig(advertise_addresses=("127.0.0.1",)))
    await runtime.start()
    agent.sessions["g1"] = runtime
    yield agent, runtime
    await agent.stop_all("test over")
    await runtime.stop()


async def offer() -> dict[str, Any]:
    viewer = Viewer()
    try:
        return await viewer.offer()
    finally:
        await viewer.close()


async def until_no_signal_in_flight(agent: NodeAgent) -> None:
    for _ in range(300):
        if not agent._signals:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"signaling messages still in flight: {agent._signals}")


def signal(msg: dict[str, Any]) -> dict[str, Any]:
    return {"cmd": "signal", "session_id": "g1", "msg": msg}


async def test_a_stop_after_a_stuck_offer_stops_the_session_at_once(node, monkeypatch, caplog) -> None:
    agent, runtime = node
    stuck = StuckAnswers(stuck=1)
    stuck.install(monkeypatch)
    ws = Socket()
    caplog.set_level(logging.INFO, logger="streamer.node.agent")
    # the command handler returns while the offer is still in progress ...
    await asyncio.wait_for(agent._on_command(ws, signal(await offer())), 2)  # type: ignore[arg-type]
    await asyncio.wait_for(stuck.started.wait(), 10)
    assert "session g1: offer received" in caplog.text
    # ... and a stop that follows it (it needs the runtime's signal lock the offer holds) is not held up by it,
    # though the offer timeout (20 s) is far off
    assert agent_module.OFFER_TIMEOUT_S >= 20
    await asyncio.wait_for(agent._on_command(ws, {"cmd": "stop", "session_id": "g1", "reason": "admin"}),  # type: ignore[arg-type]
                           10)
    assert runtime.state == "stopped" and "g1" not in agent.sessions
    assert not agent._signals  # the stuck offer was cancelled, and its peer closed
    assert stuck.closed == stuck.peers and len(stuck.peers) == 1
    assert ws.sent == []


async def test_an_offer_not_answered_in_time_is_abandoned_and_the_next_one_answered(node, monkeypatch,
                                                                                   caplog) -> None:
    agent, runtime = node
    stuck = StuckAnswers(stuck=1)
    stuck.install(monkeypatch)
    monkeypatch.setattr(agent_module, "OFFER_TIMEOUT_S", 0.5)
    ws = Socket()
    caplog.set_level(logging.INFO, logger="streamer.node.agent")
    await agent._on_command(ws, signal(await offer()))  # type: ignore[arg-type]
    await until_no_signal_in_flight(agent)
    await agent._on_command(ws, signal(await offer()))  # type: ignore[arg-type]
    await until_no_signal_in_flight(agent)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "session g1: offer not answered in 0.5 s: abandoned (the viewer offers again)"]
    assert stuck.closed[:1] == stuck.peers  # the abandoned offer's peer is closed
    assert [m["msg"]["type"] for m in ws.sent] == ["answer"]  # the second offer, answered
    assert any(r.getMessage().startswith("session g1: offer answered in ") and r.getMessage().endswith("(answer)")
               for r in caplog.records)
    assert runtime.state == "running"
