"""The built-in game's mouse: the crosshair follows relative and absolute motion, stays in the play
area, a left click fires a visible shot, and the crosshair survives real encoding."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from broker.protocol import POINTER_MAX_DELTA
from streamer.desktop.game import (
    CROSSHAIR_BGR,
    CROSSHAIR_RECTS,
    PLAYER_BGR,
    SHOT_MS,
    Game,
    Rect,
    find_crosshair,
    find_player,
    stamp_height,
)
from streamer.desktop.gamesound import VOICES, SoundEvent
from streamer.desktop.inputs import InputEvent, PointerButton, PointerMove, PointerRelative, parse_input

T0_MS = 1_764_700_000_000  # a fixed epoch time: tests never read the clock


def _parsed(raw: str) -> InputEvent:
    event = parse_input(raw)
    assert not hasattr(event, "reason"), event
    return event  # type: ignore[return-value]


def _magenta(frame: np.ndarray) -> np.ndarray:
    return np.all(frame[..., :3] == np.array(CROSSHAIR_BGR, dtype=np.uint8), axis=-1)


def _inside(r: Rect, game: Game) -> bool:
    top = stamp_height(game.width)
    return r.w == 0 or (r.x >= 0 and r.x + r.w <= game.width and r.y >= top and r.y + r.h <= game.height)


def test_relative_motion_moves_the_aim_and_not_the_player() -> None:
    game = Game(640, 360)
    frame = game.render(T0_MS)
    start = game.aim_position()
    assert find_crosshair(frame) == pytest.approx((start[0] - 0.5, start[1] - 0.5), abs=1.0)
    player = game.player_position()
    assert find_player(frame) == pytest.approx(player, abs=1.0)  # drawn whole over the crosshair
    game.apply(_parsed('{"t":"pr","dx":150,"dy":-60}'))
    game.apply(PointerRelative(-10, 5))
    frame = game.render(T0_MS + 16)
    assert game.aim_position() == (start[0] + 140, start[1] - 55)
    found = find_crosshair(frame)
    assert found is not None
    assert found == pytest.approx((start[0] + 140 - 0.5, start[1] - 55 - 0.5), abs=0.6)
    assert game.player_position() == player


def test_the_aim_stays_in_the_play_area_and_off_the_strip() -> None:
    game = Game(640, 360)
    top = stamp_height(640)
    for dx, dy in ((-POINTER_MAX_DELTA, -POINTER_MAX_DELTA), (POINTER_MAX_DELTA, POINTER_MAX_DELTA),
                   (-POINTER_MAX_DELTA, POINTER_MAX_DELTA), (POINTER_MAX_DELTA, -POINTER_MAX_DELTA)):
        game.apply(PointerRelative(dx, dy))
        game.apply(PointerButton(1, True))  # the shot box must stay inside too
        scene = game.scene(T0_MS)
        assert len(scene.crosshair) == CROSSHAIR_RECTS
        assert all(_inside(r, game) for r in scene.crosshair), scene.crosshair
        frame = game.render(T0_MS + 1)
        assert not _magenta(frame[:top]).any()
        assert set(np.unique(frame[:top, :, :3])) <= {0, 255}
    # pushed into the top-right corner, then back by 10 px: the edge holds it, no stored overshoot
    game.apply(PointerRelative(POINTER_MAX_DELTA, -POINTER_MAX_DELTA))
    edge = game.aim_position()
    game.apply(PointerRelative(-10, 10))
    assert game.aim_position() == (edge[0] - 10, edge[1] + 10)


def test_absolute_pointer_puts_the_aim_there() -> None:
    game = Game(640, 360)
    game.apply(PointerMove(0.25, 0.75))
    assert game.aim_position() == (160.0, 270.0)
    game.apply(PointerMove(0.0, 0.0))  # clamped: the whole crosshair stays below the strip
    x, y = game.aim_position()
    scene = game.scene(T0_MS)
    assert all(_inside(r, game) for r in scene.crosshair)
    assert x > 0 and y > stamp_height(640)


def test_a_left_click_fires_a_visible_shot_with_a_sound() -> None:
    game = Game(640, 360)
    sounds: list[SoundEvent] = []
    game.on_sound = sounds.append
    game.apply(PointerRelative(200, 80))  # away from the player
    plain = int(_magenta(game.render(T0_MS)).sum())
    game.apply(PointerButton(3, True))  # a right click does not shoot
    assert int(_magenta(game.render(T0_MS + 10)).sum()) == plain
    game.apply(PointerButton(1, True))
    game.apply(PointerButton(1, False))
    shot = int(_magenta(game.render(T0_MS + 20)).sum())
    assert shot > plain * 1.2  # the centre box fills
    assert sounds == [SoundEvent("shot", float(T0_MS + 20))] and "shot" in VOICES
    assert game.shots == 1
    assert int(_magenta(game.render(T0_MS + 20 + SHOT_MS - 1)).sum()) == shot
    assert int(_magenta(game.render(T0_MS + 20 + SHOT_MS)).sum()) == plain
    assert find_crosshair(game.render(T0_MS + 400)) == pytest.approx(
        (game.aim_position()[0] - 0.5, game.aim_position()[1] - 0.5), abs=0.6)


def test_magenta_and_green_belong_to_the_crosshair_and_the_player_only() -> None:
    game = Game(640, 360)
    game.apply(PointerRelative(-150, 40))
    scene = game.scene(T0_MS)
    frame = game.render(T0_MS + 1)
    scene = game.scene(T0_MS + 2)
    frame = game.render(T0_MS + 2)  # the same instant as the scene: same layout
    expected = np.zeros(frame.shape[:2], dtype=bool)
    for r in scene.crosshair:
        expected[r.y : r.y + r.h, r.x : r.x + r.w] = True
    p = scene.player
    expected[p.y : p.y + p.h, p.x : p.x + p.w] = False  # the player is drawn over it
    assert (_magenta(frame) == expected).all()
    green = np.all(frame[..., :3] == np.array(PLAYER_BGR, dtype=np.uint8), axis=-1)
    assert int(green.sum()) == p.w * p.h


def test_resize_keeps_the_aim_at_the_same_relative_place() -> None:
    game = Game(640, 360)
    game.apply(PointerMove(0.75, 0.5))
    rel_x = game.aim_position()[0] / 640
    game.resize(1280, 720)
    assert game.aim_position()[0] / 1280 == pytest.approx(rel_x, abs=0.01)
    assert all(_inside(r, game) for r in game.scene(T0_MS).crosshair)


def test_the_crosshair_survives_real_encoding() -> None:
    game = Game(640, 360)
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = 640, 360, "yuv420p"
    encoder.time_base = Fraction(1, 30)
    encoder.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "30"}
    decoder = av.CodecContext.create("h264", "r")
    sources, aims = [], []
    for i in range(12):
        game.apply(PointerRelative(9, -4))
        sources.append(game.render(T0_MS + i * 33).copy())
        aims.append(game.aim_position())
    decoded: list[np.ndarray] = []
    for i, array in enumerate(sources):
        video = av.VideoFrame.from_ndarray(array, format="bgra").reformat(format="yuv420p")
        video.pts = i
        for packet in encoder.encode(video):
            decoded.extend(f.to_ndarray(format="bgr24") for f in decoder.decode(packet))
    for packet in encoder.encode(None):
        decoded.extend(f.to_ndarray(format="bgr24") for f in decoder.decode(packet))
    decoded.extend(f.to_ndarray(format="bgr24") for f in decoder.decode(None))
    assert len(decoded) == len(sources)
    for image, (ax, ay) in zip(decoded, aims, strict=True):
        found = find_crosshair(image)
        assert found is not None
        assert abs(found[0] - ax) <= 2.0 and abs(found[1] - ay) <= 2.0
