"""The OpenGL game renderer (EGL; Mesa's llvmpipe where there is no GPU) draws what the numpy renderer draws.

Where EGL cannot run, every GL test skips with ``probe_gl``'s reason; the
tests that need no GL (scene/renderer split, the errors) run everywhere.
Measured on llvmpipe (Mesa 22.3.6): GL frames equal numpy frames exactly (mean
and max absolute difference 0); the thresholds below leave room for a driver
that rounds differently, not for a different picture.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from streamer.desktop.capture import CaptureError, GameCapture, GameRendererUnavailable
from streamer.desktop.game import (
    PLAYER_BGR,
    CpuGameRenderer,
    Game,
    Stamp,
    find_crosshair,
    find_player,
    read_stamp,
    stamp_height,
)
from streamer.desktop.glgame import GlGameRenderer, GlUnavailableError, probe_gl
from streamer.desktop.inputs import InputEvent, PointerButton, PointerRelative, parse_input

T0_MS = 1_764_700_000_000  # a fixed epoch time: tests never read the clock
MAX_MEAN_ABS_DIFF = 0.5  # per channel, 0..255: measured 0.0 on llvmpipe
NO_SUCH_DEVICE = 99  # an EGL device index no machine here has


@pytest.fixture(scope="module")
def gl_device() -> int | None:
    """The EGL device the GL tests draw on (the first), or a skip with the probe's reason."""
    ok, info = probe_gl(None)
    if not ok:
        pytest.skip(f"no OpenGL through EGL here: {info}")
    return None


MakeGl = Callable[[int, int], GlGameRenderer]


@pytest.fixture
def make_gl(gl_device: int | None) -> Iterator[MakeGl]:
    """Makes GL renderers on the test device and closes them after the test."""
    made: list[GlGameRenderer] = []

    def make(width: int, height: int) -> GlGameRenderer:
        made.append(GlGameRenderer(width, height, device_index=gl_device))
        return made[-1]

    yield make
    for renderer in made:
        renderer.close()


def _key(code: str, down: bool) -> InputEvent:
    event = parse_input(f'{{"t":"k","c":"{code}","d":{"true" if down else "false"}}}')
    assert not hasattr(event, "reason"), event
    return event  # type: ignore[return-value]


# --- no GL needed ---------------------------------------------------------------------------------


def test_game_render_is_its_scene_drawn_by_the_numpy_renderer() -> None:
    a, b = Game(640, 360), Game(640, 360)
    cpu = CpuGameRenderer(640, 360)
    for game in (a, b):
        game.apply(_key("ArrowRight", True))
    for i in range(5):
        scene = b.scene(T0_MS + i * 33)
        assert (scene.frame_no, scene.ts_ms) == (i, T0_MS + i * 33)
        assert (a.render(T0_MS + i * 33) == cpu.render(scene)).all()
    assert a.player_position() == b.player_position()


def test_a_frame_too_small_is_a_value_error_before_any_egl_work() -> None:
    with pytest.raises(ValueError):
        GlGameRenderer(30, 20, device_index=NO_SUCH_DEVICE)


def test_a_missing_device_is_a_reason_not_a_crash() -> None:
    ok, reason = probe_gl(NO_SUCH_DEVICE)
    assert not ok and reason
    with pytest.raises(GlUnavailableError) as caught:
        GlGameRenderer(640, 360, device_index=NO_SUCH_DEVICE)
    assert caught.value.reason


def test_game_capture_says_why_gl_cannot_start_and_does_not_retry_per_frame() -> None:
    cap = GameCapture(Game(640, 360), clock_ms=lambda: T0_MS, renderer="gl", gl_device=NO_SUCH_DEVICE)
    with pytest.raises(GameRendererUnavailable) as first:
        cap.grab()
    assert isinstance(first.value, CaptureError) and first.value.reason
    with pytest.raises(GameRendererUnavailable) as second:
        cap.prepare()
    assert second.value.reason == first.value.reason
    assert cap.renderer_string is None
    cap.close()


def test_game_capture_rejects_an_unknown_renderer() -> None:
    with pytest.raises(ValueError):
        GameCapture(Game(640, 360), clock_ms=lambda: T0_MS, renderer="vulkan")  # type: ignore[arg-type]


# --- GL -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("width", "height"), [(640, 360), (854, 480), (1280, 720)])
def test_gl_frames_match_numpy_frames_of_the_same_scene(make_gl: MakeGl, width: int, height: int) -> None:
    # 854 px: cells 21.35 px wide, so the cell edges round; both renderers must round alike.
    game = Game(width, height)
    game.apply(_key("ArrowLeft", True))
    cpu, gl = CpuGameRenderer(width, height), make_gl(width, height)
    assert gl.size == (width, height) and gl.renderer_string
    for i in range(6):
        scene = game.scene(T0_MS + i * 40)
        want = cpu.render(scene)
        got = gl.render(scene)
        assert got.shape == (height, width, 4) and got.dtype == np.uint8
        assert read_stamp(got) == Stamp(frame_no=i, ts_ms=T0_MS + i * 40) == read_stamp(want)
        assert np.abs(got.astype(np.int16) - want).mean() < MAX_MEAN_ABS_DIFF
        assert (got[..., 3] == 255).all()
        assert set(np.unique(got[: stamp_height(width), :, :3])) <= {0, 255}
        found = find_player(got)
        assert found is not None
        assert found == pytest.approx(game.player_position(), abs=1.0)


def test_gl_player_follows_input_like_the_numpy_one(make_gl: MakeGl) -> None:
    game = Game(640, 360)
    cpu, gl = CpuGameRenderer(640, 360), make_gl(640, 360)
    gl.render(game.scene(T0_MS))
    x0, y0 = find_player(gl.render(game.scene(T0_MS + 16))) or (0.0, 0.0)
    game.apply(_key("ArrowRight", True))
    scene = game.scene(T0_MS + 66)
    x1, y1 = find_player(gl.render(scene)) or (0.0, 0.0)
    assert x1 > x0 and y1 == y0
    assert (x1, y1) == find_player(cpu.render(scene))
    game.apply(_key("ArrowRight", False))
    game.apply(_key("KeyW", True))
    scene = game.scene(T0_MS + 116)
    x2, y2 = find_player(gl.render(scene)) or (0.0, 0.0)
    assert x2 == x1 and y2 < y1
    assert (x2, y2) == find_player(cpu.render(scene))
    frame = gl.render(game.scene(T0_MS + 166))
    cx, cy = game.player_position()
    assert tuple(frame[int(cy), int(cx), :3]) == PLAYER_BGR


def test_gl_draws_the_crosshair_and_the_shot_like_the_numpy_one(make_gl: MakeGl) -> None:
    game = Game(640, 360)
    cpu, gl = CpuGameRenderer(640, 360), make_gl(640, 360)
    for i, event in enumerate((PointerRelative(0, 0), PointerRelative(120, -70), PointerButton(1, True))):
        game.apply(event)
        scene = game.scene(T0_MS + i * 20)
        want, got = cpu.render(scene).copy(), gl.render(scene)
        assert (got == want).all()  # pixel for pixel, crosshair and shot box included
        found = find_crosshair(got)
        assert found is not None
        assert found == pytest.approx((game.aim_position()[0] - 0.5, game.aim_position()[1] - 0.5), abs=0.6)
    assert scene.crosshair[2].w > 0  # the last frame showed the shot


def test_gl_resize(make_gl: MakeGl) -> None:
    game = Game(640, 360)
    gl = make_gl(640, 360)
    old_id = gl.texture_id
    gl.render(game.scene(T0_MS))
    game.resize(320, 180)
    with pytest.raises(ValueError):
        gl.render(game.scene(T0_MS + 16))  # the renderer is still 640x360
    gl.resize(320, 180)
    assert gl.size == (320, 180) and gl.texture_id != old_id
    scene = game.scene(T0_MS + 33)
    frame = gl.render(scene)
    assert frame.shape == (180, 320, 4)
    assert read_stamp(frame) == Stamp(scene.frame_no, scene.ts_ms)
    assert (frame == CpuGameRenderer(320, 180).render(scene)).mean() > 0.99


def test_gl_draw_keeps_the_frame_on_the_device(make_gl: MakeGl) -> None:
    game = Game(640, 360)
    gl = make_gl(640, 360)
    scene = game.scene(T0_MS)
    texture = gl.draw(scene)
    assert texture is gl.texture and gl.texture_id > 0
    with gl.bound():  # what an interop consumer does: its GL calls with the context current
        pixels = np.frombuffer(texture.read(), dtype=np.uint8).reshape(360, 640, 4)
    assert read_stamp(pixels) == Stamp(0, T0_MS)  # texture row 0 is the top row, bytes are BGRA
    assert (pixels == CpuGameRenderer(640, 360).render(scene)).mean() > 0.99


def test_gl_renderer_moves_between_threads_and_closes_once(gl_device: int | None) -> None:
    # Made here, drawn on a "frame thread", closed on a third thread, as a session does.
    gl = GlGameRenderer(640, 360, device_index=gl_device)
    game = Game(640, 360)
    stamps: list[Stamp | None] = []
    worker = threading.Thread(target=lambda: stamps.append(read_stamp(gl.render(game.scene(T0_MS)))))
    worker.start()
    worker.join(timeout=30)
    assert stamps == [Stamp(0, T0_MS)]
    assert read_stamp(gl.render(game.scene(T0_MS + 16))) == Stamp(1, T0_MS + 16)  # and back here
    closer = threading.Thread(target=gl.close)
    closer.start()
    closer.join(timeout=30)
    gl.close()  # idempotent
    with pytest.raises(RuntimeError):
        gl.render(game.scene(T0_MS + 33))


def test_game_capture_with_gl_yields_stamped_frames(gl_device: int | None) -> None:
    now = [T0_MS]
    cap = GameCapture(Game(640, 360), clock_ms=lambda: now[0], renderer="gl", gl_device=gl_device)
    assert cap.backend == "game-gl" and cap.renderer_string is None  # nothing made before the first grab
    frames = []

    def frame_thread() -> None:
        for _ in range(3):
            frames.append(cap.grab())
            now[0] += 33

    worker = threading.Thread(target=frame_thread, name="rb-frames-test")
    worker.start()
    worker.join(timeout=30)
    assert len(frames) == 3
    assert cap.renderer_string
    for i, frame in enumerate(frames):
        assert frame.format.name == "bgra" and (frame.width, frame.height) == (640, 360)
        assert frame.pts == (T0_MS + i * 33) * 1000
        assert read_stamp(frame.to_ndarray()) == Stamp(i, T0_MS + i * 33)  # copies: later frames moved on
    assert cap.stats().frames == 3 and cap.stats().backend == "game-gl"
    cap.close()  # on another thread than the one that made the renderer
    with pytest.raises(CaptureError):
        cap.grab()
