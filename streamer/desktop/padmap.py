"""The viewer's standard-mapping gamepad state as Linux evdev codes of an Xbox-360-like pad (pure).

Job: turn one ``gp`` message's state (W3C Gamepad API "standard" mapping: buttons 0-16, axes 0-3,
values as the browser reports them) into the absolute state of a virtual evdev pad, and the
difference between two such states into the ``(type, code, value)`` events that move one to the
other.  ``streamer.desktop.uinput`` writes those events to a uinput device.

Mapping (what Linux's ``xpad`` driver reports for an Xbox 360 pad, so SDL, Steam and Wine see a pad they know):
buttons 0-3 A/B/X/Y -> BTN_SOUTH/EAST/WEST/NORTH, 4/5 bumpers -> BTN_TL/TR, 6/7 analog triggers ->
ABS_Z/ABS_RZ (0..255), 8 back -> BTN_SELECT, 9 start -> BTN_START, 10/11 stick clicks -> BTN_THUMBL/R,
12-15 d-pad up/down/left/right -> ABS_HAT0Y/HAT0X (-1/0/1; up and down together cancel), 16 guide ->
BTN_MODE; axes 0/1 left stick -> ABS_X/ABS_Y, 2/3 right stick -> ABS_RX/ABS_RY (-32768..32767; +y is
down in both worlds).  Axes 4-7 and missing entries are ignored / neutral.

Invariants: every value stays inside the range the device declares (``ABS_RANGES``); a stick inside
the dead zone reads 0 and travel outside it is rescaled so the edge still reaches full deflection;
NaN or infinite input raises ``ValueError`` naming the entry (``inputs.parse_input`` already refuses
them, this guards other callers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

# linux/input-event-codes.h
EV_SYN: Final = 0x00
EV_KEY: Final = 0x01
EV_ABS: Final = 0x03
SYN_REPORT: Final = 0

BTN_SOUTH: Final = 0x130
BTN_EAST: Final = 0x131
BTN_NORTH: Final = 0x133
BTN_WEST: Final = 0x134
BTN_TL: Final = 0x136
BTN_TR: Final = 0x137
BTN_SELECT: Final = 0x13A
BTN_START: Final = 0x13B
BTN_MODE: Final = 0x13C
BTN_THUMBL: Final = 0x13D
BTN_THUMBR: Final = 0x13E

ABS_X: Final = 0x00
ABS_Y: Final = 0x01
ABS_Z: Final = 0x02
ABS_RX: Final = 0x03
ABS_RY: Final = 0x04
ABS_RZ: Final = 0x05
ABS_HAT0X: Final = 0x10
ABS_HAT0Y: Final = 0x11

STICK_MIN: Final = -32768
STICK_MAX: Final = 32767
TRIGGER_MAX: Final = 255
DEADZONE: Final = 0.05  # stick travel (0..1) read as centre: browsers report drift; apps add their own
PRESSED: Final = 0.5  # a button value at or above this is down

# standard-mapping button index -> key code (6/7 are the triggers, 12-15 the d-pad: axes below)
BUTTON_KEYS: Final[Mapping[int, int]] = {
    0: BTN_SOUTH, 1: BTN_EAST, 2: BTN_WEST, 3: BTN_NORTH, 4: BTN_TL, 5: BTN_TR,
    8: BTN_SELECT, 9: BTN_START, 10: BTN_THUMBL, 11: BTN_THUMBR, 16: BTN_MODE,
}
STICK_AXES: Final[Mapping[int, int]] = {0: ABS_X, 1: ABS_Y, 2: ABS_RX, 3: ABS_RY}
TRIGGER_BUTTONS: Final[Mapping[int, int]] = {6: ABS_Z, 7: ABS_RZ}
DPAD_UP, DPAD_DOWN, DPAD_LEFT, DPAD_RIGHT = 12, 13, 14, 15

# absolute axis -> (min, max, fuzz, flat), as the device declares them (UI_ABS_SETUP)
ABS_RANGES: Final[Mapping[int, tuple[int, int, int, int]]] = {
    ABS_X: (STICK_MIN, STICK_MAX, 16, 128), ABS_Y: (STICK_MIN, STICK_MAX, 16, 128),
    ABS_RX: (STICK_MIN, STICK_MAX, 16, 128), ABS_RY: (STICK_MIN, STICK_MAX, 16, 128),
    ABS_Z: (0, TRIGGER_MAX, 0, 0), ABS_RZ: (0, TRIGGER_MAX, 0, 0),
    ABS_HAT0X: (-1, 1, 0, 0), ABS_HAT0Y: (-1, 1, 0, 0),
}
KEYS: Final[tuple[int, ...]] = tuple(sorted(BUTTON_KEYS.values()))

PadState = dict[tuple[int, int], int]  # (EV_KEY | EV_ABS, code) -> value
PadEvent = tuple[int, int, int]  # (type, code, value)


def _finite(values: Sequence[float], what: str) -> None:
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise ValueError(f"{what}[{i}] is not a finite number: {v!r}")


def stick(value: float, deadzone: float = DEADZONE) -> int:
    """One stick axis (-1..1, clamped) as -32768..32767, 0 inside the dead zone, rescaled outside it."""
    v = max(-1.0, min(1.0, value))
    mag = abs(v)
    if mag <= deadzone:
        return 0
    scaled = (mag - deadzone) / (1.0 - deadzone)
    return round(scaled * STICK_MAX) if v > 0 else -round(scaled * -STICK_MIN)


def trigger(value: float) -> int:
    """An analog trigger (0..1, clamped) as 0..255."""
    return round(max(0.0, min(1.0, value)) * TRIGGER_MAX)


def neutral() -> PadState:
    """Everything released and centred."""
    state: PadState = {(EV_KEY, code): 0 for code in KEYS}
    state.update({(EV_ABS, code): 0 for code in ABS_RANGES})
    return state


def map_state(axes: Sequence[float], buttons: Sequence[float], deadzone: float = DEADZONE) -> PadState:
    """The pad's full evdev state for one standard-mapping state (missing entries: neutral)."""
    if not 0.0 <= deadzone < 1.0:
        raise ValueError(f"deadzone must be in [0, 1): {deadzone!r}")
    _finite(axes, "axes")
    _finite(buttons, "buttons")

    def button(i: int) -> float:
        return buttons[i] if i < len(buttons) else 0.0

    def down(i: int) -> bool:
        return button(i) >= PRESSED

    state = neutral()
    for i, code in BUTTON_KEYS.items():
        state[(EV_KEY, code)] = int(down(i))
    for i, code in TRIGGER_BUTTONS.items():
        state[(EV_ABS, code)] = trigger(button(i))
    for i, code in STICK_AXES.items():
        if i < len(axes):
            state[(EV_ABS, code)] = stick(axes[i], deadzone)
    state[(EV_ABS, ABS_HAT0X)] = int(down(DPAD_RIGHT)) - int(down(DPAD_LEFT))
    state[(EV_ABS, ABS_HAT0Y)] = int(down(DPAD_DOWN)) - int(down(DPAD_UP))
    return state


def diff(before: PadState, after: PadState) -> list[PadEvent]:
    """The events that turn ``before`` into ``after`` (keys first, then axes, each by code; no SYN)."""
    return [(kind, code, value) for (kind, code), value in sorted(after.items())
            if before.get((kind, code)) != value]
