"""Inject validated viewer input into an X display through XTEST.

Job: apply ``streamer.desktop.inputs`` events to the session's display: pointer
motion (0..1 coordinates scaled to the current screen size), relative motion
(XTEST relative MotionNotify: the server moves the pointer by ``dx, dy`` pixels
and clamps it to the screen, as a real mouse does), buttons, wheel
notches (X buttons 4/5 vertical, 6/7 horizontal), keys (keysym -> keycode
through the display's own keymap), text (each character's keysym bound to a
spare keycode with ChangeKeyboardMapping, then pressed: the xdotool technique)
and, when ``xclip`` is installed, the CLIPBOARD selection.  Gamepad, resize and ping events are not X input: the
session runtime routes them (``inject`` returns False for them).

Concurrency model: blocking; one ``XInjector`` (one X connection) per session,
used by one worker thread at a time (python-xlib connections are not meant
for concurrent use).  Each call sends its requests and flushes; none waits for
a reply, so an event costs about 0.1 ms.  Events the server sends us (root
resize, keymap change) are drained non-blockingly before each injection.

Invariants:
- Keys and buttons pressed through us are tracked; ``release_all()`` (called
  by ``close()`` and by the runtime when the viewer leaves or loses focus)
  releases them, so a dropped connection never leaves a key held down.
- The server's key autorepeat is switched off by default: the browser already
  repeats held keys (repeated keydowns), and server repeat on top would double
  them and keep repeating through a network stall.
- Text never changes a keycode the keymap already uses: characters go on spare
  keycodes (no keysym at open), kept bound while the session types (an app
  reads a key press with the keymap of the moment it handles it, so unbinding
  right after the release could turn a queued press into nothing) and reused
  least recently used first; ``close()`` unbinds them.  ``key()`` never picks
  a spare keycode.  While text is typed, held Control/Alt/Super/AltGr keys are
  lifted (xdotool's --clearmodifiers) so "€" typed with AltGr is not Alt+€.
- Viewer button numbers are ``MouseEvent.button + 1`` (1 left, 2 middle,
  3 right, 4 back, 5 forward), mapped to X buttons 1, 2, 3, 8, 9.
"""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from Xlib import X
from Xlib import display as xdisplay
from Xlib.error import DisplayError as XDisplayError
from Xlib.ext import xtest

from streamer.desktop.inputs import (
    Clipboard,
    InputEvent,
    Key,
    PointerButton,
    PointerMove,
    PointerRelative,
    Text,
    Wheel,
)

log = logging.getLogger(__name__)

# Viewer button (MouseEvent.button + 1) -> X core button.
X_BUTTONS: Final = {1: 1, 2: 2, 3: 3, 4: 8, 5: 9}
WHEEL_UP, WHEEL_DOWN, WHEEL_LEFT, WHEEL_RIGHT = 4, 5, 6, 7  # X core buttons
CLIPBOARD_TIMEOUT_S: Final = 5.0  # xclip reads stdin and forks; it returns at once when healthy
# Text budget (characters): a burst as long as a pasted-sized IME commit, then a fast typist's pace x 20.
TEXT_BURST_CHARS: Final = 512
TEXT_RATE_CHARS_S: Final = 256.0
# A spare keycode pressed more recently than this is not rebound yet: the app may not have read that press.
REBIND_GRACE_S: Final = 0.05
# Held while text is typed, these would turn a character into a shortcut: lifted for the text, pressed again.
CLEARED_MODIFIERS: Final = frozenset({
    0xFFE3, 0xFFE4,  # Control_L, Control_R
    0xFFE9, 0xFFEA,  # Alt_L, Alt_R
    0xFFE7, 0xFFE8,  # Meta_L, Meta_R
    0xFFEB, 0xFFEC,  # Super_L, Super_R
    0xFE03, 0xFF7E,  # ISO_Level3_Shift (AltGr), Mode_switch
})  # fmt: skip


def keysym_for_char(char: str) -> int:
    """X keysym of one character: Latin-1 keysyms are the code point, the rest 0x01000000 + code point."""
    code = ord(char)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 + code


class InjectError(Exception):
    """The display cannot take injected input (no connection, no XTEST)."""


@dataclass(frozen=True, slots=True)
class InjectStats:
    """Counts since open: events sent to X by kind, and events not sent by reason."""

    injected: dict[str, int]
    skipped: dict[str, int]


class XInjector:
    """XTEST input for one display (``":3"``).  Close with ``close()`` or ``with``."""

    def __init__(
        self,
        display_name: str,
        *,
        server_autorepeat: bool = False,
        clipboard_command: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Open a connection; ``clipboard_command`` defaults to xclip when it is on PATH."""
        self.display_name = display_name
        try:
            self._dpy = xdisplay.Display(display_name)
        except XDisplayError as exc:
            raise InjectError(f"cannot connect to {display_name}: {exc}") from exc
        if not self._dpy.has_extension("XTEST"):
            self._dpy.close()
            raise InjectError(f"{display_name} has no XTEST extension")
        self._dpy.set_error_handler(self._on_x_error)
        self._root = self._dpy.screen().root
        # Root ConfigureNotify tells us about RandR resizes; MappingNotify comes to every client.
        self._root.change_attributes(event_mask=X.StructureNotifyMask)
        geometry = self._root.get_geometry()
        self._size = (int(geometry.width), int(geometry.height))
        if not server_autorepeat:
            self._dpy.change_keyboard_control(auto_repeat_mode=X.AutoRepeatModeOff)
        if clipboard_command is None:
            xclip = shutil.which("xclip")
            clipboard_command = (xclip, "-selection", "clipboard", "-in") if xclip else ()
        self._clipboard_command = tuple(clipboard_command)
        self._keys_down: dict[int, int] = {}  # keycode -> keysym it was pressed for
        first = self._dpy.display.info.min_keycode
        mapping = self._dpy.get_keyboard_mapping(first, self._dpy.display.info.max_keycode - first + 1)
        # Keycodes with no keysym: where text characters get bound (the xdotool technique).
        self._spare = tuple(first + i for i, syms in enumerate(mapping) if not any(syms))
        self._bound: OrderedDict[int, int] = OrderedDict()  # keysym -> spare keycode, least recently used first
        self._pressed_at: dict[int, float] = {}  # spare keycode -> when text last pressed it (clock)
        self._clock = clock
        self._text_budget = float(TEXT_BURST_CHARS)
        self._text_at = clock()
        self._buttons_down: set[int] = set()  # X buttons
        self._wheel_rest = [0.0, 0.0]  # fractional notches carried to the next event (x, y)
        self._injected: Counter[str] = Counter()
        self._skipped: Counter[str] = Counter()
        self._dpy.sync()
        self._closed = False

    def __enter__(self) -> XInjector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _on_x_error(error: Any, request: Any) -> None:
        log.warning("X error during input injection: %s", error)

    @property
    def size(self) -> tuple[int, int]:
        """The screen size (pixels) pointer coordinates are scaled to; follows RandR resizes."""
        self._drain_events()
        return self._size

    @property
    def can_set_clipboard(self) -> bool:
        return bool(self._clipboard_command)

    def stats(self) -> InjectStats:
        return InjectStats(injected=dict(self._injected), skipped=dict(self._skipped))

    def _drain_events(self) -> None:
        while self._dpy.pending_events():
            event = self._dpy.next_event()
            if event.type == X.ConfigureNotify and event.window == self._root:
                self._size = (int(event.width), int(event.height))
            elif event.type == X.MappingNotify:
                self._dpy.refresh_keyboard_mapping(event)

    # --- dispatch ---------------------------------------------------------------------
    def inject(self, event: InputEvent) -> bool:
        """Apply one event; False if it is not X input (gamepad, resize, ping) or was skipped."""
        if self._closed:
            raise InjectError("injector closed")
        if isinstance(event, PointerMove):
            self.move(event.x, event.y)
        elif isinstance(event, PointerRelative):
            self.move_relative(event.dx, event.dy)
        elif isinstance(event, PointerButton):
            return self.button(event.button, event.down)
        elif isinstance(event, Wheel):
            self.wheel(event.dx, event.dy)
        elif isinstance(event, Key):
            return self.key(event.keysym, event.down)
        elif isinstance(event, Clipboard):
            return self.set_clipboard(event.text)
        elif isinstance(event, Text):
            return self.type_text(event.text)
        else:
            self._skipped[f"not_x_input:{event.TYPE}"] += 1
            return False
        return True

    # --- primitives -------------------------------------------------------------------
    def move(self, x: float, y: float) -> None:
        """Move the pointer to ``(x, y)`` in 0..1 of the screen (1.0 is the last pixel)."""
        self._drain_events()
        width, height = self._size
        px = min(max(math.floor(x * width), 0), width - 1)
        py = min(max(math.floor(y * height), 0), height - 1)
        xtest.fake_input(self._dpy, X.MotionNotify, x=px, y=py)
        self._dpy.flush()
        self._injected["move"] += 1

    def move_relative(self, dx: int, dy: int) -> None:
        """Move the pointer by ``(dx, dy)`` pixels from where it is (X clamps it to the screen)."""
        # XTEST: detail 1 (True) makes x, y a relative motion; python-xlib packs them as INT16.
        xtest.fake_input(self._dpy, X.MotionNotify, detail=1, x=dx, y=dy)
        self._dpy.flush()
        self._injected["move_relative"] += 1

    def button(self, viewer_button: int, down: bool) -> bool:
        """Press or release a viewer button (1..5); False if it has no X button."""
        x_button = X_BUTTONS.get(viewer_button)
        if x_button is None:
            self._skipped["unknown_button"] += 1
            return False
        xtest.fake_input(self._dpy, X.ButtonPress if down else X.ButtonRelease, x_button)
        self._dpy.flush()
        (self._buttons_down.add if down else self._buttons_down.discard)(x_button)
        self._injected["button"] += 1
        return True

    def wheel(self, dx: float, dy: float) -> None:
        """Scroll by notches; fractions accumulate until they make a whole notch."""
        rest_x, rest_y = self._wheel_rest[0] + dx, self._wheel_rest[1] + dy
        steps_x, steps_y = math.trunc(rest_x), math.trunc(rest_y)
        self._wheel_rest = [rest_x - steps_x, rest_y - steps_y]
        for steps, negative, positive in ((steps_y, WHEEL_UP, WHEEL_DOWN), (steps_x, WHEEL_LEFT, WHEEL_RIGHT)):
            x_button = positive if steps > 0 else negative
            for _ in range(abs(steps)):
                xtest.fake_input(self._dpy, X.ButtonPress, x_button)
                xtest.fake_input(self._dpy, X.ButtonRelease, x_button)
        self._dpy.flush()
        self._injected["wheel"] += 1

    def key(self, keysym: int, down: bool) -> bool:
        """Press or release the key that produces ``keysym``; False if the keymap has none."""
        self._drain_events()
        # the keymap's own key, never a spare keycode text may have bound the same keysym to
        keycode = next((code for code, _ in self._dpy.keysym_to_keycodes(keysym) if code not in self._spare), 0)
        if not keycode:
            self._skipped["unmapped_keysym"] += 1
            return False
        xtest.fake_input(self._dpy, X.KeyPress if down else X.KeyRelease, keycode)
        self._dpy.flush()
        if down:
            self._keys_down[keycode] = keysym
        else:
            self._keys_down.pop(keycode, None)
        self._injected["key"] += 1
        return True

    @property
    def spare_keycodes(self) -> int:
        """How many keycodes text can bind characters to (distinct characters typed without rebinding)."""
        return len(self._spare)

    def _spend_text_budget(self, chars: int) -> bool:
        now = self._clock()
        self._text_budget = min(TEXT_BURST_CHARS, self._text_budget + (now - self._text_at) * TEXT_RATE_CHARS_S)
        self._text_at = now
        if chars > self._text_budget:
            return False
        self._text_budget -= chars
        return True

    def _keycode_for_text(self, keysym: int) -> int:
        """A spare keycode bound to ``keysym`` (binding the least recently used one if needed)."""
        keycode = self._bound.get(keysym)
        if keycode is not None:
            self._bound.move_to_end(keysym)
            return keycode
        if len(self._bound) < len(self._spare):
            keycode = self._spare[len(self._bound)]
        else:
            _, keycode = self._bound.popitem(last=False)
            wait = self._pressed_at.get(keycode, -math.inf) + REBIND_GRACE_S - self._clock()
            if wait > 0:  # more distinct characters in a burst than spare keys: let the app read the press first
                self._dpy.flush()
                time.sleep(wait)
        # both columns: the character comes out the same with or without Shift held
        self._dpy.change_keyboard_mapping(keycode, [(keysym, keysym)])
        self._bound[keysym] = keycode
        return keycode

    def type_text(self, text: str) -> bool:
        """Type ``text`` as characters, whatever the keymap; False when over the rate budget or no key is spare."""
        if not self._spare:
            self._skipped["no_spare_keycode"] += 1
            return False
        if not self._spend_text_budget(len(text)):
            self._skipped["text_rate"] += 1
            return False
        lifted = sorted(code for code, sym in self._keys_down.items() if sym in CLEARED_MODIFIERS)
        for keycode in lifted:
            xtest.fake_input(self._dpy, X.KeyRelease, keycode)
        for char in text:
            keycode = self._keycode_for_text(keysym_for_char(char))
            xtest.fake_input(self._dpy, X.KeyPress, keycode)
            xtest.fake_input(self._dpy, X.KeyRelease, keycode)
            self._pressed_at[keycode] = self._clock()
        for keycode in lifted:
            xtest.fake_input(self._dpy, X.KeyPress, keycode)
        self._dpy.flush()
        self._injected["text"] += 1
        return True

    def _unbind_text_keys(self) -> None:
        for keycode in self._bound.values():
            self._dpy.change_keyboard_mapping(keycode, [(X.NoSymbol, X.NoSymbol)])
        self._bound.clear()

    def set_clipboard(self, text: str) -> bool:
        """Own the CLIPBOARD selection with ``text`` via xclip; False when xclip is missing or fails.

        xclip forks a small server for the selection that lives until another
        client takes the selection or the display shuts down.
        """
        if not self._clipboard_command:
            self._skipped["no_clipboard_tool"] += 1
            return False
        try:
            subprocess.run(
                self._clipboard_command,
                input=text.encode("utf-8", "surrogatepass"),
                env={"DISPLAY": self.display_name},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=CLIPBOARD_TIMEOUT_S,
                check=True,
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("clipboard set failed: %s", exc)
            self._skipped["clipboard_failed"] += 1
            return False
        self._injected["clipboard"] += 1
        return True

    def release_all(self) -> None:
        """Release every key and button we pressed (viewer left, lost focus, or we close)."""
        for keycode in sorted(self._keys_down):
            xtest.fake_input(self._dpy, X.KeyRelease, keycode)
        for x_button in sorted(self._buttons_down):
            xtest.fake_input(self._dpy, X.ButtonRelease, x_button)
        self._keys_down.clear()
        self._buttons_down.clear()
        self._wheel_rest = [0.0, 0.0]
        self._dpy.flush()

    def sync(self) -> None:
        """Wait until the server has processed everything sent so far (tests, benchmarks)."""
        self._dpy.sync()

    def close(self) -> None:
        """Release held input and close the connection; idempotent, tolerant of a dead server."""
        if self._closed:
            return
        self._closed = True
        try:
            self.release_all()
            self._unbind_text_keys()
            self._dpy.sync()
        except Exception as exc:  # the server may already be gone at session end
            log.debug("release on close failed: %s", exc)
        finally:
            try:
                self._dpy.close()
            except Exception as exc:
                log.debug("closing the X connection failed: %s", exc)
