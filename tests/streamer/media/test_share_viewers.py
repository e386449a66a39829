"""Share viewers on a node: one encode for the owner and every viewer, view-only input refused.

A real game session (built-in renderer, libx264), the owner and two share viewers as real aiortc peers on
127.0.0.1 in this process; frames are compared by the stamp (frame number) the game draws into each one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiortc import RTCSessionDescription

from streamer.desktop.game import find_player, read_stamp
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from streamer.media.viewers import cap_bitrate
from tests.streamer.viewer import Viewer, until

pytestmark = pytest.mark.timeout(60)

CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100)


@pytest.fixture
async def game() -> AsyncIterator[SessionRuntime]:
    runtime = SessionRuntime(SessionSpec(id="share-1", kind="game", width=640, height=360, fps=30), CONFIG)
    await runtime.start()
    yield runtime
    await runtime.stop()


def stamps(viewer: Viewer) -> set[int]:
    return {s.frame_no for image in list(viewer.images) if (s := read_stamp(image)) is not None}


async def test_two_viewers_and_the_owner_decode_the_same_frames_and_viewers_cannot_type(game: SessionRuntime) -> None:
    owner, a, b = Viewer(), Viewer(), Viewer()
    try:
        await owner.connect(game.handle_signal)
        await owner.wait_frames(5)
        offer_a = await a.offer()
        replies = await game.handle_viewer_signal("va", "view", offer_a)
        assert replies[0]["type"] == "answer", replies
        # the same offer again (a page's socket reconnected): the same answer, the connection kept
        assert await game.handle_viewer_signal("va", "view", offer_a) == replies
        await a.pc.setRemoteDescription(RTCSessionDescription(sdp=replies[0]["sdp"], type="answer"))
        await b.connect(lambda msg: game.handle_viewer_signal("vb", "view", msg))
        frames_a = await a.wait_frames(10)
        frames_b = await b.wait_frames(10)
        assert frames_a[0].key_frame and frames_b[0].key_frame

        # one encode: the three decoders saw the very same frames (frame numbers drawn into them)
        await until(lambda: len(stamps(owner) & stamps(a) & stamps(b)) >= 10, "no common frames")
        stats = game.stats()
        assert stats["encoder"] == "libx264"  # one encoder, three peers
        assert {v["id"] for v in stats["share_viewers"]} == {"va", "vb"}
        await until(lambda: all(v["connected"] for v in game.stats()["share_viewers"]), "viewers not connected")

        # a view-only viewer's input never reaches the game; its pings are answered
        start = find_player(owner.images[-1])
        assert start is not None
        a.send({"t": "k", "c": "ArrowRight", "d": True})
        a.send({"t": "pm", "x": 0.9, "y": 0.9})
        a.send({"t": "ping", "id": 7, "ts": 1.5})
        assert await a.wait_message(lambda m: m.get("t") == "pong", "pong") == {"t": "pong", "id": 7, "ts": 1.5}
        await until(lambda: game.stats()["share_input_dropped"] == 2, "the viewer's input was not refused")
        count = len(owner.frames)
        await owner.wait_frames(15, after=count)
        now = find_player(owner.images[-1])
        assert now is not None and abs(now[0] - start[0]) < 5 and abs(now[1] - start[1]) < 5, (start, now)
        assert game.stats()["input_accepted"] == 0
        # ... while the owner's does
        owner.send({"t": "k", "c": "ArrowRight", "d": True})
        await until(lambda: (p := find_player(owner.images[-1])) is not None and p[0] > start[0] + 20,
                    "the owner's input did not move the player")
        owner.send({"t": "k", "c": "ArrowRight", "d": False})

        # a viewer cut off (peer_left: its link was revoked) leaves the owner and the other viewer streaming
        assert await game.handle_viewer_signal("va", "view", {"type": "peer_left", "reason": "share_revoked"}) == []
        assert [v["id"] for v in game.stats()["share_viewers"]] == ["vb"]
        count_b, count_owner = len(b.frames), len(owner.frames)
        await b.wait_frames(10, after=count_b)
        await owner.wait_frames(10, after=count_owner)
        # the owner leaving does not stop a viewer's stream
        await game.handle_signal({"type": "bye"})
        count_b = len(b.frames)
        await b.wait_frames(10, after=count_b)
    finally:
        for v in (owner, a, b):
            await v.close()


async def test_an_offer_for_another_codec_is_refused_and_a_stopped_session_refuses_offers(game: SessionRuntime) -> None:
    vp8 = Viewer(codecs=("VP8",))
    try:
        replies = await game.handle_viewer_signal("v8", "view", await vp8.offer())
        assert replies[0]["type"] == "error" and replies[0]["code"] == "no_common_codec", replies
    finally:
        await vp8.close()
    await game.stop()
    late = Viewer()
    try:
        replies = await game.handle_viewer_signal("v9", "view", await late.offer())
        assert replies[0]["code"] == "not_running"
    finally:
        await late.close()


def test_the_bitrate_follows_the_slowest_viewer_above_a_floor() -> None:
    assert cap_bitrate(4_000_000, [], 300_000) == 4_000_000  # no viewer estimate yet: the owner's
    assert cap_bitrate(4_000_000, [2_500_000, 6_000_000], 300_000) == 2_500_000  # the slowest viewer
    assert cap_bitrate(4_000_000, [100_000], 300_000) == 300_000  # but not under the floor
    assert cap_bitrate(200_000, [100_000], 300_000) == 200_000  # and never above the owner's own
