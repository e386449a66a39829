"""The client SDK against a real broker and render node: guest sign-in, the queue followed live,
the offer, decoded frames with stamps, input reaching the game, stats, and ending the session.

Two guests queue before the node exists (positions 1 and 2); the node starts, the first is
seated and the second moves to position 1 on its event stream; the first streams and plays;
ending it seats the second.  WebRTC on loopback: node and clients offer 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from rbclient import ApiError, Broker, SessionView, SignalingError, Stream
from streamer.desktop.game import find_player
from tests.rbclient.sysfix import broker, game_pool, node, seats_used
from tests.streamer.viewer import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
W, H = 640, 360


def player(stream: Stream) -> tuple[float, float] | None:
    frame = stream.latest
    return None if frame is None else find_player(np.asarray(frame.image.to_ndarray(format="bgr24")))


async def test_sdk_queues_streams_plays_and_ends(redis_url: str, prefix: str, tmp_path: Path) -> None:
    async with broker(redis_url, prefix, tmp_path) as url, Broker(url) as first, Broker(url) as second:
        await game_pool(url)
        await first.sign_in_guest()
        await second.sign_in_guest()
        assert first.user != second.user and (await first.whoami())["role"] == "user"
        assert [p["name"] for p in await first.pools()] == ["game"]
        with pytest.raises(ApiError) as bad:
            await first.create_session("game", width=641)
        assert (bad.value.status, bad.value.code, bad.value.field) == (422, "invalid_input", "profile.width")

        a = await first.create_session("game", width=W, height=H, fps=30)
        b = await second.create_session("game", width=W, height=H, fps=30)
        assert (a["state"], a["queue_position"], b["queue_position"]) == ("queued", 1, 2)
        b_updates: list[SessionView] = []
        b_waits = asyncio.create_task(second.wait_seated(b["id"], b_updates.append))

        async with node(url, "game", "node-sdk", tmp_path / "node.log"):
            a = await first.wait_seated(a["id"], running=True)
            await until(lambda: [u.get("queue_position") for u in b_updates][-1:] == [1],
                        f"the second guest's position did not move to 1: {b_updates}", deadline_s=30)
            assert [u["queue_position"] for u in b_updates][:1] == [2] and not b_waits.done()

            stream = Stream(first, a, host_addresses=("127.0.0.1",))
            await stream.connect()
            newest = await stream.wait_frames(20)
            assert (newest.image.width, newest.image.height) == (W, H)
            stamped = [f for f in [newest] if f.stamp is not None]
            assert stamped, "the game's frame stamp was not read"
            first_no = stamped[0].stamp.frame_no  # type: ignore[union-attr]
            await stream.wait_frames(30)
            assert stream.latest is not None and stream.latest.stamp is not None
            assert stream.latest.stamp.frame_no > first_no

            # keyboard: ArrowRight moves the player right
            start = player(stream)
            assert start is not None
            assert stream.key("ArrowRight", True)
            await until(lambda: (p := player(stream)) is not None and p[0] > start[0] + 20,
                        "the player did not move right on ArrowRight")
            stream.key("ArrowRight", False)
            # gamepad: axis 1 down moves the player down
            start = player(stream)
            assert start is not None
            assert stream.gamepad(0, [0.0, 1.0], [0.0] * 17)
            await until(lambda: (p := player(stream)) is not None and p[1] > start[1] + 20,
                        "the player did not move down on gamepad axis 1")
            stream.gamepad(0, [0.0, 0.0], [0.0] * 17)
            assert stream.pointer_move_by(64, 0) and stream.pointer.x == pytest.approx(0.6)

            await until(lambda: bool(stream.stats.input_rtts_ms) and bool(stream.stats.node),
                        "no pong or no node stats")
            snap = stream.stats.snapshot(stream.latest.at_ms)
            assert snap.fps is not None and snap.fps > 5 and snap.width == W
            assert snap.render_to_decode_ms is not None and 0 < snap.render_to_decode_ms < 5000
            assert snap.node.get("codec") in ("H264", "VP8") and snap.bitrate_bps
            await until(lambda: stream.stats.node.get("probe_rtt_ms") is not None,
                        "the node never reported a probe round trip: probe answers did not reach it")

            # reconnect as protocol.md says: a new peer connection and offer on the same seated session
            await stream.close()
            view = await first.session(a["id"])
            assert view["state"] in ("running", "disconnected") and view["signaling"], view
            stream = Stream(first, view, host_addresses=("127.0.0.1",))
            await stream.connect()
            again = await stream.wait_frames(5)
            assert (again.image.width, again.image.height) == (W, H)
            await until(lambda: stream.stats.frames >= 5, "no frames after reconnecting")
            assert (await first.session(a["id"]))["state"] == "running"

            ended = await stream.end()
            assert (ended["state"], ended["end_reason"]) == ("ended", "user")
            await until(lambda: stream.closed, "the signaling socket stayed open after DELETE")
            stale = Stream(first, view)  # a view from while it was seated: the broker refuses the socket now
            with pytest.raises(SignalingError) as refused:
                await stale.connect()
            assert refused.value.code == "http_409"
            await stale.close()
            seated = await asyncio.wait_for(b_waits, 30)
            assert seated["state"] in ("starting", "running") and seated["host"] == "node-sdk"
            await second.end_session(b["id"])
            await until_seats_free(url)


async def until_seats_free(url: str) -> None:
    for _ in range(300):
        if await seats_used(url) == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("a seat stayed used after both sessions ended")
