"""The remote side of the clipboard: watch a display's X selections and read their text.

Job: ``ClipboardWatcher`` asks the X server (XFixes ``SelectSelectionInput``) to tell it whenever
a client takes ownership of a selection (``CLIPBOARD``; ``PRIMARY`` too when asked), then converts
the new owner's selection to ``UTF8_STRING`` (``STRING`` when the owner refuses) onto its own
hidden window, reads the text (``INCR`` transfers included) and calls ``on_text(text, selection)``.
``ClipboardSync`` is the pure rule that keeps the two sides from echoing each other: text the
viewer pasted comes back from the display (xclip becomes the new owner) and is not sent back.
``ClipboardBridge`` is what a session runs: the watcher, the rule, and the text a viewer has not
got yet (copied while none was connected), sent as a ``cb`` node event.

Concurrency model: one daemon thread (``rb-clip-<session>``) owns the watcher's X connection
(python-xlib connections are not shared between threads) and blocks in ``select`` on it and on a
wake pipe that ``close`` writes to.  ``on_text`` runs on that thread: the caller hands the text to
its event loop (``loop.call_soon_threadsafe``; ``ClipboardBridge`` does).  ``ClipboardSync`` and
``ClipboardBridge`` are used on the event loop only, apart from the bridge's blocking start/close, which
it runs in worker threads.

Invariants:
- text longer than ``max_chars`` characters is never passed on (counted as ``too_long``), and a
  transfer is abandoned past ``4 * max_chars`` bytes (UTF-8 takes at most 4 per character);
- an owner that never answers costs at most ``CONVERT_TIMEOUT_S``: a later change is read as usual;
- ``close`` stops the thread, closes the X connection and is idempotent; an X server that goes
  away ends the thread quietly (the session is ending).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

from Xlib import X, Xatom
from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError, XError
from Xlib.error import DisplayError as XDisplayError
from Xlib.ext import xfixes

from broker.protocol import CLIPBOARD_MAX_CHARS, NodeEventType

log = logging.getLogger(__name__)

SELECTIONS: Final = ("CLIPBOARD", "PRIMARY")
CONVERT_TIMEOUT_S: Final = 2.0  # an owner answers a conversion within ms; a hung one is given up on
INCR_CHUNK_TIMEOUT_S: Final = 2.0  # per chunk of an INCR transfer
_PROPERTY: Final = "RB_CLIPBOARD"  # the property on our window the owner writes the text to


class ClipboardError(Exception):
    """The display cannot be watched (no connection, no XFixes)."""


class ClipboardSync:
    """Which clipboard texts cross to the other side (no echo, no repeats).

    Both sides hold the same text after any transfer, so a text equal to the last one that
    crossed (either way) is not sent again: the viewer's paste that xclip re-announces, or a
    second owner change with the same content.
    """

    def __init__(self) -> None:
        self.last: str | None = None

    def from_viewer(self, text: str) -> None:
        """The viewer sent ``text`` to the display."""
        self.last = text

    def from_remote(self, text: str) -> bool:
        """The display's selection now holds ``text``: True when it should go to the viewer."""
        if not text or text == self.last:
            return False
        self.last = text
        return True


class ClipboardWatcher:
    """Reads each new owner's text of the watched selections of one display (see the module docstring)."""

    def __init__(
        self,
        display_name: str,
        on_text: Callable[[str, str], None],
        *,
        selections: Sequence[str] = ("CLIPBOARD",),
        max_chars: int = CLIPBOARD_MAX_CHARS,
        thread_name: str = "rb-clip",
    ) -> None:
        unknown = set(selections) - set(SELECTIONS)
        if unknown or not selections:
            raise ValueError(f"selections must be a non-empty subset of {SELECTIONS}, got {list(selections)}")
        self.display_name = display_name
        self._on_text = on_text
        self._selection_names = tuple(selections)
        self.max_chars = max_chars
        self.counts: Counter[str] = Counter()  # read, too_long, refused, timeout, failed
        self._dpy: xdisplay.Display | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._closed = False

    def start(self) -> None:
        """Connect and start watching (blocking: a few round trips).  Raises ``ClipboardError``."""
        try:
            dpy = xdisplay.Display(self.display_name)
        except XDisplayError as exc:
            raise ClipboardError(f"cannot connect to {self.display_name}: {exc}") from exc
        try:
            if not dpy.has_extension("XFIXES"):
                raise ClipboardError(f"{self.display_name} has no XFIXES extension")
            dpy.xfixes_query_version()
            self._owner_event = dpy.query_extension("XFIXES").first_event + xfixes.XFixesSelectionNotify
            root = dpy.screen().root
            # override_redirect: a window the WM must never manage.  Without it, keys typed into
            # xterm under openbox were lost (tests/streamer/media/test_session.py's typing test).
            self._window = root.create_window(-10, -10, 1, 1, 0, X.CopyFromParent,
                                              event_mask=X.PropertyChangeMask, override_redirect=True)
            self._atoms = {name: dpy.intern_atom(name) for name in self._selection_names}
            self._names = {atom: name for name, atom in self._atoms.items()}
            self._utf8 = dpy.intern_atom("UTF8_STRING")
            self._incr = dpy.intern_atom("INCR")
            self._prop = dpy.intern_atom(_PROPERTY)
            mask = xfixes.XFixesSetSelectionOwnerNotifyMask
            for atom in self._atoms.values():
                dpy.xfixes_select_selection_input(root, atom, mask)
            dpy.sync()
        except BaseException:
            dpy.close()
            raise
        self._dpy = dpy
        self._wake_r, self._wake_w = os.pipe()
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the connection.  Blocking (joins); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._dpy is None:
            return
        os.write(self._wake_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    # -- the watcher thread --------------------------------------------------------------

    def _run(self) -> None:
        dpy = self._dpy
        assert dpy is not None
        try:
            while not self._closed:
                if not dpy.pending_events():
                    readable, _, _ = select.select([dpy, self._wake_r], [], [])
                    if self._wake_r in readable:
                        return
                    if not dpy.pending_events():
                        continue
                event = dpy.next_event()
                # python-xlib registers a copy of the event class: match the code, not the class
                if event.type == self._owner_event and event.sub_code == xfixes.XFixesSetSelectionOwnerNotify:
                    self._owner_changed(dpy, event)
        except (ConnectionClosedError, XDisplayError, OSError) as exc:
            if not self._closed:
                log.info("clipboard watch of %s ended: %r", self.display_name, exc)
        except Exception:  # thread boundary: log, and the clipboard goes one way only
            log.exception("clipboard watch of %s failed", self.display_name)
        finally:
            try:
                dpy.close()
            except Exception:  # the server is gone already
                pass

    def _owner_changed(self, dpy: xdisplay.Display, event: Any) -> None:
        name = self._names.get(event.selection)
        owner = getattr(event.owner, "id", event.owner)
        if name is None or owner in (X.NONE, self._window.id):
            return  # selection cleared (owner exited), or not ours to read
        text = self._read(dpy, event.selection, event.selection_timestamp)
        if text is None:
            return
        if len(text) > self.max_chars:
            self.counts["too_long"] += 1
            log.info("clipboard of %s: %d characters over the %d limit, not sent", self.display_name, len(text),
                     self.max_chars)
            return
        self.counts["read"] += 1
        self._on_text(text, name)

    def _read(self, dpy: xdisplay.Display, selection: int, timestamp: int) -> str | None:
        for target, encoding in ((self._utf8, "utf-8"), (Xatom.STRING, "latin-1")):
            self._window.convert_selection(selection, target, self._prop, timestamp)
            dpy.flush()
            reply = self._wait(dpy, lambda e: e.type == X.SelectionNotify and e.requestor == self._window,
                               CONVERT_TIMEOUT_S)
            if reply is None:
                self.counts["timeout"] += 1
                return None
            if reply.property == X.NONE:
                continue  # the owner cannot give this target: try the next
            data = self._take_property(dpy)
            if data is None:
                return None
            return data.decode(encoding, errors="replace")
        self.counts["refused"] += 1
        return None

    def _take_property(self, dpy: xdisplay.Display) -> bytes | None:
        """The converted text, read and deleted (an INCR transfer chunk by chunk); None: given up."""
        limit = 4 * self.max_chars
        prop = self._window.get_full_property(self._prop, X.AnyPropertyType, sizehint=limit // 4 + 1)
        self._window.delete_property(self._prop)  # also asks an INCR owner for its first chunk
        dpy.flush()
        if prop is None:
            self.counts["failed"] += 1
            return None
        if prop.property_type != self._incr:
            return _as_bytes(prop.value)[: limit + 1]
        chunks: list[bytes] = []
        size = 0
        while True:
            note = self._wait(dpy, lambda e: e.type == X.PropertyNotify and e.window == self._window
                              and e.atom == self._prop and e.state == X.PropertyNewValue, INCR_CHUNK_TIMEOUT_S)
            if note is None:
                self.counts["timeout"] += 1
                return None
            part = self._window.get_full_property(self._prop, X.AnyPropertyType, sizehint=limit // 4 + 1)
            self._window.delete_property(self._prop)  # asks for the next chunk
            dpy.flush()
            chunk = _as_bytes(part.value) if part is not None else b""
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:  # keep taking chunks is pointless: the text will not be sent
                self.counts["too_long"] += 1
                return None
            chunks.append(chunk)

    def _wait(self, dpy: xdisplay.Display, match: Callable[[Any], bool], timeout_s: float) -> Any | None:
        """The next event that ``match``es within ``timeout_s``; owner changes met meanwhile are dropped."""
        deadline = time.monotonic() + timeout_s
        while not self._closed:
            while dpy.pending_events():
                event = dpy.next_event()
                if match(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([dpy, self._wake_r], [], [], remaining)
            if self._wake_r in readable:
                return None
        return None


class ClipboardBridge:
    """A session's remote clipboard -> its viewer (``send`` a node event; False: no open channel)."""

    def __init__(self, display_name: str, send: Callable[[dict[str, Any]], bool], *,
                 selections: Sequence[str] = ("CLIPBOARD",), thread_name: str = "rb-clip") -> None:
        self._display_name = display_name
        self._send = send
        self._selections = tuple(selections)
        self._thread_name = thread_name
        self.sync = ClipboardSync()
        self.pending: str | None = None  # copied while no viewer could get it
        self._watcher: ClipboardWatcher | None = None

    async def start(self) -> bool:
        """Watch the display (False, logged: no XFixes, the clipboard goes viewer -> remote only)."""
        loop = asyncio.get_running_loop()

        def changed(text: str, selection: str) -> None:  # the watcher's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the session is gone
                loop.call_soon_threadsafe(self._changed, text)

        watcher = ClipboardWatcher(self._display_name, changed, selections=self._selections,
                                   thread_name=self._thread_name)
        try:
            await asyncio.to_thread(watcher.start)
        except ClipboardError as exc:
            log.warning("the clipboard of %s is not watched: %s", self._display_name, exc)
            return False
        self._watcher = watcher
        return True

    def from_viewer(self, text: str) -> None:
        """The viewer pasted ``text`` (the input router's hook): it must not come back."""
        self.sync.from_viewer(text)

    def viewer_ready(self) -> None:
        """A viewer's channel opened: give it what was copied meanwhile."""
        if self.pending is not None:
            self._deliver(self.pending)

    def _changed(self, text: str) -> None:
        if self._watcher is not None and self.sync.from_remote(text):
            self._deliver(text)

    def _deliver(self, text: str) -> None:
        sent = self._send({"t": NodeEventType.CLIPBOARD.value, "text": text})
        self.pending = None if sent else text

    async def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await asyncio.to_thread(watcher.close)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("latin-1", errors="replace")
    return bytes(value)  # an array of 8-bit items


__all__ = ["ClipboardBridge", "ClipboardError", "ClipboardSync", "ClipboardWatcher", "XError"]
