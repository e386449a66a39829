"""The SDK watching a share link through a real broker and render node: the owner shares, a viewer with the
share token decodes the owner's frames (same frame stamps), its key presses do not move the game, and
stopping the link ends the viewer (``bye`` ``share_revoked``) and refuses it afterwards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rbclient import ApiError, Broker, Stream, watch
from streamer.desktop.game import find_player
from tests.rbclient.sysfix import broker, game_pool, node
from tests.streamer.viewer import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def player(stream: Stream) -> tuple[float, float] | None:
    frame = stream.latest
    return None if frame is None else find_player(np.asarray(frame.image.to_ndarray(format="bgr24")))


def stamps(seen: set[int], stream: Stream) -> bool:
    if stream.latest is not None and stream.latest.stamp is not None:
        seen.add(stream.latest.stamp.frame_no)
    return False


async def test_a_share_link_s_viewer_sees_the_owner_s_frames_and_is_cut_off(redis_url: str, prefix: str,
                                                                          tmp_path: Path) -> None:
    async with broker(redis_url, prefix, tmp_path) as url, Broker(url) as owner:
        await game_pool(url)
        await owner.sign_in_guest()
        view = await owner.create_session("game", width=640, height=360, fps=30)
        async with node(url, "game", "node-share", tmp_path / "node.log"):
            view = await owner.wait_seated(view["id"], running=True)
            mine = Stream(owner, view, host_addresses=("127.0.0.1",))
            await mine.connect()
            await mine.wait_frames(5)
            link = await owner.share(view["id"], ttl_s=600)
            async with Broker(url, token=link["token"]) as guest:
                theirs = await watch(guest, host_addresses=("127.0.0.1",))
                await theirs.wait_frames(10)
                # the same frames: collect frame numbers from both until some coincide
                a: set[int] = set()
                b: set[int] = set()
                await until(lambda: stamps(a, mine) or stamps(b, theirs) or len(a & b) >= 3,
                            "the owner and the viewer decoded no common frame", deadline_s=20)
                assert [s["viewers"] for s in await owner.shares(view["id"])] == [1]

                # view only: the viewer's keys do not move the game
                start = player(mine)
                assert start is not None and theirs.key("ArrowRight", True)
                await mine.wait_frames(30)
                now = player(mine)
                assert now is not None and abs(now[0] - start[0]) < 5, (start, now)
                theirs.key("ArrowRight", False)

                revoked = await owner.stop_sharing(view["id"], link["id"])
                assert revoked["viewers_disconnected"] == 1
                await until(lambda: theirs.closed, "the viewer's socket stayed open")
                assert theirs.bye_reason == "share_revoked"
                with pytest.raises(ApiError) as refused:
                    await guest.watch_view()
                assert (refused.value.status, refused.value.code) == (403, "share_revoked")
                await theirs.close()
            await mine.wait_frames(30)  # the owner streams on
            await mine.close()
