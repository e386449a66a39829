"""Control handed to a share viewer on a node: its keys move the game's player; before the grant and after
the take-back they are dropped and counted; the viewer leaving takes control back.

A real game session (built-in renderer, libx264), the owner and one share viewer as real aiortc peers on
127.0.0.1 in this process; the player's position is read from the frames the owner decodes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from streamer.desktop.game import find_player
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import Viewer, until

pytestmark = pytest.mark.timeout(60)

CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100)


@pytest.fixture
async def game() -> AsyncIterator[SessionRuntime]:
    runtime = SessionRuntime(SessionSpec(id="control-1", kind="game", width=640, height=360, fps=30), CONFIG)
    await runtime.start()
    yield runtime
    await runtime.stop()


def player_x(viewer: Viewer) -> int:
    pos = find_player(viewer.images[-1])
    assert pos is not None
    return pos[0]


async def still(owner: Viewer) -> int:
    """The player's x after 10 more frames (nothing moving it)."""
    await owner.wait_frames(10, after=len(owner.frames))
    return player_x(owner)


async def test_a_viewer_in_control_moves_the_player_before_and_after_it_is_dropped(game: SessionRuntime) -> None:
    owner, v = Viewer(), Viewer()
    try:
        await owner.connect(game.handle_signal)
        await v.connect(lambda msg: game.handle_viewer_signal("v1", "view", msg))
        await v.wait_frames(3)
        await until(lambda: all(x["connected"] for x in game.stats()["share_viewers"]), "viewer not connected")
        start = await still(owner)

        # before the grant: dropped and counted, the player stays
        v.send({"t": "k", "c": "ArrowRight", "d": True})
        await until(lambda: game.stats()["share_input_dropped"] == 1, "the key was not refused")
        assert abs(await still(owner) - start) < 5
        v.send({"t": "k", "c": "ArrowRight", "d": False})
        await until(lambda: game.stats()["share_input_dropped"] == 2, "the key up was not refused")

        # granted: the same key moves the player; resize stays the owner's
        game.set_controller("v1")
        assert game.stats()["share_controller"] == "v1"
        v.send({"t": "rs", "w": 320, "h": 200})
        v.send({"t": "k", "c": "ArrowRight", "d": True})
        await until(lambda: player_x(owner) > start + 20, "the controlling viewer's key did not move the player")
        stats = game.stats()
        assert stats["share_input_applied"] == 1 and stats["share_input_dropped"] == 3  # key down and up, then rs
        assert stats["share_viewers"][0]["in_control"] is True

        # taken back: the held key is released (the player stops) and new keys are dropped again
        game.set_controller(None)
        moved = await still(owner)
        assert abs(await still(owner) - moved) < 5
        v.send({"t": "k", "c": "ArrowLeft", "d": True})
        await until(lambda: game.stats()["share_input_dropped"] == 4, "the key after take-back was not refused")
        assert abs(await still(owner) - moved) < 5
        assert game.stats()["share_input_applied"] == 1

        # granted again, then the viewer leaves (its link revoked): control goes back to the owner alone
        game.set_controller("v1")
        assert await game.handle_viewer_signal("v1", "view", {"type": "peer_left", "reason": "share_revoked"}) == []
        assert game.stats()["share_controller"] is None
    finally:
        await v.close()
        await owner.close()
