"""Media on a configured UDP port range: parsing, binding within it, and a viewer told when the range is full."""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import socket

import pytest

from broker.protocol import SignalError
from rbcommon.udpports import NoFreePort, PortRange, bind_in_range
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import Viewer

pytestmark = pytest.mark.timeout(60)


def test_parse_reads_a_range_or_one_port_and_names_the_setting_when_wrong() -> None:
    assert PortRange.parse("") is None and PortRange.parse("  ") is None
    assert PortRange.parse("40000-40099") == PortRange(40000, 40099) and len(PortRange(40000, 40099)) == 100
    assert PortRange.parse("40000") == PortRange(40000, 40000)
    for bad in ("x", "40000-", "40000-x", "100-200", "50000-40000", "40000-70000"):
        with pytest.raises(ValueError, match="udp_ports"):
            PortRange.parse(bad)
    order = PortRange(40000, 40009).order(random.Random(3))
    assert sorted(order) == list(range(40000, 40010))  # every port once
    assert all((b - a) % 10 == 1 for a, b in itertools.pairwise(order))  # consecutive, wrapping


def free_udp_range(size: int) -> PortRange:
    """``size`` consecutive UDP ports free on 127.0.0.1 right now (tests hold them only briefly)."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(30_000, 60_000 - size)
        socks = []
        try:
            for port in range(first, first + size):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return PortRange(first, first + size - 1)
    raise RuntimeError("no free UDP port range found")


async def test_binds_take_every_port_of_the_range_once_then_none() -> None:
    ports = free_udp_range(3)
    loop_transports = []
    try:
        for _ in range(3):
            transport, _proto = await bind_in_range(asyncio.DatagramProtocol, "127.0.0.1", ports)
            loop_transports.append(transport)
        got = sorted(t.get_extra_info("sockname")[1] for t in loop_transports)
        assert got == list(range(ports.first, ports.last + 1))
        with pytest.raises(NoFreePort, match=f"no free UDP port in {ports} on 127.0.0.1"):
            await bind_in_range(asyncio.DatagramProtocol, "127.0.0.1", ports)
    finally:
        for t in loop_transports:
            t.close()


def candidate_ports(sdp: str) -> set[int]:
    return {int(m.group(1)) for m in re.finditer(r"a=candidate:\S+ \d+ udp \d+ \S+ (\d+) typ host", sdp)}


async def test_viewers_media_uses_the_range_and_a_full_range_is_an_error_the_viewer_can_act_on() -> None:
    ports = free_udp_range(1)
    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100, udp_ports=ports)
    first = SessionRuntime(SessionSpec(id="ports-1", kind="game", width=320, height=240, fps=30), config)
    second = SessionRuntime(SessionSpec(id="ports-2", kind="game", width=320, height=240, fps=30), config)
    await first.start()
    await second.start()
    v1, v2, v3 = Viewer(), Viewer(), Viewer()
    try:
        replies = await first.handle_signal(await v1.offer())
        answer = next(r for r in replies if r.get("type") == "answer")
        assert candidate_ports(answer["sdp"]) == {ports.first}
        await v1.pc.setRemoteDescription(type(v1.pc.localDescription)(sdp=answer["sdp"], type="answer"))
        await v1.wait_frames(3)

        # the only port is taken: the second session's viewer is told why, and what to do
        replies = await second.handle_signal(await v2.offer())
        errors = [r for r in replies if r.get("type") == "error"]
        assert [e["code"] for e in errors] == [SignalError.NO_UDP_PORT], replies
        assert "no free UDP port" in errors[0]["detail"] and "try again" in errors[0]["detail"]

        await v1.close()
        await first.stop()  # its viewer's socket is released
        await v3.connect(second.handle_signal)  # a new offer now gets the port
        await v3.wait_frames(3)
    finally:
        for v in (v1, v2, v3):
            await v.close()
        await first.stop()
        await second.stop()
