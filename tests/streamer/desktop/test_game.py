"""The built-in game: stamps survive real lossy encoding, the player follows input."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from streamer.desktop.game import (
    PLAYER_BGR,
    STAMP_COLUMNS,
    Game,
    Stamp,
    find_player,
    read_stamp,
    stamp_bits,
    stamp_height,
)
from streamer.desktop.inputs import Gamepad, InputEvent, Key, PointerMove, parse_input

T0_MS = 1_764_700_000_000  # a fixed epoch time: tests never read the clock


def _event(raw: str) -> InputEvent:
    event = parse_input(raw)
    assert not hasattr(event, "reason"), event
    return event  # type: ignore[return-value]


def _key(code: str, down: bool) -> InputEvent:
    return _event(f'{{"t":"k","c":"{code}","d":{"true" if down else "false"}}}')


def test_render_shape_dtype_and_stamp() -> None:
    game = Game(640, 360)
    frame = game.render(T0_MS)
    assert frame.shape == (360, 640, 4)
    assert frame.dtype == np.uint8
    assert (frame[..., 3] == 255).all()
    assert read_stamp(frame) == Stamp(frame_no=0, ts_ms=T0_MS)
    assert read_stamp(game.render(T0_MS + 16)) == Stamp(frame_no=1, ts_ms=T0_MS + 16)
    assert game.frame_no == 2


def test_strip_is_pure_black_and_white_with_16px_cells_at_640() -> None:
    frame = Game(640, 360).render(T0_MS)
    strip = frame[: stamp_height(640), :, :3]
    assert set(np.unique(strip)) <= {0, 255}
    assert 640 // STAMP_COLUMNS == 16


def test_stamp_bits_layout() -> None:
    bits = stamp_bits(0xDEADBEEF, 2**48 - 1)
    assert bits.shape == (3, STAMP_COLUMNS)
    assert set(np.unique(bits)) == {0, 255}


@pytest.mark.parametrize("frame_no", [0, 1, 0x7FFFFFFF, 0xFFFFFFFF])
def test_stamp_extremes_round_trip(frame_no: int) -> None:
    game = Game(640, 360)
    game._frame_no = frame_no  # reach the edges without rendering 4 billion frames
    ts = 2**48 - 1
    assert read_stamp(game.render(ts)) == Stamp(frame_no=frame_no, ts_ms=ts)
    assert game.frame_no == (frame_no + 1) & 0xFFFFFFFF


def test_read_stamp_rejects_non_stamps() -> None:
    rng = np.random.default_rng(1)
    assert read_stamp(rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)) is None
    assert read_stamp(np.zeros((360, 640, 3), np.uint8)) is None
    assert read_stamp(np.full((360, 640, 3), 255, np.uint8)) is None
    assert read_stamp(np.zeros((10, 640, 3), np.uint8)) is None  # shorter than the strip
    assert read_stamp(np.zeros((360, 20, 3), np.uint8)) is None  # narrower than the cells


def test_read_stamp_rejects_a_flipped_bit() -> None:
    frame = Game(640, 360).render(T0_MS).copy()
    frame[20:28, 20 * 16 + 4 : 20 * 16 + 12, :3] ^= 255  # invert the middle of cell 20 of row 1
    assert read_stamp(frame) is None


def test_read_stamp_accepts_luma_planes() -> None:
    frame = Game(1280, 720).render(T0_MS)
    video = av.VideoFrame.from_ndarray(frame, format="bgra").reformat(format="yuv420p")
    planar = video.to_ndarray()  # (H * 3 / 2) x W, luma first
    assert read_stamp(planar) == Stamp(0, T0_MS)


def test_stamp_survives_downscaling() -> None:
    # The layout is relative to the width, so the bitrate ladder's smaller rungs stay readable.
    frame = Game(1920, 1080).render(T0_MS)
    small = av.VideoFrame.from_ndarray(frame, format="bgra").reformat(640, 360, format="bgr24").to_ndarray()
    assert read_stamp(small) == Stamp(0, T0_MS)


def _encode_decode(frames: list[np.ndarray], codec: str, width: int, height: int) -> list[np.ndarray]:
    encoder = av.CodecContext.create(codec, "w")
    encoder.width, encoder.height = width, height
    encoder.pix_fmt = "yuv420p"
    encoder.time_base = Fraction(1, 30)
    encoder.bit_rate = 500_000  # a low rate for 640x360: lossy on purpose
    if codec == "libx264":
        encoder.options = {"preset": "ultrafast", "tune": "zerolatency"}
    else:
        encoder.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
    decoder = av.CodecContext.create("h264" if codec == "libx264" else "vp8", "r")
    out: list[np.ndarray] = []
    packets: list[av.Packet] = []
    for i, array in enumerate(frames):
        video = av.VideoFrame.from_ndarray(array, format="bgra").reformat(format="yuv420p")
        video.pts = i
        packets.extend(encoder.encode(video))
    packets.extend(encoder.encode(None))
    for packet in packets:
        out.extend(f.to_ndarray(format="bgr24") for f in decoder.decode(packet))
    out.extend(f.to_ndarray(format="bgr24") for f in decoder.decode(None))
    return out


@pytest.mark.parametrize("codec", ["libx264", "libvpx"])
def test_stamp_and_player_survive_real_encoding(codec: str) -> None:
    game = Game(640, 360)
    game.apply(_key("ArrowRight", True))
    sources, positions = [], []
    for i in range(30):
        sources.append(game.render(T0_MS + i * 33).copy())
        positions.append(game.player_position())
    decoded = _encode_decode(sources, codec, 640, 360)
    assert len(decoded) == len(sources)
    stamps = [read_stamp(d) for d in decoded]
    assert stamps == [Stamp(i, T0_MS + i * 33) for i in range(30)]
    for image, (px, py) in zip(decoded, positions, strict=True):
        found = find_player(image)
        assert found is not None
        assert abs(found[0] - px) <= 2.0 and abs(found[1] - py) <= 2.0


def test_player_moves_with_arrow_keys_and_stops_on_release() -> None:
    game = Game(640, 360)
    game.render(T0_MS)
    x0, y0 = game.player_position()
    game.apply(_key("ArrowRight", True))
    game.render(T0_MS + 50)
    x1, y1 = game.player_position()
    assert x1 > x0 and y1 == y0
    game.apply(_key("ArrowRight", False))
    game.render(T0_MS + 100)
    assert game.player_position() == (x1, y1)
    game.apply(_key("KeyW", True))  # WASD too
    game.render(T0_MS + 150)
    assert game.player_position()[1] < y1


def test_player_is_found_where_the_game_says() -> None:
    game = Game(640, 360)
    game.apply(_key("ArrowLeft", True))
    game.apply(_key("ArrowUp", True))
    game.render(T0_MS)
    frame = game.render(T0_MS + 80)
    assert find_player(frame) == pytest.approx(game.player_position(), abs=0.6)
    assert tuple(frame[int(game.player_position()[1]), int(game.player_position()[0]), :3]) == PLAYER_BGR


def test_player_stays_inside_the_play_area() -> None:
    game = Game(640, 360)
    game.apply(_key("ArrowUp", True))
    game.apply(_key("ArrowLeft", True))
    for i in range(100):  # 10 s of holding: far more than the screen
        game.render(T0_MS + i * 100)
    x, y = game.player_position()
    half = game._player_side / 2
    assert x == half
    assert y == stamp_height(640) + half
    assert read_stamp(game.render(T0_MS + 10_100)) == Stamp(100, T0_MS + 10_100)  # strip intact


def test_long_gap_moves_at_most_one_step() -> None:
    game = Game(640, 360)
    game.render(T0_MS)
    x0, _ = game.player_position()
    game.apply(_key("KeyD", True))
    game.render(T0_MS + 60_000)  # a minute-long stall moves it like 100 ms
    x1, _ = game.player_position()
    game.render(T0_MS + 60_100)
    assert game.player_position()[0] - x1 == pytest.approx(x1 - x0)


def test_gamepad_axes_and_deadzone() -> None:
    game = Game(640, 360)
    game.render(T0_MS)
    x0, y0 = game.player_position()
    game.apply(Gamepad(0, (0.1, -0.1), ()))  # inside the dead zone
    game.render(T0_MS + 50)
    assert game.player_position() == (x0, y0)
    game.apply(Gamepad(0, (1.0, 1.0), ()))
    game.render(T0_MS + 100)
    x1, y1 = game.player_position()
    assert x1 > x0 and y1 > y0
    game.release_all()
    game.render(T0_MS + 150)
    assert game.player_position() == (x1, y1)


def test_gamepad_dpad_buttons() -> None:
    game = Game(640, 360)
    game.render(T0_MS)
    x0, _ = game.player_position()
    buttons = [0.0] * 17
    buttons[14] = 1.0  # d-pad left
    game.apply(Gamepad(1, (), tuple(buttons)))
    game.render(T0_MS + 50)
    assert game.player_position()[0] < x0


def test_unrelated_events_are_ignored() -> None:
    game = Game(640, 360)
    game.render(T0_MS)
    before = game.player_position()
    game.apply(PointerMove(0.9, 0.9))
    game.apply(Key("KeyQ", 0x71, True))
    game.render(T0_MS + 50)
    assert game.player_position() == before


def test_resize_keeps_relative_position_and_stamp() -> None:
    game = Game(640, 360)
    game.render(T0_MS)
    game.resize(1280, 720)
    frame = game.render(T0_MS + 10)
    assert frame.shape == (720, 1280, 4)
    assert read_stamp(frame) == Stamp(1, T0_MS + 10)
    assert game.player_position() == pytest.approx((640, 720 / 2 + stamp_height(1280) / 2), abs=1)


def test_too_small_is_refused() -> None:
    with pytest.raises(ValueError):
        Game(32, 32)
