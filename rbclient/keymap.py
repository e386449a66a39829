"""Physical keys: SDL scancodes (USB HID usage IDs) to the ``KeyboardEvent.code`` names the node knows.

The protocol's ``k`` message carries physical keys (docs/protocol.md lists the codes the node
injects); SDL's scancodes are physical too (they are the USB HID keyboard usage IDs), so an SDL
or pygame client maps ``event.scancode`` through ``code_for_scancode`` and the remote side
applies its own layout.  Pure data.
"""

from __future__ import annotations

from typing import Final

_LETTERS = {4 + i: f"Key{chr(ord('A') + i)}" for i in range(26)}  # HID 0x04..0x1d
_DIGITS = {30 + i: f"Digit{(i + 1) % 10}" for i in range(10)}  # HID 0x1e..0x27: 1..9, then 0
_FUNCTION = {58 + i: f"F{i + 1}" for i in range(12)}  # HID 0x3a..0x45

SCANCODE_TO_CODE: Final[dict[int, str]] = {
    **_LETTERS, **_DIGITS, **_FUNCTION,
    40: "Enter", 41: "Escape", 42: "Backspace", 43: "Tab", 44: "Space", 45: "Minus", 46: "Equal",
    47: "BracketLeft", 48: "BracketRight", 49: "Backslash", 51: "Semicolon", 52: "Quote", 53: "Backquote",
    54: "Comma", 55: "Period", 56: "Slash", 57: "CapsLock",
    73: "Insert", 74: "Home", 75: "PageUp", 76: "Delete", 77: "End", 78: "PageDown",
    79: "ArrowRight", 80: "ArrowLeft", 81: "ArrowDown", 82: "ArrowUp", 88: "NumpadEnter", 101: "ContextMenu",
    224: "ControlLeft", 225: "ShiftLeft", 226: "AltLeft", 227: "MetaLeft",
    228: "ControlRight", 229: "ShiftRight", 230: "AltRight", 231: "MetaRight",
}  # fmt: skip


def code_for_scancode(scancode: int) -> str | None:
    """The ``KeyboardEvent.code`` of an SDL scancode, or None for a key the node does not know."""
    return SCANCODE_TO_CODE.get(scancode)
