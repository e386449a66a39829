// Touch input for phones and tablets: gestures on the video become the same data-channel messages a
// mouse and a keyboard send (broker/protocol.py InputType), and a toolbar button opens the on-screen
// keyboard.
//
// Gestures (on the video; the page's own scrolling and zooming are suppressed there):
//   tap                 pointer to the finger ("pm"), then a left click ("pb" down + up)
//   one-finger drag     pointer to where the finger went down, left button down, the pointer follows
//                       the finger, button up when it lifts (select text, drag windows, draw)
//   two-finger drag     wheel ("pw"): fingers moving up scroll down, as on a touch screen
// A finger that moves less than TAP_SLOP_PX is a tap.  A second finger cancels a one-finger gesture
// (its button, if down, is released first).
//
// Keyboard: touch devices have no physical keys, so the "Keyboard" button focuses a hidden text
// input; the system keyboard opens, and what it types arrives as "input" events (text) and keydowns
// (Enter, Backspace, ...), sent as key presses of a US layout ("k"; uppercase and shifted symbols with
// ShiftLeft); characters a US layout has no key for (accents, emoji, kana) go as text ("tx").  The input is emptied after each event, so nothing accumulates in it.
//
// Invariant: a button this module pressed is released on touchend, touchcancel, a second finger, blur,
// a hidden tab and releaseAll().

import { InputType, WHEEL_MAX_NOTCHES } from "./protocol.js";
import { clamp, contentRect, relativePoint } from "./calc.js";
import { keyForChar, textChunks } from "./keys.js";

export { keyForChar };

export const TOUCH_HINT = "Tap clicks · drag holds the button · two fingers scroll · Keyboard types";
export const TAP_SLOP_PX = 10; // finger travel (CSS px) under which a touch is a tap
export const TOUCH_PX_PER_NOTCH = 40; // two-finger travel per wheel notch
const MIN_NOTCHES = 0.25; // the smallest wheel message a two-finger drag sends

// keys the on-screen keyboard reports as keydown rather than as text
const OSK_KEYS = new Set(["Enter", "Backspace", "Tab", "Escape", "ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown",
  "Delete", "Home", "End"]);

/** True where the primary pointer is a finger (phones, tablets; not a laptop that also has a touch screen). */
export function touchPrimary() {
  return Boolean(window.matchMedia && window.matchMedia("(pointer: coarse)").matches);
}

/** True where touch input is possible at all (a touch screen anywhere, or a coarse primary pointer). */
export function touchCapable() {
  return (navigator.maxTouchPoints || 0) > 0 || touchPrimary();
}

export class TouchController {
  /**
   * @param {object} o
   * @param {HTMLVideoElement} o.video
   * @param {(msg: object) => boolean} o.send  false when the channel is closed
   * @param {() => boolean} o.active  true while input should flow
   * @param {HTMLButtonElement} o.keyboardButton  opens the on-screen keyboard (shown on touch devices)
   * @param {HTMLInputElement} o.keyboardInput  the hidden input the system keyboard types into
   */
  constructor(o) {
    this.o = o;
    this.one = null; // {id, x, y, dragging}: the one-finger gesture in progress
    this.two = null; // {x, y}: midpoint of the two-finger scroll in progress
    this.buttonDown = false;
  }

  attach() {
    const v = this.o.video;
    const opts = { passive: false };
    v.addEventListener("touchstart", (e) => this.onStart(e), opts);
    v.addEventListener("touchmove", (e) => this.onMove(e), opts);
    v.addEventListener("touchend", (e) => this.onEnd(e), opts);
    v.addEventListener("touchcancel", (e) => { e.preventDefault(); this.releaseAll(); }, opts);
    window.addEventListener("blur", () => this.releaseAll());
    document.addEventListener("visibilitychange", () => { if (document.hidden) this.releaseAll(); });
    const { keyboardButton: button, keyboardInput: osk } = this.o;
    if (touchCapable()) button.hidden = false;
    v.addEventListener("touchstart", () => { button.hidden = false; }, { once: true, passive: true });
    // pointerdown keeps the focus where it is, so the click below can move it to the input (and the
    // system keyboard opens: it needs the focus to come from a user gesture)
    button.addEventListener("pointerdown", (e) => e.preventDefault());
    button.addEventListener("click", () => {
      if (document.activeElement === osk) { osk.blur(); return; }
      osk.value = "";
      osk.focus({ preventScroll: true });
    });
    osk.addEventListener("keydown", (e) => this.onKeyboardKey(e));
    osk.addEventListener("input", (e) => this.onKeyboardInput(e));
  }

  releaseAll() {
    if (this.buttonDown) this.button(false);
    this.one = null;
    this.two = null;
  }

  // ---- gestures ------------------------------------------------------------------------------
  point(t) {
    const v = this.o.video;
    const r = contentRect(v.getBoundingClientRect(), v.videoWidth, v.videoHeight);
    return r ? relativePoint(r, t.clientX, t.clientY) : null;
  }

  moveTo(t) {
    const p = this.point(t);
    if (p) this.o.send({ t: InputType.POINTER_MOVE, x: p.x, y: p.y });
  }

  button(down) {
    this.buttonDown = down;
    this.o.send({ t: InputType.POINTER_BUTTON, b: 1, d: down });
  }

  onStart(e) {
    e.preventDefault(); // no emulated mouse events, no page zoom or scroll
    if (!this.o.active()) return;
    if (e.touches.length >= 2) {
      if (this.buttonDown) this.button(false);
      this.one = null;
      this.two = midpoint(e.touches[0], e.touches[1]);
      return;
    }
    const t = e.changedTouches[0];
    this.one = { id: t.identifier, x: t.clientX, y: t.clientY, dragging: false };
    this.moveTo(t); // the pointer goes where the finger is (hover) before any click
  }

  onMove(e) {
    e.preventDefault();
    if (!this.o.active()) return;
    if (this.two && e.touches.length >= 2) {
      const m = midpoint(e.touches[0], e.touches[1]);
      const dx = notches(this.two.x - m.x), dy = notches(this.two.y - m.y);
      if (Math.abs(dx) >= MIN_NOTCHES || Math.abs(dy) >= MIN_NOTCHES) { // smaller moves keep adding up
        this.o.send({ t: InputType.WHEEL, dx, dy });
        this.two = { x: this.two.x - dx * TOUCH_PX_PER_NOTCH, y: this.two.y - dy * TOUCH_PX_PER_NOTCH };
      }
      return;
    }
    const g = this.one;
    const t = g && Array.from(e.changedTouches).find((x) => x.identifier === g.id);
    if (!t) return;
    if (!g.dragging && Math.hypot(t.clientX - g.x, t.clientY - g.y) >= TAP_SLOP_PX) {
      g.dragging = true;
      this.button(true); // pressed where the finger went down (the pointer is there already)
    }
    if (g.dragging) this.moveTo(t);
  }

  onEnd(e) {
    e.preventDefault();
    if (e.touches.length === 0) this.two = null;
    const g = this.one;
    const t = g && Array.from(e.changedTouches).find((x) => x.identifier === g.id);
    if (!t) return;
    this.one = null;
    if (!this.o.active()) { if (this.buttonDown) this.button(false); return; }
    if (g.dragging) {
      this.moveTo(t);
      this.button(false);
    } else {
      this.button(true); // a tap: click where the finger was
      this.button(false);
    }
  }

  // ---- on-screen keyboard --------------------------------------------------------------------
  press(code, shift) {
    if (shift) this.o.send({ t: InputType.KEY, c: "ShiftLeft", d: true });
    this.o.send({ t: InputType.KEY, c: code, d: true });
    this.o.send({ t: InputType.KEY, c: code, d: false });
    if (shift) this.o.send({ t: InputType.KEY, c: "ShiftLeft", d: false });
  }

  onKeyboardKey(e) {
    if (!OSK_KEYS.has(e.key) || !this.o.active()) return;
    e.preventDefault(); // no "input" event follows: the key is sent once, here
    this.press(e.key, false);
  }

  onKeyboardInput(e) {
    const osk = this.o.keyboardInput;
    const text = osk.value;
    osk.value = "";
    if (!this.o.active()) return;
    if (e.inputType === "deleteContentBackward") { this.press("Backspace", false); return; }
    let other = ""; // characters with no US key, sent as text in order with the keys around them
    const flush = () => {
      for (const chunk of textChunks(other)) this.o.send({ t: InputType.TEXT, text: chunk });
      other = "";
    };
    for (const ch of text) {
      const k = keyForChar(ch);
      if (k) { flush(); this.press(k.code, k.shift); } else other += ch;
    }
    flush();
  }
}

function midpoint(a, b) {
  return { x: (a.clientX + b.clientX) / 2, y: (a.clientY + b.clientY) / 2 };
}

/** Finger travel (CSS px, positive: fingers moved up or left) as wheel notches, 2 decimals, within the limit. */
function notches(px) {
  const v = Math.round(clamp(px / TOUCH_PX_PER_NOTCH, -WHEEL_MAX_NOTCHES, WHEEL_MAX_NOTCHES) * 100) / 100;
  return v === 0 ? 0 : v;
}
