"""Input messages a viewer sends on the ``input`` data channel, built and range-checked here.

Job: one function per ``broker.protocol.InputType`` that returns the JSON object the node
accepts (docs/protocol.md, "Input messages"), refusing out-of-range values with ``ValueError``
before they reach the wire (the node would drop them silently), and ``Pointer``, which turns
relative mouse motion (a grabbed pointer) into absolute positions for viewers that keep one
(``pointer_relative`` sends the motion itself, protocol version 4).

Pure: no I/O, no clock.  Invariant: every message returned passes the node's parser.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from typing import Any

from broker.protocol import (
    CLIPBOARD_MAX_CHARS,
    GAMEPAD_MAX_AXES,
    GAMEPAD_MAX_BUTTONS,
    GAMEPAD_MAX_INDEX,
    POINTER_MAX_BUTTON,
    POINTER_MAX_DELTA,
    TEXT_MAX_CHARS,
    WHEEL_MAX_NOTCHES,
    InputType,
)

Message = dict[str, Any]
KEY_CODE_MAX_CHARS = 32  # the node's limit on a KeyboardEvent.code string
MAX_SAFE_INTEGER = 2**53 - 1  # ping ids: JSON numbers a browser reads exactly


def _number(name: str, value: float, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be within {lo}..{hi}, not {value}")
    return float(value)


def _integer(name: str, value: int, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer within {lo}..{hi}, not {value!r}")
    return value


def key(code: str, down: bool) -> Message:
    """``{"t":"k"}``: a physical key (a ``KeyboardEvent.code`` such as ``"KeyW"``) pressed or released."""
    if not isinstance(code, str) or not 0 < len(code) <= KEY_CODE_MAX_CHARS:
        raise ValueError(f"key code must be a string of 1..{KEY_CODE_MAX_CHARS} characters, not {code!r}")
    return {"t": InputType.KEY.value, "c": code, "d": bool(down)}


def pointer_move(x: float, y: float) -> Message:
    """``{"t":"pm"}``: the absolute pointer position in the picture, 0..1 each (0,0 top left)."""
    return {"t": InputType.POINTER_MOVE.value, "x": _number("x", x, 0, 1), "y": _number("y", y, 0, 1)}


def pointer_relative(dx: int, dy: int) -> Message:
    """``{"t":"pr"}``: relative motion in mouse pixels (+dx right, +dy down), each within ``POINTER_MAX_DELTA``."""
    n = POINTER_MAX_DELTA
    return {"t": InputType.POINTER_RELATIVE.value, "dx": _integer("dx", dx, -n, n), "dy": _integer("dy", dy, -n, n)}


def pointer_button(button: int, down: bool) -> Message:
    """``{"t":"pb"}``: button 1 left, 2 middle, 3 right, 4 back, 5 forward."""
    return {"t": InputType.POINTER_BUTTON.value, "b": _integer("button", button, 1, POINTER_MAX_BUTTON),
            "d": bool(down)}


def wheel(dx: float, dy: float) -> Message:
    """``{"t":"pw"}``: wheel notches; +dy scrolls down, +dx right; fractions accumulate on the node."""
    n = WHEEL_MAX_NOTCHES
    return {"t": InputType.WHEEL.value, "dx": _number("dx", dx, -n, n), "dy": _number("dy", dy, -n, n)}


def gamepad(index: int, axes: Sequence[float], buttons: Sequence[float]) -> Message:
    """``{"t":"gp"}``: the full state of pad ``index`` in the W3C standard mapping (axes -1..1, buttons 0..1)."""
    if len(axes) > GAMEPAD_MAX_AXES or len(buttons) > GAMEPAD_MAX_BUTTONS:
        raise ValueError(f"a gamepad has at most {GAMEPAD_MAX_AXES} axes and {GAMEPAD_MAX_BUTTONS} buttons")
    return {"t": InputType.GAMEPAD.value, "i": _integer("gamepad index", index, 0, GAMEPAD_MAX_INDEX),
            "ax": [_number(f"axis {i}", a, -1, 1) for i, a in enumerate(axes)],
            "bt": [_number(f"button {i}", b, 0, 1) for i, b in enumerate(buttons)]}


def clipboard(text: str) -> Message:
    """``{"t":"cb"}``: text for the remote clipboard (desktop sessions), at most ``CLIPBOARD_MAX_CHARS``."""
    if not isinstance(text, str) or len(text) > CLIPBOARD_MAX_CHARS:
        raise ValueError(f"clipboard text must be a string of at most {CLIPBOARD_MAX_CHARS} characters")
    return {"t": InputType.CLIPBOARD.value, "text": text}


def text(chars: str) -> Message:
    """``{"t":"tx"}``: characters typed as characters whatever the remote layout (protocol version 6):
    1..``TEXT_MAX_CHARS`` code points, no control characters (send Enter or Tab with ``key``)."""
    if not isinstance(chars, str) or not 0 < len(chars) <= TEXT_MAX_CHARS:
        raise ValueError(f"text must be a string of 1..{TEXT_MAX_CHARS} characters, not {chars!r:.40}")
    for char in chars:
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise ValueError(f"text must be printable: U+{ord(char):04X} is a control character or a surrogate")
    return {"t": InputType.TEXT.value, "text": chars}


def ping(ping_id: int, ts_ms: float) -> Message:
    """``{"t":"ping"}``: answered at once with a ``pong`` carrying the same ``id`` and ``ts``."""
    return {"t": InputType.PING.value, "id": _integer("ping id", ping_id, 0, MAX_SAFE_INTEGER),
            "ts": _number("ts", ts_ms, 0, math.inf)}


class Pointer:
    """Relative mouse motion (pixels of the picture) integrated into the protocol's absolute position.

    For a viewer that tracks an absolute position under a grab: it keeps the position and moves
    it by each delta, clamped to the picture.  A game that wants raw motion gets ``pointer_relative``.
    """

    def __init__(self, width: int, height: int, x: float = 0.5, y: float = 0.5) -> None:
        self.width = max(1, width)
        self.height = max(1, height)
        self.x = min(1.0, max(0.0, x))
        self.y = min(1.0, max(0.0, y))

    def resize(self, width: int, height: int) -> None:
        """The picture's size changed (the position, 0..1, stays)."""
        self.width, self.height = max(1, width), max(1, height)

    def move_by(self, dx_px: float, dy_px: float) -> Message:
        """Move by ``dx_px``, ``dy_px`` picture pixels; the ``pm`` message for the new position."""
        self.x = min(1.0, max(0.0, self.x + dx_px / self.width))
        self.y = min(1.0, max(0.0, self.y + dy_px / self.height))
        return pointer_move(self.x, self.y)

    def move_to(self, x: float, y: float) -> Message:
        """Jump to an absolute position (0..1 each)."""
        message = pointer_move(x, y)
        self.x, self.y = message["x"], message["y"]
        return message
