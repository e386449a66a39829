"""Parse and validate the viewer's input messages (data channel ``input``).

Job: turn one raw data-channel message (``str`` or ``bytes`` of JSON, see
``broker.protocol.InputType`` for the wire format) into one frozen event value,
or into an ``InputError`` that says why the message was dropped.  It also owns
the map from browser ``KeyboardEvent.code`` values to X keysyms, so that an
unknown key is rejected here, once, rather than deep in the injector.

Concurrency model: pure functions and immutable values; ``InputCounters`` is a
plain per-session object mutated by its one owner (the session's data-channel
handler), never shared between threads.

Invariants:
- ``parse_input`` never raises: every malformed, unknown or out-of-range message
  becomes an ``InputError`` with a stable ``DropReason``.
- Accepted values are within the protocol's limits (coordinates 0..1, relative
  motion integers within POINTER_MAX_DELTA, buttons 1..POINTER_MAX_BUTTON,
  |wheel| <= WHEEL_MAX_NOTCHES, ...); numbers are finite; booleans are JSON
  booleans, never 0/1.
- Unknown extra fields are ignored (adding a field is a compatible change).
- The keysym values are X11's own numbers (``X11/keysymdef.h``); they are
  written out here so this module imports no X library.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import ClassVar, Final

from broker.protocol import (
    CLIPBOARD_MAX_CHARS,
    GAMEPAD_MAX_AXES,
    GAMEPAD_MAX_BUTTONS,
    GAMEPAD_MAX_INDEX,
    POINTER_MAX_BUTTON,
    POINTER_MAX_DELTA,
    TEXT_MAX_CHARS,
    VIEWER_STATS_MAX_SAMPLES,
    WHEEL_MAX_NOTCHES,
    InputType,
)

# A clipboard message is the largest: JSON may escape one character as a
# surrogate pair ``\\ud83d\\ude00`` (12 bytes), plus a little framing.
INPUT_MAX_BYTES: Final = 12 * CLIPBOARD_MAX_CHARS + 256
# Viewport limits for ``rs`` (pixels); 8K UHD is the largest a seat may ask for.
RESIZE_MIN_PX: Final = 64
RESIZE_MAX_WIDTH_PX: Final = 7680
RESIZE_MAX_HEIGHT_PX: Final = 4320
# Ping ids are the client's counter (probe ids the node's); 2**53 keeps them exact in JavaScript.
PING_MAX_ID: Final = 2**53 - 1
# The longest KeyboardEvent.code we accept before looking it up.
KEY_CODE_MAX_CHARS: Final = 32


class DropReason(StrEnum):
    """Why a message was dropped; stable strings for counters and logs."""

    TOO_LARGE = "too_large"  # over INPUT_MAX_BYTES before parsing
    NOT_JSON = "not_json"  # not UTF-8, not JSON, or NaN/Infinity
    NOT_OBJECT = "not_object"  # JSON, but not an object
    UNKNOWN_TYPE = "unknown_type"  # missing or unknown "t"
    MISSING_FIELD = "missing_field"
    BAD_FIELD_TYPE = "bad_field_type"  # e.g. a string where a number belongs
    OUT_OF_RANGE = "out_of_range"  # a number or a length past the protocol limit
    UNKNOWN_KEY = "unknown_key"  # a KeyboardEvent.code with no keysym here
    BAD_TEXT = "bad_text"  # "tx" text that is empty or holds a control character or a lone surrogate


# --- events -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PointerMove:
    """Absolute pointer position relative to the video: 0..1 on both axes."""

    TYPE: ClassVar[InputType] = InputType.POINTER_MOVE
    x: float
    y: float


@dataclass(frozen=True, slots=True)
class PointerRelative:
    """Relative pointer motion (pointer lock) in the viewer's mouse pixels: +dx right, +dy down.

    Integers, each within -POINTER_MAX_DELTA..POINTER_MAX_DELTA.
    """

    TYPE: ClassVar[InputType] = InputType.POINTER_RELATIVE
    dx: int
    dy: int


@dataclass(frozen=True, slots=True)
class PointerButton:
    """Button ``b`` = browser ``MouseEvent.button`` + 1: 1 left, 2 middle, 3 right, 4 back, 5 forward."""

    TYPE: ClassVar[InputType] = InputType.POINTER_BUTTON
    button: int
    down: bool


@dataclass(frozen=True, slots=True)
class Wheel:
    """Scroll in notches (fractions allowed for trackpads); +dy scrolls down, +dx right."""

    TYPE: ClassVar[InputType] = InputType.WHEEL
    dx: float
    dy: float


@dataclass(frozen=True, slots=True)
class Key:
    """A physical key (``KeyboardEvent.code``) and its unshifted X keysym."""

    TYPE: ClassVar[InputType] = InputType.KEY
    code: str
    keysym: int
    down: bool


@dataclass(frozen=True, slots=True)
class Gamepad:
    """Full state of pad ``index``: axes in -1..1, buttons in 0..1 (analog triggers)."""

    TYPE: ClassVar[InputType] = InputType.GAMEPAD
    index: int
    axes: tuple[float, ...]
    buttons: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Clipboard:
    """Text the viewer pasted, at most CLIPBOARD_MAX_CHARS characters."""

    TYPE: ClassVar[InputType] = InputType.CLIPBOARD
    text: str


@dataclass(frozen=True, slots=True)
class Text:
    """Characters to type as characters (not keys): 1..TEXT_MAX_CHARS printable code points."""

    TYPE: ClassVar[InputType] = InputType.TEXT
    text: str


@dataclass(frozen=True, slots=True)
class Resize:
    """The viewer's viewport in pixels; the runtime decides whether to follow it."""

    TYPE: ClassVar[InputType] = InputType.RESIZE
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Latency probe: the node answers with ``pong`` echoing ``id`` and ``ts``."""

    TYPE: ClassVar[InputType] = InputType.PING
    id: int
    ts_ms: float  # the client's clock, echoed untouched


@dataclass(frozen=True, slots=True)
class ProbeAck:
    """The viewer's answer to the node's ``probe``: ``rx`` video RTP packets received, read at ``rx_ms``.

    ``rx_ms`` is the viewer's own monotonic clock: only differences between two acks mean
    anything (the node's bitrate control turns them into the viewer's receive rate).
    ``frames_decoded`` (wire ``fd``, optional): video frames decoded by then, so the node can
    tell a picture frozen on a lost packet while packets still arrive.
    """

    TYPE: ClassVar[InputType] = InputType.PROBE_ACK
    id: int
    rx_packets: int
    rx_ms: float
    frames_decoded: int | None = None


@dataclass(frozen=True, slots=True)
class ViewerStats:
    """The viewer's own measurements since its last ``vs``: ``glass_ms`` (wire ``g2g``) are glass-to-glass
    latencies in ms, finite numbers, at most ``VIEWER_STATS_MAX_SAMPLES``.  Their range is not judged here:
    ``streamer.media.glass`` ignores the implausible ones (clocks of two machines may disagree)."""

    TYPE: ClassVar[InputType] = InputType.VIEWER_STATS
    glass_ms: tuple[float, ...]


InputEvent = (
    PointerMove | PointerRelative | PointerButton | Wheel | Key | Gamepad | Clipboard | Text | Resize | Ping | ProbeAck
    | ViewerStats
)


@dataclass(frozen=True, slots=True)
class InputError:
    """A dropped message: ``reason`` for counters, ``detail`` for a debug log line."""

    reason: DropReason
    detail: str


# --- keyboard map -------------------------------------------------------------------


def _build_keysyms() -> dict[str, int]:
    keysyms: dict[str, int] = {}
    for i in range(26):  # KeyA..KeyZ -> XK_a..XK_z (lowercase: the unshifted keysym)
        keysyms[f"Key{chr(ord('A') + i)}"] = 0x61 + i
    for i in range(10):  # Digit0..Digit9 -> XK_0..XK_9
        keysyms[f"Digit{i}"] = 0x30 + i
    for i in range(12):  # F1..F12 -> XK_F1 (0xffbe)..XK_F12
        keysyms[f"F{i + 1}"] = 0xFFBE + i
    keysyms.update(
        {
            "Enter": 0xFF0D,  # XK_Return
            "NumpadEnter": 0xFF8D,  # XK_KP_Enter
            "Space": 0x20,  # XK_space
            "Backspace": 0xFF08,
            "Tab": 0xFF09,
            "Escape": 0xFF1B,
            "Delete": 0xFFFF,
            "Insert": 0xFF63,
            "Home": 0xFF50,
            "End": 0xFF57,
            "PageUp": 0xFF55,  # XK_Prior
            "PageDown": 0xFF56,  # XK_Next
            "ArrowLeft": 0xFF51,
            "ArrowUp": 0xFF52,
            "ArrowRight": 0xFF53,
            "ArrowDown": 0xFF54,
            "ShiftLeft": 0xFFE1,
            "ShiftRight": 0xFFE2,
            "ControlLeft": 0xFFE3,
            "ControlRight": 0xFFE4,
            "CapsLock": 0xFFE5,
            "AltLeft": 0xFFE9,  # XK_Alt_L
            "AltRight": 0xFFEA,  # XK_Alt_R (ISO_Level3_Shift on some layouts)
            "MetaLeft": 0xFFEB,  # XK_Super_L
            "MetaRight": 0xFFEC,  # XK_Super_R
            "ContextMenu": 0xFF67,  # XK_Menu
            "Minus": 0x2D,
            "Equal": 0x3D,
            "BracketLeft": 0x5B,
            "BracketRight": 0x5D,
            "Backslash": 0x5C,
            "Semicolon": 0x3B,
            "Quote": 0x27,  # XK_apostrophe
            "Backquote": 0x60,  # XK_grave
            "Comma": 0x2C,
            "Period": 0x2E,
            "Slash": 0x2F,
        }
    )
    return keysyms


# Read-only view: module state stays immutable.
KEYSYMS: Final[Mapping[str, int]] = MappingProxyType(_build_keysyms())


def keysym_for_code(code: str) -> int | None:
    """The X keysym for a browser ``KeyboardEvent.code``, or None if this map has none."""
    return KEYSYMS.get(code)


# --- parsing ------------------------------------------------------------------------


class _Drop(Exception):
    """Internal: raised by the field readers, turned into an InputError at the boundary."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def _field(msg: dict[str, object], name: str) -> object:
    if name not in msg:
        raise _Drop(DropReason.MISSING_FIELD, f"missing {name!r}")
    return msg[name]


def _number(msg: dict[str, object], name: str, lo: float, hi: float) -> float:
    return _check_number(_field(msg, name), name, lo, hi)


def _check_number(value: object, name: str, lo: float, hi: float) -> float:
    # bool is an int subclass: true/false are not numbers on this wire.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Drop(DropReason.BAD_FIELD_TYPE, f"{name!r} must be a number")
    number = float(value)
    # json parses 1e400 as inf without asking parse_constant: reject it here.
    if not (math.isfinite(number) and lo <= number <= hi):
        raise _Drop(DropReason.OUT_OF_RANGE, f"{name!r}={value!r} not in {lo}..{hi}")
    return number


def _integer(msg: dict[str, object], name: str, lo: int, hi: int) -> int:
    value = _field(msg, name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JavaScript has no int type: 3.0 is 3
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Drop(DropReason.BAD_FIELD_TYPE, f"{name!r} must be an integer")
    if not (lo <= value <= hi):
        raise _Drop(DropReason.OUT_OF_RANGE, f"{name!r}={value} not in {lo}..{hi}")
    return value


def _boolean(msg: dict[str, object], name: str) -> bool:
    value = _field(msg, name)
    if not isinstance(value, bool):
        raise _Drop(DropReason.BAD_FIELD_TYPE, f"{name!r} must be true or false")
    return value


def _string(msg: dict[str, object], name: str, max_chars: int) -> str:
    value = _field(msg, name)
    if not isinstance(value, str):
        raise _Drop(DropReason.BAD_FIELD_TYPE, f"{name!r} must be a string")
    if len(value) > max_chars:
        raise _Drop(DropReason.OUT_OF_RANGE, f"{name!r} longer than {max_chars} characters")
    return value


def _text(msg: dict[str, object], name: str) -> str:
    text = _string(msg, name, TEXT_MAX_CHARS)
    if not text:
        raise _Drop(DropReason.BAD_TEXT, f"{name!r} is empty")
    for char in text:
        # Cc (controls: keys such as Enter or Tab go as "k"), Cs (a lone surrogate JSON let through)
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise _Drop(DropReason.BAD_TEXT, f"{name!r} holds U+{ord(char):04X}, not a printable character")
    return text


def _number_list(msg: dict[str, object], name: str, max_len: int, lo: float, hi: float) -> tuple[float, ...]:
    value = _field(msg, name)
    if not isinstance(value, list):
        raise _Drop(DropReason.BAD_FIELD_TYPE, f"{name!r} must be a list")
    if len(value) > max_len:
        raise _Drop(DropReason.OUT_OF_RANGE, f"{name!r} has more than {max_len} items")
    return tuple(_check_number(item, name, lo, hi) for item in value)


def _parse_object(msg: dict[str, object]) -> InputEvent:
    kind = msg.get("t")
    try:
        input_type = InputType(kind) if isinstance(kind, str) else None
    except ValueError:
        input_type = None
    if input_type is None:
        raise _Drop(DropReason.UNKNOWN_TYPE, f"unknown type {kind!r}"[:80])
    match input_type:
        case InputType.POINTER_MOVE:
            return PointerMove(x=_number(msg, "x", 0.0, 1.0), y=_number(msg, "y", 0.0, 1.0))
        case InputType.POINTER_RELATIVE:
            return PointerRelative(
                dx=_integer(msg, "dx", -POINTER_MAX_DELTA, POINTER_MAX_DELTA),
                dy=_integer(msg, "dy", -POINTER_MAX_DELTA, POINTER_MAX_DELTA),
            )
        case InputType.POINTER_BUTTON:
            return PointerButton(button=_integer(msg, "b", 1, POINTER_MAX_BUTTON), down=_boolean(msg, "d"))
        case InputType.WHEEL:
            limit = float(WHEEL_MAX_NOTCHES)
            return Wheel(dx=_number(msg, "dx", -limit, limit), dy=_number(msg, "dy", -limit, limit))
        case InputType.KEY:
            code = _string(msg, "c", KEY_CODE_MAX_CHARS)
            down = _boolean(msg, "d")
            keysym = keysym_for_code(code)
            if keysym is None:
                raise _Drop(DropReason.UNKNOWN_KEY, f"no keysym for code {code!r}")
            return Key(code=code, keysym=keysym, down=down)
        case InputType.GAMEPAD:
            return Gamepad(
                index=_integer(msg, "i", 0, GAMEPAD_MAX_INDEX),
                axes=_number_list(msg, "ax", GAMEPAD_MAX_AXES, -1.0, 1.0),
                buttons=_number_list(msg, "bt", GAMEPAD_MAX_BUTTONS, 0.0, 1.0),
            )
        case InputType.CLIPBOARD:
            return Clipboard(text=_string(msg, "text", CLIPBOARD_MAX_CHARS))
        case InputType.TEXT:
            return Text(text=_text(msg, "text"))
        case InputType.RESIZE:
            return Resize(
                width=_integer(msg, "w", RESIZE_MIN_PX, RESIZE_MAX_WIDTH_PX),
                height=_integer(msg, "h", RESIZE_MIN_PX, RESIZE_MAX_HEIGHT_PX),
            )
        case InputType.PING:
            return Ping(id=_integer(msg, "id", 0, PING_MAX_ID), ts_ms=_number(msg, "ts", 0.0, math.inf))
        case InputType.PROBE_ACK:
            return ProbeAck(
                id=_integer(msg, "id", 0, PING_MAX_ID),
                rx_packets=_integer(msg, "rx", 0, PING_MAX_ID),
                rx_ms=_number(msg, "rx_ms", 0.0, math.inf),
                frames_decoded=_integer(msg, "fd", 0, PING_MAX_ID) if "fd" in msg else None,
            )
        case InputType.VIEWER_STATS:
            return ViewerStats(glass_ms=_number_list(msg, "g2g", VIEWER_STATS_MAX_SAMPLES, -math.inf, math.inf))


def parse_input(raw: str | bytes) -> InputEvent | InputError:
    """Parse one data-channel message; never raises.

    Returns the event, or an ``InputError`` whose ``reason`` is a ``DropReason``.
    """
    size = len(raw)  # bytes, or characters for str (each is at least one byte)
    if size > INPUT_MAX_BYTES:
        return InputError(DropReason.TOO_LARGE, f"{size} > {INPUT_MAX_BYTES}")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        msg = json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return InputError(DropReason.NOT_JSON, str(exc)[:120])
    if not isinstance(msg, dict):
        return InputError(DropReason.NOT_OBJECT, f"top level is {type(msg).__name__}")
    try:
        return _parse_object(msg)
    except _Drop as drop:
        return InputError(drop.reason, drop.detail)


class InputCounters:
    """Accepted messages by type and dropped ones by reason, for one session.

    Owned by one task (the data-channel handler); read by the stats reporter on
    the same event loop.  ``snapshot()`` returns plain dicts for JSON/metrics.
    """

    def __init__(self) -> None:
        self.accepted: Counter[InputType] = Counter()
        self.dropped: Counter[DropReason] = Counter()

    def record(self, result: InputEvent | InputError) -> None:
        """Count one parse result."""
        if isinstance(result, InputError):
            self.dropped[result.reason] += 1
        else:
            self.accepted[result.TYPE] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{"accepted": {type: n}, "dropped": {reason: n}}`` with string keys."""
        return {
            "accepted": {str(k): v for k, v in sorted(self.accepted.items())},
            "dropped": {str(k): v for k, v in sorted(self.dropped.items())},
        }
