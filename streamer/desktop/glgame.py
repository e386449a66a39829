"""The built-in game drawn by OpenGL on a chosen EGL device (a GPU, or Mesa's llvmpipe on the CPU).

Job: ``GlGameRenderer`` draws a ``streamer.desktop.game.Scene`` with one
fragment shader into an offscreen RGBA8 texture on EGL device
``device_index`` (``EGL_EXT_device_enumeration`` order, through moderngl's
``egl`` backend: no display, no X) and reads it back as the same ``H x W x 4``
BGRA array, in the same layout and colours, as the numpy renderer, so
``read_stamp`` and ``find_player`` work on it.  ``probe_gl`` tries a device
and says what GL runs there (``GL_RENDERER``) or why nothing does.

How the frame is laid out: the shader writes (B, G, R, A) into the texture's
(R, G, B, A) channels, so the texture's bytes already are BGRA (no swizzle on
the host); ``gl_FragCoord`` row 0 is treated as the *top* row, so
``glReadPixels`` returns rows top first (no flip copy).  The background comes
from ``game.make_background`` (uploaded once per size) and the stamp cells from
``game.stamp_cell_maps``, both read with ``texelFetch``: GL frames equal numpy
frames pixel for pixel (measured on llvmpipe: mean absolute difference 0).

Device memory: ``draw(scene)`` renders without reading back; the frame stays
in ``texture`` (a ``moderngl.Texture``; ``texture_id`` is its GL name, RGBA8
holding BGRA bytes, row 0 on top) until the next ``draw``/``render``.  A
device-memory encoder (CUDA-GL interop: ``cudaGraphicsGLRegisterImage`` on
``texture_id``, then map per frame) must do its GL-side calls inside
``with renderer.bound():`` (any thread: it holds the renderer's lock with the
context current, so never during a draw).

Concurrency model: EGL lets a context be current on one thread at a time, and
a GL call reaches only the context current on the calling thread.  This
renderer never leaves its context current: each public call takes the
renderer's lock, makes the context current on the calling thread, works, and
releases it (``eglMakeCurrent(EGL_NO_CONTEXT)``) before returning.  So calls
are serialized and may come from different threads one after the other (the
session's frame thread ``rb-frames-<id>`` renders; ``close`` comes from an
``asyncio.to_thread`` worker after the frame thread has stopped).  The cost
is two ``eglMakeCurrent`` per call (2 µs the pair on Mesa), nothing next to a frame.

Invariants: the calling thread has no GL context of its own current (entering
replaces it, leaving unbinds it); every method after ``close`` raises
``RuntimeError`` except ``close`` (idempotent); ``render`` returns the
renderer's own buffer, overwritten by the next call; construction failures
are ``GlUnavailableError`` with the reason; ``probe_gl`` never raises.
moderngl is imported on first use, so this module imports without it.

glcontext reads ``GLCONTEXT_DEVICE_INDEX`` from the environment and lets it
*override* ``device_index``: leave it unset on render nodes (``renderer_string``
shows which device answered).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, cast

import numpy as np

from streamer.desktop.game import (
    BACKGROUND_PERIOD_PX,
    CROSSHAIR_BGR,
    CROSSHAIR_RECTS,
    ENEMY_BGR,
    ENEMY_COUNT,
    PLAYER_BGR,
    STAMP_COLUMNS,
    STAMP_ROWS,
    Game,
    Image,
    Rect,
    Scene,
    check_frame_size,
    make_background,
    read_stamp,
    stamp_cell_maps,
    stamp_height,
)

if TYPE_CHECKING:
    import moderngl

log = logging.getLogger(__name__)

GL_VERSION_REQUIRED: Final = 330  # OpenGL 3.3 core: texelFetch, integer textures, gl_VertexID
PROBE_SIZE: Final = (160, 96)  # px: the smallest frame that has a strip (12 px) and a play area
_PROBE_TS_MS: Final = 1_764_700_000_000
_STAMP_WORDS: Final = 4  # uvec4: 128 bits hold the STAMP_ROWS * STAMP_COLUMNS = 120 stamp bits

_VERTEX_SHADER: Final = """
#version 330 core
// One triangle that covers the viewport: (-1,-1), (3,-1), (-1,3). No vertex buffer.
void main() {
    vec2 v = vec2(float((gl_VertexID & 1) << 2) - 1.0, float((gl_VertexID & 2) << 1) - 1.0);
    gl_Position = vec4(v, 0.0, 1.0);
}
"""

_FRAGMENT_SHADER: Final = f"""
#version 330 core
uniform sampler2D background;  // BGRA bytes in RGBA8: (width + {BACKGROUND_PERIOD_PX}) x play height
uniform usampler2D cell_col;   // width x 1: stamp cell column of each pixel column
uniform usampler2D cell_row;   // strip height x 1: stamp cell row of each pixel row
uniform uvec4 stamp;           // the stamp word, stamp[0] = its least significant 32 bits
uniform int play_top;          // first row below the strip
uniform int bg_offset;         // px
uniform ivec4 enemies[{ENEMY_COUNT}];     // x, y, w, h (rows from the top)
uniform ivec4 crosshair[{CROSSHAIR_RECTS}];  // x, y, w, h; w = h = 0 draws nothing
uniform ivec4 player;
out vec4 color;                // written as (B, G, R, A): the texture's bytes are BGRA

const vec4 ENEMY = vec4({ENEMY_BGR[0]}.0, {ENEMY_BGR[1]}.0, {ENEMY_BGR[2]}.0, 255.0) / 255.0;
const vec4 CROSSHAIR = vec4({CROSSHAIR_BGR[0]}.0, {CROSSHAIR_BGR[1]}.0, {CROSSHAIR_BGR[2]}.0, 255.0) / 255.0;
const vec4 PLAYER = vec4({PLAYER_BGR[0]}.0, {PLAYER_BGR[1]}.0, {PLAYER_BGR[2]}.0, 255.0) / 255.0;

bool inside(ivec2 p, ivec4 r) {{
    return all(greaterThanEqual(p, r.xy)) && all(lessThan(p, r.xy + r.zw));
}}

void main() {{
    ivec2 p = ivec2(gl_FragCoord.xy);  // row 0 is the top row: read back in order, no flip
    if (p.y < play_top) {{
        int col = int(texelFetch(cell_col, ivec2(p.x, 0), 0).r);
        int row = int(texelFetch(cell_row, ivec2(p.y, 0), 0).r);
        int bit = {STAMP_ROWS * STAMP_COLUMNS - 1} - (row * {STAMP_COLUMNS} + col);  // cell (0, 0) is the MSB
        float white = float((stamp[bit >> 5] >> uint(bit & 31)) & 1u);
        color = vec4(white, white, white, 1.0);
        return;
    }}
    color = texelFetch(background, ivec2(p.x + bg_offset, p.y - play_top), 0);
    for (int i = 0; i < {ENEMY_COUNT}; ++i) {{
        if (inside(p, enemies[i])) color = ENEMY;
    }}
    for (int i = 0; i < {CROSSHAIR_RECTS}; ++i) {{
        if (inside(p, crosshair[i])) color = CROSSHAIR;
    }}
    if (inside(p, player)) color = PLAYER;
}}
"""


class GlUnavailableError(Exception):
    """OpenGL through EGL cannot run here (no moderngl, no libEGL, no such device, GL too old)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _rect(r: Rect) -> tuple[int, int, int, int]:
    return r.x, r.y, r.w, r.h


class GlGameRenderer:
    """Draws ``Scene``s on EGL device ``device_index`` (None: the first) into BGRA numpy frames.

    Construction creates the context and all GL objects (about 20-100 ms on
    llvmpipe); raises ``GlUnavailableError`` with the reason when EGL or the
    device is missing.  Call ``close`` when done: the context lives until then.
    """

    def __init__(self, width: int, height: int, device_index: int | None = None) -> None:
        check_frame_size(width, height)  # a ValueError, before any EGL work
        self._lock = threading.Lock()
        self._device_index = device_index
        self._ctx = _create_context(device_index)
        self._closed = False
        try:
            with self._ctx:  # leaves the context current nowhere (see the module docstring)
                self._renderer_string = str(self._ctx.info["GL_RENDERER"])
                self._program = self._ctx.program(vertex_shader=_VERTEX_SHADER, fragment_shader=_FRAGMENT_SHADER)
                self._vao = self._ctx.vertex_array(self._program, [])
                self._uniform("background").value = 0  # texture units, as _draw_locked binds them
                self._uniform("cell_col").value = 1
                self._uniform("cell_row").value = 2
                self._u_stamp, self._u_offset = self._uniform("stamp"), self._uniform("bg_offset")
                self._u_enemies, self._u_player = self._uniform("enemies"), self._uniform("player")
                self._u_crosshair = self._uniform("crosshair")
                self._sized: list[moderngl.Texture | moderngl.Framebuffer] = []
                self._allocate(width, height)
        except Exception as exc:
            self._ctx.release()
            raise GlUnavailableError(f"GL setup failed on {self._renderer_label()}: {exc}") from exc

    # --- public API -------------------------------------------------------------------------------

    @property
    def renderer_string(self) -> str:
        """``GL_RENDERER`` of the device drawing, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"."""
        return self._renderer_string

    @property
    def device_index(self) -> int | None:
        return self._device_index

    @property
    def size(self) -> tuple[int, int]:
        return self._width, self._height

    @property
    def texture(self) -> moderngl.Texture:
        """The frame of the last ``draw``/``render``, on the device (RGBA8 holding BGRA, row 0 on top)."""
        self._check_open()
        return self._color

    @property
    def texture_id(self) -> int:
        """GL name of ``texture`` (for interop); it changes on ``resize``."""
        return int(self.texture.glo)

    @contextmanager
    def bound(self) -> Iterator[moderngl.Context]:
        """Hold the renderer's lock with its context current on this thread (for interop calls)."""
        with self._lock:
            self._check_open()
            with self._ctx:
                yield self._ctx

    def draw(self, scene: Scene) -> moderngl.Texture:
        """Draw ``scene`` into ``texture`` and return it; nothing is read back to the host."""
        with self._lock:
            self._check_open()
            with self._ctx:
                self._draw_locked(scene)
                self._ctx.finish()  # the frame is complete when this returns, whoever reads it next
        return self._color

    def render(self, scene: Scene) -> Image:
        """Draw ``scene`` and read it back: this renderer's ``H x W x 4`` BGRA buffer, valid until the next call."""
        with self._lock:
            self._check_open()
            with self._ctx:
                self._draw_locked(scene)
                self._fbo.read_into(self._buf, components=4, alignment=1)  # waits for the draw
        return self._buf

    def resize(self, width: int, height: int) -> None:
        """Reallocate the target, the readback buffer and the size-bound textures for ``width x height``."""
        with self._lock:
            self._check_open()
            with self._ctx:
                self._allocate(width, height)

    def close(self) -> None:
        """Release every GL object and the context.  Idempotent; any thread (not during another call)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with self._ctx:
                for obj in self._sized:
                    obj.release()
                self._vao.release()
                self._program.release()
            self._ctx.release()

    # --- internals (the lock is held and the context current) ------------------------------------

    def _renderer_label(self) -> str:
        return f"EGL device {'0 (default)' if self._device_index is None else self._device_index}"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("GL game renderer closed")

    def _uniform(self, name: str) -> moderngl.Uniform:
        import moderngl

        member = self._program[name]
        if not isinstance(member, moderngl.Uniform):
            raise TypeError(f"{name} is not a uniform of the game shader")
        return member

    def _allocate(self, width: int, height: int) -> None:
        import moderngl

        check_frame_size(width, height)
        strip_h = stamp_height(width)
        for obj in self._sized:
            obj.release()
        ctx = self._ctx
        self._width, self._height = width, height
        self._buf: Image = np.empty((height, width, 4), dtype=np.uint8)
        self._color = ctx.texture((width, height), 4, dtype="f1")
        self._fbo = ctx.framebuffer(color_attachments=[self._color])
        background = make_background(width + BACKGROUND_PERIOD_PX, height - strip_h)
        bg_tex = ctx.texture((background.shape[1], background.shape[0]), 4, background.tobytes(), dtype="f1")
        rows, cols = stamp_cell_maps(width)
        col_tex = ctx.texture((width, 1), 1, cols.astype(np.uint8).tobytes(), dtype="u1")
        row_tex = ctx.texture((strip_h, 1), 1, rows.astype(np.uint8).tobytes(), dtype="u1")
        for tex in (bg_tex, col_tex, row_tex):
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)  # integer textures are incomplete otherwise
        self._bg_tex, self._col_tex, self._row_tex = bg_tex, col_tex, row_tex
        self._sized = [self._fbo, self._color, bg_tex, col_tex, row_tex]
        self._uniform("play_top").value = strip_h

    def _draw_locked(self, scene: Scene) -> None:
        if (scene.width, scene.height) != (self._width, self._height):
            raise ValueError(f"scene is {scene.width}x{scene.height}, renderer {self._width}x{self._height}")
        if len(scene.enemies) != ENEMY_COUNT:
            raise ValueError(f"the shader draws {ENEMY_COUNT} enemies, the scene has {len(scene.enemies)}")
        words = tuple((scene.stamp >> (32 * i)) & 0xFFFF_FFFF for i in range(_STAMP_WORDS))
        self._u_stamp.value = words
        self._u_offset.value = scene.background_offset
        self._u_enemies.value = [_rect(e) for e in scene.enemies]
        self._u_player.value = _rect(scene.player)
        if len(scene.crosshair) > CROSSHAIR_RECTS:
            raise ValueError(f"the shader draws {CROSSHAIR_RECTS} crosshair boxes, not {len(scene.crosshair)}")
        boxes = [_rect(c) for c in scene.crosshair]
        self._u_crosshair.value = boxes + [(0, 0, 0, 0)] * (CROSSHAIR_RECTS - len(boxes))  # w = h = 0: nothing
        self._bg_tex.use(0)
        self._col_tex.use(1)
        self._row_tex.use(2)
        self._fbo.use()
        self._vao.render(vertices=3)


def _create_context(device_index: int | None) -> moderngl.Context:
    """A standalone GL 3.3 core context on EGL device ``device_index``, current on this thread."""
    label = f"EGL device {'0 (default)' if device_index is None else device_index}"
    try:
        import moderngl
    except ImportError as exc:
        raise GlUnavailableError(f"moderngl is not installed: {exc}") from exc
    settings: dict[str, Any] = {"backend": "egl", "require": GL_VERSION_REQUIRED}
    if device_index is not None:
        if device_index < 0:
            raise GlUnavailableError(f"EGL device index must be >= 0, got {device_index}")
        settings["device_index"] = device_index
    try:
        # The stub types **settings as dicts; the egl backend takes plain values.
        return cast(Any, moderngl).create_standalone_context(**settings)  # type: ignore[no-any-return]
    except Exception as exc:  # glcontext raises bare Exception ("libEGL.so not loaded", "requested device ...")
        reason = str(exc) or type(exc).__name__
        hint = ""
        if "not loaded" in reason or "not found" in reason:
            hint = " (needs libEGL with EGL_EXT_device_enumeration: Debian libegl1 + libegl-mesa0, or NVIDIA's EGL)"
        raise GlUnavailableError(f"no OpenGL on {label}: {reason}{hint}") from exc


def probe_gl(device_index: int | None = None) -> tuple[bool, str]:
    """Draw one small frame on ``device_index`` and read its stamp back.

    Returns ``(True, GL_RENDERER)`` or ``(False, reason)``; never raises.
    Blocking (tens of ms): call it from a worker thread.
    """
    try:
        renderer = GlGameRenderer(*PROBE_SIZE, device_index=device_index)
    except GlUnavailableError as exc:
        return False, exc.reason
    except Exception as exc:  # boundary: a doctor check must answer, not crash
        log.debug("GL probe failed on device %s", device_index, exc_info=True)
        return False, f"GL probe failed: {exc!r}"
    try:
        scene = Game(*PROBE_SIZE).scene(_PROBE_TS_MS)
        frame = renderer.render(scene)
        stamp = read_stamp(frame)
        if stamp is None or (stamp.frame_no, stamp.ts_ms) != (scene.frame_no, scene.ts_ms):
            return False, f"{renderer.renderer_string}: the drawn frame's stamp reads {stamp}, not the scene's"
        return True, renderer.renderer_string
    except Exception as exc:  # boundary, as above
        log.debug("GL probe draw failed on device %s", device_index, exc_info=True)
        return False, f"GL draw failed on {renderer.renderer_string}: {exc!r}"
    finally:
        try:
            renderer.close()
        except Exception:
            log.debug("GL probe: close failed", exc_info=True)
