// Viewer input -> data-channel messages (broker/protocol.py InputType): keyboard by
// KeyboardEvent.code, or as text ("tx") where the user's layout types another character than the remote
// US layout would (web/keys.js routeKey; never in game pools, where the key's place is what counts) and
// for dead-key / IME compositions, pointer as 0..1 coordinates of the video picture (letterboxing respected),
// relative motion while the pointer is locked ("pr": movementX/Y summed per animation frame),
// buttons, wheel notches, gamepads (polled, sent on change), clipboard paste, viewport resize.
//
// One InputController per page.  It never talks to the network itself: `send(msg)` (false when the
// channel is closed) and a few predicates come from the caller, so a reconnect swaps the channel
// underneath without touching the listeners.
//
// Latency: pointer moves are coalesced to one message per animation frame and skipped while the
// channel has a backlog (never keys or buttons: those are state changes and must all arrive).
// Relative motion is summed, never dropped: a backlog only makes the next "pr" carry more.
// Invariant: every key or button reported down is reported up, also on blur, hidden tab or teardown.
//
// Focus: while streaming, the keyboard focus sits on a hidden text field (`o.sink`, #kbd-sink) rather than
// on the video, so the browser's IME and dead keys have somewhere to compose; what they commit
// (compositionend, or an "input" of type insertText) goes as text and the field is emptied.  On touch
// devices the video keeps the focus (a focused text field would open the system keyboard).

import {
  CLIPBOARD_MAX_CHARS, GAMEPAD_MAX_AXES, GAMEPAD_MAX_BUTTONS, GAMEPAD_MAX_INDEX, InputType, POINTER_MAX_BUTTON,
  POINTER_MAX_DELTA,
} from "./protocol.js";
import { clamp, contentRect, gamepadMessage, relativePoint, wheelNotches } from "./calc.js";
import { routeKey, textChunks } from "./keys.js";

const MOVE_BACKLOG_BYTES = 8 * 1024; // skip pointer moves while this much input waits in the channel
const PASTE_KEY_WAIT_MS = 150; // hold Ctrl+V's key-down until the clipboard text went first


function isEditable(t) {
  return t instanceof HTMLElement && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName));
}

/** Keys typed while a page control has focus (toolbar, overlays, banner, forms) stay local. */
function localTarget(t) {
  return t instanceof Element && (isEditable(t) || Boolean(t.closest(".toolbar, .overlay, .banner")));
}

export function isStatsToggle(e) {
  return e.code === "F8" || (e.ctrlKey && e.shiftKey && e.code === "KeyS");
}

function isPasteShortcut(e) {
  return (e.code === "KeyV" && (e.ctrlKey || e.metaKey) && !e.altKey) || (e.code === "Insert" && e.shiftKey);
}

export class InputController {
  /**
   * @param {object} o
   * @param {HTMLVideoElement} o.video  the element showing the stream
   * @param {(msg: object) => boolean} o.send  send one message; false when the channel is closed
   * @param {() => boolean} o.active  true while input should flow (streaming and channel open)
   * @param {() => number} o.backlog  bytes queued in the channel (RTCDataChannel.bufferedAmount)
   * @param {() => boolean} o.gameMode  pointer lock on click (game pools)
   * @param {() => void} o.toggleStats  F8 / Ctrl+Shift+S while streaming
   * @param {() => boolean} o.streaming  the stream view is shown (stats toggle works even offline)
   * @param {(text: string) => void} o.hint  a short on-screen hint
   * @param {HTMLTextAreaElement} [o.sink]  hidden field holding the keyboard focus while streaming (IME)
   * @param {() => boolean} [o.touch]  true on touch-first devices: the video keeps the focus
   */
  constructor(o) {
    this.o = o;
    this.keys = new Map(); // KeyboardEvent.code pressed -> the code sent for it (shortcuts follow the letter)
    this.buttons = new Set();
    this.pendingPaste = null; // {code, timer}
    this.pendingMove = null;
    this.lastMove = null;
    this.rel = { dx: 0, dy: 0 }; // relative motion summed since the last "pr" (fractions carry over)
    this.pads = new Map(); // gamepad index -> last message sent (JSON)
    this.padsIgnored = new Set(); // ids of non-standard pads the viewer was told about (once each)
  }

  /** Install the listeners and the per-frame loop (once). */
  attach() {
    const v = this.o.video;
    document.addEventListener("keydown", (e) => this.onKeyDown(e), { capture: true });
    document.addEventListener("keyup", (e) => this.onKeyUp(e), { capture: true });
    document.addEventListener("paste", (e) => this.onPaste(e));
    const sink = this.o.sink;
    if (sink) {
      sink.addEventListener("compositionend", (e) => this.onCompositionEnd(e));
      sink.addEventListener("input", (e) => this.onSinkInput(e));
    }
    // locked, the events target the video and bubble to the document: take each one once
    v.addEventListener("mousemove", (e) => { if (document.pointerLockElement !== v) this.onMouseMove(e); });
    document.addEventListener("mousemove", (e) => { if (document.pointerLockElement === v) this.onMouseMove(e); });
    v.addEventListener("mousedown", (e) => this.onMouseDown(e));
    window.addEventListener("mouseup", (e) => this.onMouseUp(e));
    v.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    v.addEventListener("contextmenu", (e) => e.preventDefault());
    window.addEventListener("blur", () => this.releaseAll());
    document.addEventListener("visibilitychange", () => { if (document.hidden) this.releaseAll(); });
    document.addEventListener("pointerlockchange", () => {
      const locked = document.pointerLockElement === v;
      document.body.classList.toggle("pointer-locked", locked);
      if (!locked) { this.flushRelative(); this.rel = { dx: 0, dy: 0 }; }
    });
    window.addEventListener("gamepaddisconnected", (e) => this.onGamepadDisconnected(e));
    const frame = () => {
      this.flushRelative();
      this.flushMove();
      this.pollGamepads();
      requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  }

  /** A new data channel opened: its peer knows nothing yet, so state is re-sent on change. */
  channelOpened() {
    this.pads.clear();
    this.lastMove = null;
    this.rel = { dx: 0, dy: 0 }; // motion made while no channel was open is not replayed
  }

  /** Release every key and button reported down (focus loss must not leave input stuck remotely). */
  releaseAll() {
    if (this.pendingPaste) { clearTimeout(this.pendingPaste.timer); this.pendingPaste = null; }
    for (const c of this.keys.values()) this.o.send({ t: InputType.KEY, c, d: false });
    this.keys.clear();
    for (const b of this.buttons) this.o.send({ t: InputType.POINTER_BUTTON, b, d: false });
    this.buttons.clear();
  }

  // ---- keyboard ----------------------------------------------------------------------------
  /** Give the keyboard focus to the stream: the hidden text field (IME), or the video on touch devices. */
  focus() {
    const touch = this.o.touch ? this.o.touch() : false;
    (this.o.sink && !touch ? this.o.sink : this.o.video).focus({ preventScroll: true });
  }

  /** A target whose keys stay on the page; the stream's own hidden field is not one. */
  isLocal(t) {
    return t !== this.o.sink && localTarget(t);
  }

  keyDown(code, sent = code) {
    this.keys.set(code, sent);
    this.o.send({ t: InputType.KEY, c: sent, d: true });
  }

  sendText(text) {
    for (const chunk of textChunks(text)) this.o.send({ t: InputType.TEXT, text: chunk });
  }

  onCompositionEnd(e) {
    if (this.o.active() && e.data) this.sendText(e.data);
    this.o.sink.value = "";
  }

  onSinkInput(e) {
    if (e.isComposing) return; // the IME is still composing: its text comes with compositionend
    // text inserted without a key we sent (on-screen keyboards, dictation, DevTools' Input.insertText)
    if (e.inputType === "insertText" && e.data && this.o.active()) this.sendText(e.data);
    this.o.sink.value = "";
  }

  flushPasteKey() {
    if (!this.pendingPaste) return;
    clearTimeout(this.pendingPaste.timer);
    const { code } = this.pendingPaste;
    this.pendingPaste = null;
    this.keyDown(code);
  }

  onKeyDown(e) {
    if (this.o.streaming() && isStatsToggle(e)) {
      e.preventDefault();
      if (!e.repeat) this.o.toggleStats();
      return;
    }
    if (!this.o.active() || this.isLocal(e.target)) return;
    if (e.isComposing || e.keyCode === 229) return; // the IME owns this key; its text comes with compositionend
    const altGraph = Boolean(e.getModifierState && e.getModifierState("AltGraph"));
    let route = routeKey({ key: e.key, code: e.code, shiftKey: e.shiftKey, ctrlKey: e.ctrlKey, altKey: e.altKey,
                           metaKey: e.metaKey, altGraph });
    if (route.kind !== "code" && e.code && this.o.gameMode()) route = { kind: "code", code: e.code }; // WASD by place
    if (route.kind === "none") return; // a dead key: the browser composes, the result comes as text
    if (route.kind === "text") { e.preventDefault(); this.sendText(route.text); return; } // repeats type again
    if (e.repeat) { e.preventDefault(); return; } // the remote side auto-repeats held keys itself
    if (isPasteShortcut(e)) {
      // No preventDefault: the browser must fire 'paste' so the clipboard text reaches the remote
      // side before the shortcut does.  The key-down waits for it (or for a short timeout).
      this.flushPasteKey();
      this.pendingPaste = { code: e.code, timer: setTimeout(() => this.flushPasteKey(), PASTE_KEY_WAIT_MS) };
      return;
    }
    e.preventDefault();
    this.keyDown(e.code, route.code);
  }

  onKeyUp(e) {
    if (this.o.streaming() && isStatsToggle(e)) { e.preventDefault(); return; }
    if (this.pendingPaste && this.pendingPaste.code === e.code) this.flushPasteKey();
    const sent = this.keys.get(e.code);
    if (sent === undefined) return;
    e.preventDefault();
    this.keys.delete(e.code);
    this.o.send({ t: InputType.KEY, c: sent, d: false });
  }

  onPaste(e) {
    if (!this.o.active() || this.isLocal(e.target)) return;
    const text = e.clipboardData ? e.clipboardData.getData("text/plain") : "";
    e.preventDefault();
    if (text) this.o.send({ t: InputType.CLIPBOARD, text: text.slice(0, CLIPBOARD_MAX_CHARS) });
    this.flushPasteKey();
  }

  // ---- pointer -----------------------------------------------------------------------------
  pointerPos(e) {
    const v = this.o.video;
    const r = contentRect(v.getBoundingClientRect(), v.videoWidth, v.videoHeight);
    return r ? relativePoint(r, e.clientX, e.clientY) : null;
  }

  onMouseMove(e) {
    if (!this.o.active()) return;
    if (document.pointerLockElement === this.o.video) {
      // locked: no position, only movement; summed here, sent once per animation frame as "pr"
      this.rel.dx += e.movementX || 0;
      this.rel.dy += e.movementY || 0;
      return;
    }
    const p = this.pointerPos(e);
    if (p) this.pendingMove = p;
  }

  /** Send the whole pixels of the summed relative motion as one "pr"; the fractions wait for more. */
  flushRelative() {
    const dx = clamp(Math.trunc(this.rel.dx), -POINTER_MAX_DELTA, POINTER_MAX_DELTA);
    const dy = clamp(Math.trunc(this.rel.dy), -POINTER_MAX_DELTA, POINTER_MAX_DELTA);
    if ((!dx && !dy) || !this.o.active()) return;
    if (this.o.send({ t: InputType.POINTER_RELATIVE, dx, dy })) { this.rel.dx -= dx; this.rel.dy -= dy; }
  }

  flushMove() {
    const p = this.pendingMove;
    if (!p || !this.o.active()) return;
    if (this.lastMove && this.lastMove.x === p.x && this.lastMove.y === p.y) { this.pendingMove = null; return; }
    if (this.o.backlog() > MOVE_BACKLOG_BYTES) return; // keep only the newest position until the backlog drains
    if (this.o.send({ t: InputType.POINTER_MOVE, x: p.x, y: p.y })) {
      this.lastMove = p;
      this.pendingMove = null;
    }
  }

  onMouseDown(e) {
    if (!this.o.active()) return;
    const v = this.o.video;
    this.focus();
    e.preventDefault();
    const locked = document.pointerLockElement === v;
    if (this.o.gameMode() && !locked) this.requestLock();
    const b = e.button + 1;
    if (b < 1 || b > POINTER_MAX_BUTTON) return;
    if (locked) {
      this.flushRelative(); // the click lands after the motion made before it
    } else {
      const p = this.pointerPos(e);
      if (p) { this.pendingMove = p; this.flushMove(); } // the click lands where the pointer is now
    }
    this.buttons.add(b);
    this.o.send({ t: InputType.POINTER_BUTTON, b, d: true });
  }

  onMouseUp(e) {
    const b = e.button + 1;
    if (!this.buttons.has(b)) return;
    e.preventDefault();
    this.buttons.delete(b);
    this.o.send({ t: InputType.POINTER_BUTTON, b, d: false });
  }

  requestLock() {
    // Raw (unaccelerated) movement where the platform offers it; plain pointer lock otherwise.
    const v = this.o.video;
    const plain = () => {
      try {
        const r = v.requestPointerLock();
        if (r && r.catch) r.catch(() => this.o.hint("The browser refused to capture the mouse: click the video again"));
      } catch { /* refused: the pointer stays free */ }
    };
    try {
      const r = v.requestPointerLock({ unadjustedMovement: true });
      if (r && r.catch) r.catch(plain);
    } catch {
      plain();
    }
  }

  onWheel(e) {
    if (!this.o.active()) return;
    e.preventDefault();
    const dx = wheelNotches(e.deltaX, e.deltaMode), dy = wheelNotches(e.deltaY, e.deltaMode);
    if (dx || dy) this.o.send({ t: InputType.WHEEL, dx, dy });
  }

  // ---- gamepads: polled every animation frame, sent on change --------------------------------
  pollGamepads() {
    if (!this.o.active() || !navigator.getGamepads) return;
    for (const pad of navigator.getGamepads()) {
      if (!pad || pad.index > GAMEPAD_MAX_INDEX) continue;
      const msg = gamepadMessage(pad);
      if (!msg) { // the browser does not know this pad's layout: its buttons would arrive as the wrong ones
        if (!this.padsIgnored.has(pad.id)) {
          this.padsIgnored.add(pad.id);
          this.o.hint(`Gamepad "${pad.id.slice(0, 40)}" has no standard mapping in this browser: not sent`);
        }
        continue;
      }
      const key = JSON.stringify(msg);
      if (this.pads.get(pad.index) !== key && this.o.send(msg)) this.pads.set(pad.index, key);
    }
  }

  onGamepadDisconnected(e) {
    const pad = e.gamepad;
    if (pad.index > GAMEPAD_MAX_INDEX || pad.mapping !== "standard") return; // never sent: nothing held
    // neutral state so nothing stays held on the remote controller
    this.o.send({ t: InputType.GAMEPAD, i: pad.index, ax: new Array(Math.min(pad.axes.length, GAMEPAD_MAX_AXES)).fill(0),
                  bt: new Array(Math.min(pad.buttons.length, GAMEPAD_MAX_BUTTONS)).fill(0) });
    this.pads.delete(pad.index);
  }
}
