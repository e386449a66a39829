"""``render-broker play`` headless (SDL's dummy video driver) against a real broker and render node.

In process: SDL key, relative-mouse and joystick events posted to the window's queue become
input messages, and the built-in game's player moves in the decoded frames (keyboard right,
joystick axis down); F8 toggles the stats overlay without sending anything.  As a command: a
guest queues behind another session (the queue position is printed), is seated when that one
ends, draws frames, prints its stats and ends its session on exit, freeing the seat.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pygame = pytest.importorskip("pygame", reason="pygame is not installed: pip install 'render-broker[play]'")

from rbclient import Broker, start  # noqa: E402
from rbclient.play import Player  # noqa: E402
from streamer.desktop.game import find_crosshair, find_player  # noqa: E402
from tests.rbclient.sysfix import broker, game_pool, node, seats_used  # noqa: E402
from tests.streamer.viewer import until  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
W, H = 640, 360
SCAN_RIGHT = 79  # SDL scancode (USB HID) of the right arrow


def aim(player: Player) -> tuple[float, float] | None:
    frame = player.stream.latest
    return None if frame is None else find_crosshair(np.asarray(frame.image.to_ndarray(format="bgr24")))


def where(player: Player) -> tuple[float, float] | None:
    frame = player.stream.latest
    return None if frame is None else find_player(np.asarray(frame.image.to_ndarray(format="bgr24")))


async def test_window_turns_sdl_events_into_input_the_game_obeys(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    async with broker(redis_url, prefix, tmp_path) as url, Broker(url) as client, \
            node(url, "game", "node-play", tmp_path / "node.log"):
        await game_pool(url)
        await client.sign_in_guest()
        stream = await start(client, "game", width=W, height=H, fps=30, host_addresses=("127.0.0.1",))
        pygame.display.init()
        pygame.font.init()
        try:
            screen = pygame.display.set_mode((W, H))
            player = Player(stream, screen)
            running = asyncio.create_task(player.run())
            await until(lambda: player.drawn >= 10, "the window drew fewer than 10 frames", deadline_s=30)
            start_at = where(player)
            assert start_at is not None

            pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=pygame.K_RIGHT, scancode=SCAN_RIGHT, mod=0,
                                                 unicode=""))
            await until(lambda: (p := where(player)) is not None and p[0] > start_at[0] + 20,
                        "the player did not move right on the right arrow key")
            pygame.event.post(pygame.event.Event(pygame.KEYUP, key=pygame.K_RIGHT, scancode=SCAN_RIGHT, mod=0))
            await until(lambda: player.sent["k"] == 2, f"key messages sent: {player.sent}")

            start_at = where(player)
            assert start_at is not None
            pygame.event.post(pygame.event.Event(pygame.JOYAXISMOTION, instance_id=0, joy=0, axis=1, value=1.0))
            await until(lambda: (p := where(player)) is not None and p[1] > start_at[1] + 20,
                        "the player did not move down on joystick axis 1")
            pygame.event.post(pygame.event.Event(pygame.JOYAXISMOTION, instance_id=0, joy=0, axis=1, value=0.0))
            await until(lambda: player.sent["gp"] == 2, f"gamepad messages sent: {player.sent}")

            # a click grabs the pointer; motion is then relative ("pr", mouse pixels): the game's crosshair follows
            pygame.event.post(pygame.event.Event(pygame.MOUSEBUTTONDOWN, button=1, pos=(10, 10)))
            pygame.event.post(pygame.event.Event(pygame.MOUSEBUTTONUP, button=1, pos=(10, 10)))
            await until(lambda: player.grabbed and player.sent["pb"] == 2, f"no grab or buttons: {player.sent}")
            await until(lambda: aim(player) is not None, "no crosshair in the picture")
            aim0 = aim(player)
            assert aim0 is not None
            pygame.event.post(pygame.event.Event(pygame.MOUSEMOTION, pos=(10, 10), rel=(64, 0), buttons=(0, 0, 0)))
            await until(lambda: player.sent["pr"] == 1, f"no relative motion sent: {player.sent}")
            await until(lambda: (a := aim(player)) is not None and a[0] > aim0[0] + 40,
                        "the crosshair did not follow the relative motion")
            assert player.sent["pm"] == 0  # nothing absolute while grabbed

            sent_before = sum(player.sent.values())
            pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=pygame.K_F8, scancode=65, mod=0, unicode=""))
            await until(lambda: player.show_stats, "F8 did not show the overlay")
            drawn = player.drawn
            await until(lambda: player.drawn > drawn + 3, "no frames drawn with the overlay")
            assert sum(player.sent.values()) == sent_before  # F8 is the client's own key

            def overlay() -> list[str]:
                return player.overlay_lines(stream.latest.at_ms if stream.latest else 0)

            # a second of frames for the rates, the node's stats message for its figures
            await until(lambda: all(not line.endswith(" -") for line in overlay()), f"overlay: {overlay()}")
            lines = overlay()
            assert any(line.startswith("Frame rate") and line.endswith(" fps") for line in lines), lines
            assert any(line.startswith("Glass to glass") and line.endswith(" ms") for line in lines), lines
            pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=pygame.K_F10, scancode=67, mod=0, unicode=""))
            await asyncio.wait_for(running, 10)
        finally:
            pygame.quit()
            ended = await stream.end()
        assert ended["end_reason"] == "user"


async def test_play_command_queues_streams_and_ends_its_session(redis_url: str, prefix: str, tmp_path: Path) -> None:
    async with broker(redis_url, prefix, tmp_path) as url, Broker(url) as other, \
            node(url, "game", "node-play-cli", tmp_path / "node.log"):
        await game_pool(url)
        await other.sign_in_guest()
        blocker = await other.create_session("game", width=320, height=180)
        await other.wait_seated(blocker["id"])
        env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy"}
        env.pop("RENDER_BROKER_TOKEN", None)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker", "play", "--broker", url, "--pool", "game", "--width", "320",
            "--height", "180", "--fps", "30", "--host-address", "127.0.0.1", "--frames", "20", "--stats",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            async with asyncio.timeout(60):
                while not any(line.startswith("queued: position 1") for line in lines):
                    raw = await proc.stdout.readline()
                    assert raw, f"play exited early: {lines}"
                    lines.append(raw.decode().strip())
                await other.end_session(blocker["id"])
                rest, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        lines += rest.decode().splitlines()
        text = "\n".join(lines)
        assert proc.returncode == 0, text
        assert lines[0].startswith("signed in as guest guest-"), text
        assert "starting on node-play-cli" in text or "running on node-play-cli" in text, text
        assert "frames " in text and "session ended (user)" in text, text
        assert await seats_used(url) == 0
