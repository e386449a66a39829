"""A built-in game-like renderer whose frames carry a machine-readable stamp.

Job: produce BGRA frames (numpy ``H x W x 4`` uint8) of a moving scene that
reacts to input, for the ``game`` pool kind, for tests and for latency probes.
``Game.scene(now_ms)`` steps the game and returns a frozen ``Scene`` (what to
draw, in pixels); a renderer draws it: ``CpuGameRenderer`` here (numpy), or
``streamer.desktop.glgame.GlGameRenderer`` (OpenGL through EGL) with the same
layout and colours.  ``Game.render(now_ms)`` is ``scene`` + the numpy renderer.
Every frame carries, in a top strip of big black/white cells, its frame number
(32 bits) and the render clock (48 bits of ms since the epoch) protected by a
CRC; ``read_stamp`` reads them back from a decoded frame (BGR, BGRA or a luma
plane such as the top of a ``yuv420p`` array).  The player is a square of a
colour nothing else in the scene uses, so ``find_player`` locates it in a
decoded frame.  When the player starts touching an enemy, ``on_sound`` (if set) gets a "hit"
``streamer.desktop.gamesound.SoundEvent`` at that frame's render clock.

The mouse aims: a crosshair (a plus sign in ``CROSSHAIR_BGR``, also a colour
nothing else uses, so ``find_crosshair`` locates it) follows relative motion
(``PointerRelative``, pointer lock: one mouse pixel is ``AIM_PX_PER_MOUSE_PX``
frame pixels) and jumps to absolute positions (``PointerMove``); it stays
inside the play area.  A left-button press fires a shot: the crosshair's
centre is filled for ``SHOT_MS`` ms and ``on_sound`` gets a "shot".

Layout (all relative to the frame *width*, so a stamp survives scaling by the
encoder ladder): ``STAMP_COLUMNS`` cells per row, square cells of
``width / STAMP_COLUMNS`` pixels (16 px at 640 wide), ``STAMP_ROWS`` rows.
Bits, row-major, MSB first: sync (8) | frame number (32) | ts_ms (48) |
crc16 (16) | tail (16).  White = 1.

Concurrency model: ``Game`` and ``CpuGameRenderer`` are plain objects owned by
one thread (the session's frame thread); ``apply``, ``scene`` and ``render``
must not run concurrently.  ``render`` returns the renderer's own buffer, which
is overwritten by the next ``render``: copy it (``av.VideoFrame.from_ndarray``
does) before rendering again.  A ``Scene`` is immutable and may go anywhere.

Invariants: ``scene`` and ``render`` never read a clock (time comes in as
``now_ms``); rendering never loops over pixels in Python and reuses its
buffers; the strip holds only pure black and white; the player colour (pure
green) and the crosshair colour (pure magenta) appear nowhere else; the scene
(player, enemies, crosshair) never overlaps the strip, so the strip is drawn
last and the draw order elsewhere is background, enemies, crosshair, player
(the player is drawn whole over the aim, so ``find_player`` is undisturbed).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from streamer.desktop.gamesound import SoundEvent
from streamer.desktop.inputs import Gamepad, InputEvent, Key, PointerButton, PointerMove, PointerRelative

STAMP_COLUMNS: Final = 40  # cells per row: 16 px cells at 640 px wide
STAMP_ROWS: Final = 3
STAMP_SYNC: Final = 0b1011_0001  # 8 bits
STAMP_TAIL: Final = 0x5AC3  # 16 bits
FRAME_NO_BITS: Final = 32
TS_BITS: Final = 48
_STAMP_BITS: Final = 8 + FRAME_NO_BITS + TS_BITS + 16 + 16  # == STAMP_COLUMNS * STAMP_ROWS

PLAYER_BGR: Final = (0, 255, 0)  # pure green: unique in the scene
ENEMY_BGR: Final = (40, 40, 220)
CROSSHAIR_BGR: Final = (255, 0, 255)  # pure magenta: unique in the scene
AIM_PX_PER_MOUSE_PX: Final = 1.0  # crosshair travel (frame px) per px of relative mouse motion
SHOT_MS: Final = 150  # how long a shot fills the crosshair's centre
CROSSHAIR_RECTS: Final = 3  # horizontal bar, vertical bar, shot box (empty when no shot shows)
PLAYER_SPEED_PER_S: Final = 0.6  # play-area heights per second at full deflection
GAMEPAD_DEADZONE: Final = 0.2  # stick travel (0..1) ignored around the centre
MAX_STEP_MS: Final = 100  # a longer gap between renders moves the player at most this much
ENEMY_COUNT: Final = 3
BACKGROUND_PERIOD_PX: Final = 128  # horizontal repeat of the scrolling background
_BACKGROUND_SPEED_PX_PER_S: Final = 96.0

Image = npt.NDArray[np.uint8]


# A BGRA pixel read as one little-endian uint32 is 0xAARRGGBB on any host.
_PIXEL_DTYPE: Final = np.dtype("<u4")


def _pixel(b: int, g: int, r: int) -> np.uint32:
    """An opaque BGRA pixel as one uint32 of ``_PIXEL_DTYPE``."""
    return np.uint32(0xFF000000 | (r << 16) | (g << 8) | b)


_PLAYER_PIXEL: Final = _pixel(*PLAYER_BGR)
_ENEMY_PIXEL: Final = _pixel(*ENEMY_BGR)
_CROSSHAIR_PIXEL: Final = _pixel(*CROSSHAIR_BGR)
_WHITE_PIXEL: Final = _pixel(255, 255, 255)
_BLACK_PIXEL: Final = _pixel(0, 0, 0)

# Directions per KeyboardEvent.code: (dx, dy) in -1..1.
_KEY_DIRECTIONS: Final = {
    "ArrowLeft": (-1, 0),
    "KeyA": (-1, 0),
    "ArrowRight": (1, 0),
    "KeyD": (1, 0),
    "ArrowUp": (0, -1),
    "KeyW": (0, -1),
    "ArrowDown": (0, 1),
    "KeyS": (0, 1),
}
# Standard gamepad mapping (W3C Gamepad API): d-pad buttons 12 up, 13 down, 14 left, 15 right.
_DPAD_UP, _DPAD_DOWN, _DPAD_LEFT, _DPAD_RIGHT = 12, 13, 14, 15


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a frame says about itself: its number and the render clock (ms since the epoch)."""

    frame_no: int
    ts_ms: int


def stamp_height(width: int) -> int:
    """Height in pixels of the stamp strip for a frame ``width`` pixels wide."""
    return round(STAMP_ROWS * width / STAMP_COLUMNS)


def _crc16(frame_no: int, ts_ms: int) -> int:
    payload = frame_no.to_bytes(4, "big") + ts_ms.to_bytes(6, "big")
    return zlib.crc32(payload) & 0xFFFF


def stamp_word(frame_no: int, ts_ms: int) -> int:
    """The stamp's bits as one ``STAMP_ROWS * STAMP_COLUMNS``-bit integer, cell (0, 0) the MSB."""
    frame_no &= (1 << FRAME_NO_BITS) - 1
    ts_ms &= (1 << TS_BITS) - 1
    word = STAMP_SYNC
    for value, bits in ((frame_no, FRAME_NO_BITS), (ts_ms, TS_BITS), (_crc16(frame_no, ts_ms), 16)):
        word = (word << bits) | value
    return (word << 16) | STAMP_TAIL


def _word_cells(word: int) -> Image:
    raw = np.frombuffer(word.to_bytes(_STAMP_BITS // 8, "big"), dtype=np.uint8)
    return (np.unpackbits(raw) * 255).astype(np.uint8).reshape(STAMP_ROWS, STAMP_COLUMNS)


def stamp_bits(frame_no: int, ts_ms: int) -> Image:
    """The ``STAMP_ROWS x STAMP_COLUMNS`` cell values (0 or 255) for one stamp."""
    return _word_cells(stamp_word(frame_no, ts_ms))


def _cell_edges(width: int) -> npt.NDArray[np.int64]:
    """Pixel edges of the cells: cell ``i`` spans ``[edges[i], edges[i + 1])``."""
    count = max(STAMP_COLUMNS, STAMP_ROWS) + 1
    return np.round(np.arange(count) * (width / STAMP_COLUMNS)).astype(np.int64)


def stamp_cell_maps(width: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Cell row of every pixel row of the strip, and cell column of every pixel column.

    Both renderers draw cells through these maps, so their cell edges agree to the pixel.
    """
    edges = _cell_edges(width)
    cols = np.searchsorted(edges[1 : STAMP_COLUMNS + 1], np.arange(width), side="right")
    rows = np.searchsorted(edges[1 : STAMP_ROWS + 1], np.arange(stamp_height(width)), side="right")
    return rows.astype(np.intp), cols.astype(np.intp)


def read_stamp(image: npt.NDArray[np.generic]) -> Stamp | None:
    """Read the stamp from a decoded frame; None if there is none or it is damaged.

    ``image`` is ``H x W x 3|4`` (BGR/BGRA/RGB: the cells are grey so channel
    order does not matter) or ``H' x W`` whose top ``stamp_height(W)`` rows are
    luma (a grey image, or ``VideoFrame.to_ndarray()`` of a ``yuv420p`` frame).
    Each cell is judged by the mean of its central half, so blurred edges and
    ringing from lossy compression do not flip bits.
    """
    if image.ndim not in (2, 3) or image.shape[1] < STAMP_COLUMNS:
        return None
    width = int(image.shape[1])
    strip_h = stamp_height(width)
    if image.shape[0] < strip_h:
        return None
    edges = _cell_edges(width)
    bits = np.empty(_STAMP_BITS, dtype=np.uint8)
    for row in range(STAMP_ROWS):
        y0, y1 = int(edges[row]), int(edges[row + 1])
        qy = (y1 - y0) // 4
        for col in range(STAMP_COLUMNS):
            x0, x1 = int(edges[col]), int(edges[col + 1])
            qx = (x1 - x0) // 4
            cell = image[y0 + qy : y1 - qy, x0 + qx : x1 - qx]
            if cell.ndim == 3:
                cell = cell[..., :3]
            bits[row * STAMP_COLUMNS + col] = cell.mean() >= 128.0
    word = int.from_bytes(np.packbits(bits).tobytes(), "big")
    tail = word & 0xFFFF
    crc = (word >> 16) & 0xFFFF
    ts_ms = (word >> 32) & ((1 << TS_BITS) - 1)
    frame_no = (word >> (32 + TS_BITS)) & ((1 << FRAME_NO_BITS) - 1)
    sync = word >> (32 + TS_BITS + FRAME_NO_BITS)
    if sync != STAMP_SYNC or tail != STAMP_TAIL or crc != _crc16(frame_no, ts_ms):
        return None
    return Stamp(frame_no=frame_no, ts_ms=ts_ms)


def find_player(image: npt.NDArray[np.uint8]) -> tuple[float, float] | None:
    """Centre (x, y) in pixels of the player square in a decoded BGR/BGRA frame, or None.

    Matches strongly green pixels (G high, B and R low), which survive 4:2:0
    chroma subsampling well enough at the player's size.
    """
    if image.ndim != 3 or image.shape[2] < 3:
        return None
    b, g, r = image[..., 0], image[..., 1], image[..., 2]
    mask = (g > 160) & (b < 110) & (r < 110)
    ys, xs = np.nonzero(mask)
    if len(xs) < 16:  # fewer pixels than a 4x4 square: noise, not the player
        return None
    return float(xs.mean()), float(ys.mean())


def find_crosshair(image: npt.NDArray[np.uint8]) -> tuple[float, float] | None:
    """Centre (x, y) in pixels of the crosshair in a decoded BGR/BGRA frame, or None.

    Matches strongly magenta pixels (B and R high, G low), then takes the columns of the
    vertical bar and the rows of the horizontal bar (those holding at least 40 % of the
    busiest one's pixels), weighted by their pixels.  The player is drawn over the crosshair
    and may hide part of an arm; the bars' own columns and rows still dominate, so a player
    over one arm does not pull the centre towards the other.
    """
    if image.ndim != 3 or image.shape[2] < 3:
        return None
    b, g, r = image[..., 0], image[..., 1], image[..., 2]
    mask = (b > 150) & (r > 150) & (g < 110)
    if int(mask.sum()) < 16:
        return None

    def centre(counts: npt.NDArray[np.int64]) -> float:
        index = np.nonzero(counts >= 0.4 * counts.max())[0]
        weights = counts[index]
        return float((index * weights).sum() / weights.sum())

    return centre(mask.sum(axis=0)), centre(mask.sum(axis=1))


def make_background(width: int, height: int) -> npt.NDArray[np.uint32]:
    """Dark, low-saturation diagonal bands (no green dominance, no pure black or white).

    ``height x width`` opaque BGRA pixels as ``_PIXEL_DTYPE`` words; a frame shows the
    window starting ``Scene.background_offset`` columns in, so renderers build it
    ``BACKGROUND_PERIOD_PX`` wider than the frame.
    """
    x = np.arange(width, dtype=np.float32)[None, :]
    y = np.arange(height, dtype=np.float32)[:, None]
    phase = (x + y) * (2.0 * math.pi / BACKGROUND_PERIOD_PX)
    wave = 0.5 + 0.5 * np.sin(phase)  # 0..1
    shade = 0.35 + 0.65 * (y / max(height - 1, 1))  # darker at the top
    tex = np.empty((height, width, 4), dtype=np.uint8)
    tex[..., 0] = (60 + 60 * wave * shade).astype(np.uint8)  # blue 60..120
    tex[..., 1] = (40 + 25 * wave).astype(np.uint8)  # green 40..65
    tex[..., 2] = (35 + 35 * shade).astype(np.uint8)  # red 35..70
    tex[..., 3] = 255
    return tex.view(_PIXEL_DTYPE).reshape(height, width)


def check_frame_size(width: int, height: int) -> None:
    """Raise ``ValueError`` unless a ``width x height`` frame holds the stamp strip and a play area."""
    if width < STAMP_COLUMNS or height <= stamp_height(width) + 16:
        raise ValueError(f"frame {width}x{height} too small for the stamp strip and a play area")


@dataclass(frozen=True, slots=True)
class Rect:
    """An axis-aligned box in frame pixels: columns ``[x, x + w)``, rows ``[y, y + h)`` (row 0 on top)."""

    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True, slots=True)
class Scene:
    """Everything a renderer needs to draw one frame, in pixels of a ``width x height`` frame.

    Rows count from the top.  The strip covers rows ``[0, stamp_height(width))``;
    below it, pixel ``(x, y)`` of the background is column ``x + background_offset``,
    row ``y - stamp_height(width)`` of ``make_background(width + BACKGROUND_PERIOD_PX,
    height - stamp_height(width))``; enemies are drawn over it in ``ENEMY_BGR``, the
    ``crosshair`` rectangles over them in ``CROSSHAIR_BGR``, the player over all in ``PLAYER_BGR``.
    """

    width: int
    height: int
    frame_no: int  # what the stamp says (32 bits)
    ts_ms: int  # the render clock, ms since the epoch (the stamp keeps 48 bits)
    background_offset: int  # px, 0 <= offset < BACKGROUND_PERIOD_PX
    enemies: tuple[Rect, ...]
    player: Rect
    stamp: int  # stamp_word(frame_no, ts_ms): cell (row, col) is bit 119 - (row * STAMP_COLUMNS + col)
    # CROSSHAIR_RECTS boxes: horizontal bar, vertical bar, shot box (w = h = 0 when no shot shows)
    crosshair: tuple[Rect, ...] = ()

    @property
    def play_top(self) -> int:
        """First row below the stamp strip."""
        return stamp_height(self.width)


def _overlap(a: Rect, b: Rect) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


class GameRenderer(Protocol):
    """Draws ``Scene``s into BGRA frames; owned by one thread at a time (see each implementation)."""

    @property
    def renderer_string(self) -> str: ...  # what draws: "numpy", or OpenGL's GL_RENDERER

    @property
    def size(self) -> tuple[int, int]: ...  # (width, height) of the frames it draws

    def render(self, scene: Scene) -> Image: ...  # H x W x 4 BGRA, its own buffer, valid until the next call

    def resize(self, width: int, height: int) -> None: ...

    def close(self) -> None: ...


class CpuGameRenderer:
    """The numpy renderer: whole-pixel uint32 stores into one reused buffer."""

    renderer_string = "numpy"

    def __init__(self, width: int, height: int) -> None:
        self.resize(width, height)

    @property
    def size(self) -> tuple[int, int]:
        return self._width, self._height

    def resize(self, width: int, height: int) -> None:
        """Reallocate the buffers for ``width x height`` frames."""
        check_frame_size(width, height)
        self._width, self._height = width, height
        self._buf: Image = np.empty((height, width, 4), dtype=np.uint8)
        # One uint32 per BGRA pixel: a whole-pixel fill is one store, not four.
        self._pixels: npt.NDArray[np.uint32] = self._buf.view(_PIXEL_DTYPE).reshape(height, width)
        self._rows, self._cols = stamp_cell_maps(width)
        self._background = make_background(width + BACKGROUND_PERIOD_PX, height - stamp_height(width))

    def render(self, scene: Scene) -> Image:
        """Draw ``scene``; returns this renderer's ``H x W x 4`` BGRA buffer, valid until the next call."""
        if (scene.width, scene.height) != (self._width, self._height):
            raise ValueError(f"scene is {scene.width}x{scene.height}, renderer {self._width}x{self._height}")
        pixels, top, off = self._pixels, scene.play_top, scene.background_offset
        pixels[top:] = self._background[:, off : off + self._width]
        for e in scene.enemies:
            pixels[e.y : e.y + e.h, e.x : e.x + e.w] = _ENEMY_PIXEL
        for c in scene.crosshair:
            pixels[c.y : c.y + c.h, c.x : c.x + c.w] = _CROSSHAIR_PIXEL
        p = scene.player
        pixels[p.y : p.y + p.h, p.x : p.x + p.w] = _PLAYER_PIXEL
        cells = np.where(_word_cells(scene.stamp) != 0, _WHITE_PIXEL, _BLACK_PIXEL)
        pixels[:top] = cells[self._rows[:, None], self._cols[None, :]]
        return self._buf

    def close(self) -> None:
        """Nothing to release (numpy buffers); kept for the ``GameRenderer`` interface."""


class Game:
    """The scene: scrolling background, moving red enemies, a green player, a stamp strip.

    ``scene(now_ms)`` advances the player by the time since the previous step
    (capped at ``MAX_STEP_MS``) and describes frame ``frame_no``; ``render(now_ms)``
    does that and draws it with the numpy renderer (made on first use).
    """

    def __init__(self, width: int, height: int) -> None:
        self._keys_held: set[str] = set()
        self._pads: dict[int, tuple[float, float]] = {}  # pad index -> (x, y) deflection
        self._frame_no = 0
        self._last_ms: int | None = None
        self._cpu: CpuGameRenderer | None = None
        self._touching: frozenset[int] = frozenset()  # enemies the player overlaps now
        self._shot_pending = False  # a left press since the last scene
        self._shot_until_ms: int | None = None  # render clock until which the shot box shows
        self.shots = 0  # left presses taken
        # Called (on the frame thread) with each sound the game makes: a "hit" when the player starts
        # touching an enemy.  None: silent.
        self.on_sound: Callable[[SoundEvent], None] | None = None
        self._setup(width, height)
        self._px = (width - self._player_side) / 2.0  # top-left corner, pixels
        self._py = self._play_top + (self._play_h - self._player_side) / 2.0
        self._aim_x, self._aim_y = width / 2.0, self._play_top + self._play_h / 2.0  # crosshair centre

    def _setup(self, width: int, height: int) -> None:
        check_frame_size(width, height)
        self._width = width
        self._height = height
        self._play_top = stamp_height(width)
        self._play_h = height - self._play_top
        self._player_side = max(16, self._play_h // 10)
        self._enemy_side = max(12, self._play_h // 14)
        self._arm = self._player_side  # crosshair half-length: reaches past the player's sides
        self._bar = max(2, self._player_side // 10)  # half thickness
        self._shot_half = max(2 * self._bar, self._arm // 3)

    @property
    def width(self) -> int:
        return self._width

    @property
    def height(self) -> int:
        return self._height

    @property
    def frame_no(self) -> int:
        """The number the next ``scene``/``render`` stamps."""
        return self._frame_no

    def resize(self, width: int, height: int) -> None:
        """Change the frame size, keeping the player at the same relative position."""
        rel_x = self._px / max(self._width - self._player_side, 1)
        rel_y = (self._py - self._play_top) / max(self._play_h - self._player_side, 1)
        aim_x, aim_y = self._aim_x / self._width, (self._aim_y - self._play_top) / self._play_h
        self._setup(width, height)
        self._px = rel_x * (width - self._player_side)
        self._py = self._play_top + rel_y * (self._play_h - self._player_side)
        self._aim_to(aim_x * width, self._play_top + aim_y * self._play_h)

    def _aim_to(self, x: float, y: float) -> None:
        """Put the crosshair centre at ``(x, y)``, clamped so the whole crosshair stays in the play area."""
        arm = self._arm
        self._aim_x = min(max(x, float(arm)), float(self._width - arm))
        self._aim_y = min(max(y, float(self._play_top + arm)), float(self._height - arm))

    def aim_position(self) -> tuple[float, float]:
        """Centre (x, y) of the crosshair in pixels of this game's frame."""
        return self._aim_x, self._aim_y

    def apply(self, event: InputEvent) -> None:
        """Take one validated input event; events that do not steer the game are ignored."""
        if isinstance(event, PointerRelative):
            self._aim_to(self._aim_x + event.dx * AIM_PX_PER_MOUSE_PX, self._aim_y + event.dy * AIM_PX_PER_MOUSE_PX)
        elif isinstance(event, PointerMove):
            self._aim_to(event.x * self._width, event.y * self._height)
        elif isinstance(event, PointerButton):
            if event.button == 1 and event.down:
                self._shot_pending = True
                self.shots += 1
        elif isinstance(event, Key):
            if event.code in _KEY_DIRECTIONS:
                if event.down:
                    self._keys_held.add(event.code)
                else:
                    self._keys_held.discard(event.code)
        elif isinstance(event, Gamepad):
            ax = event.axes[0] if len(event.axes) > 0 else 0.0
            ay = event.axes[1] if len(event.axes) > 1 else 0.0
            ax = ax if abs(ax) >= GAMEPAD_DEADZONE else 0.0
            ay = ay if abs(ay) >= GAMEPAD_DEADZONE else 0.0
            bt = event.buttons
            if len(bt) > _DPAD_RIGHT:
                ax += bt[_DPAD_RIGHT] - bt[_DPAD_LEFT]
                ay += bt[_DPAD_DOWN] - bt[_DPAD_UP]
            self._pads[event.index] = (ax, ay)

    def release_all(self) -> None:
        """Forget held keys and pad deflections (the viewer left or lost focus)."""
        self._keys_held.clear()
        self._pads.clear()

    def _direction(self) -> tuple[float, float]:
        dx = float(sum(_KEY_DIRECTIONS[c][0] for c in self._keys_held))
        dy = float(sum(_KEY_DIRECTIONS[c][1] for c in self._keys_held))
        for px, py in self._pads.values():
            dx += px
            dy += py
        return max(-1.0, min(1.0, dx)), max(-1.0, min(1.0, dy))

    def player_position(self) -> tuple[float, float]:
        """Centre (x, y) of the player square in pixels of this game's frame."""
        half = self._player_side / 2.0
        return self._px + half, self._py + half

    def _step(self, now_ms: int) -> None:
        step_ms = 0 if self._last_ms is None else min(max(now_ms - self._last_ms, 0), MAX_STEP_MS)
        self._last_ms = now_ms
        dx, dy = self._direction()
        speed = PLAYER_SPEED_PER_S * self._play_h * step_ms / 1000.0  # pixels this step
        side = self._player_side
        self._px = min(max(self._px + dx * speed, 0.0), float(self._width - side))
        self._py = min(max(self._py + dy * speed, float(self._play_top)), float(self._height - side))

    def scene(self, now_ms: int) -> Scene:
        """Advance to ``now_ms`` (ms since the epoch) and describe the next frame (``frame_no`` moves on)."""
        self._step(now_ms)
        top, w = self._play_top, self._width
        # Enemies: red squares on fixed Lissajous paths, a function of the clock only.
        side = self._enemy_side
        t = now_ms / 1000.0
        enemies = []
        for i in range(ENEMY_COUNT):
            ex = int((0.5 + 0.45 * math.sin(t * (0.7 + 0.3 * i) + i * 2.1)) * (w - side))
            ey = top + int((0.5 + 0.45 * math.cos(t * (0.5 + 0.2 * i) + i)) * (self._play_h - side))
            enemies.append(Rect(ex, ey, side, side))
        ps = self._player_side
        player = Rect(round(self._px), round(self._py), ps, ps)
        touching = frozenset(i for i, e in enumerate(enemies) if _overlap(player, e))
        if self.on_sound is not None:
            for _ in touching - self._touching:
                self.on_sound(SoundEvent("hit", float(now_ms)))
        self._touching = touching
        if self._shot_pending:
            self._shot_pending = False
            self._shot_until_ms = now_ms + SHOT_MS
            if self.on_sound is not None:
                self.on_sound(SoundEvent("shot", float(now_ms)))
        scene = Scene(
            width=w,
            height=self._height,
            frame_no=self._frame_no,
            ts_ms=now_ms,
            background_offset=int(now_ms * _BACKGROUND_SPEED_PX_PER_S / 1000.0) % BACKGROUND_PERIOD_PX,
            enemies=tuple(enemies),
            player=player,
            stamp=stamp_word(self._frame_no, now_ms),
            crosshair=self._crosshair(now_ms),
        )
        self._frame_no = (self._frame_no + 1) & ((1 << FRAME_NO_BITS) - 1)
        return scene

    def _crosshair(self, now_ms: int) -> tuple[Rect, ...]:
        cx, cy, arm, bar = round(self._aim_x), round(self._aim_y), self._arm, self._bar
        shot = Rect(0, 0, 0, 0)
        if self._shot_until_ms is not None and now_ms < self._shot_until_ms:
            half = self._shot_half
            shot = Rect(cx - half, cy - half, 2 * half, 2 * half)
        return Rect(cx - arm, cy - bar, 2 * arm, 2 * bar), Rect(cx - bar, cy - arm, 2 * bar, 2 * arm), shot

    def render(self, now_ms: int) -> Image:
        """Advance to ``now_ms`` (ms since the epoch) and draw the next frame with the numpy renderer.

        Returns the renderer's own ``H x W x 4`` BGRA buffer, valid until the next call.
        """
        scene = self.scene(now_ms)
        if self._cpu is None:
            self._cpu = CpuGameRenderer(self._width, self._height)
        elif self._cpu.size != (self._width, self._height):
            self._cpu.resize(self._width, self._height)
        return self._cpu.render(scene)
