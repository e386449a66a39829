// The remote screen follows this window (protocol v4, "rs").
//
// The video area's size in device pixels (CSS pixels x devicePixelRatio: text stays sharp on 2x
// screens) goes to the node, debounced, whenever it changes: window resizes, zoom, a move to a screen
// of another pixel ratio, a new data channel.  "Sharp (HiDPI)" off sends CSS pixels instead (4x fewer
// pixels to encode at 2x: for weak links); the choice is remembered in localStorage.  The node fits
// the size to its limits (streamer/abr/viewport.py) and the video element shows whatever arrives.

import { InputType } from "./protocol.js";
import { RESIZE_LIMITS, evenSize } from "./calc.js";

export const RESIZE_DEBOUNCE_MS = 400;
export const HIDPI_KEY = "rb.hidpi";

/** The size to ask for: the area in CSS pixels, times the pixel ratio when HiDPI is on; even, within the node's bounds. */
export function wantedSize(cssWidth, cssHeight, pixelRatio, hidpi) {
  const scale = hidpi && Number.isFinite(pixelRatio) && pixelRatio > 0 ? pixelRatio : 1;
  const { width, height } = evenSize(cssWidth * scale, cssHeight * scale, RESIZE_LIMITS);
  return { w: width, h: height };
}

function readHiDpi() {
  try { return localStorage.getItem(HIDPI_KEY) !== "0"; } catch { return true; }
}

export class ResizeFollower {
  /**
   * @param {object} o
   * @param {HTMLElement} o.area  the element whose box is the remote screen's (the stream view)
   * @param {(msg: object) => boolean} o.send  false while the channel is closed
   * @param {() => boolean} o.allowed  the pool accepts "rs" (allow_resize)
   * @param {() => boolean} o.active  streaming with an open channel
   * @param {HTMLButtonElement | null} o.button  the "Sharp (HiDPI)" toggle (aria-pressed)
   */
  constructor(o) {
    this.o = o;
    this.hidpi = readHiDpi();
    this.last = "";
    this.timer = 0;
  }

  attach() {
    const later = () => this.schedule();
    window.addEventListener("resize", later);
    if (typeof ResizeObserver === "function") new ResizeObserver(later).observe(this.o.area);
    this.watchRatio();
    if (this.o.button) {
      this.o.button.addEventListener("click", () => this.setHiDpi(!this.hidpi));
      this.render();
    }
  }

  /** devicePixelRatio changes (zoom, another screen) fire no resize event in every browser. */
  watchRatio() {
    if (!window.matchMedia) return;
    const mq = window.matchMedia(`(resolution: ${window.devicePixelRatio}dppx)`);
    mq.addEventListener("change", () => { this.schedule(); this.watchRatio(); }, { once: true });
  }

  setHiDpi(on) {
    this.hidpi = Boolean(on);
    try { localStorage.setItem(HIDPI_KEY, this.hidpi ? "1" : "0"); } catch { /* private mode: this page only */ }
    this.render();
    this.send();
  }

  render() {
    if (!this.o.button) return;
    this.o.button.setAttribute("aria-pressed", String(this.hidpi));
    this.o.button.hidden = !this.o.allowed();
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.send(), RESIZE_DEBOUNCE_MS);
  }

  /** A new channel: the node has not heard our size on it. */
  channelOpened() {
    this.last = "";
    this.render();
  }

  /** Send the current size now if it differs from the last one sent; returns what was sent or null. */
  send() {
    this.render();
    if (!this.o.allowed() || !this.o.active()) return null;
    const r = this.o.area.getBoundingClientRect();
    const css = r.width > 0 && r.height > 0 ? r : { width: window.innerWidth, height: window.innerHeight };
    const size = wantedSize(css.width, css.height, window.devicePixelRatio, this.hidpi);
    const key = `${size.w}x${size.h}`;
    if (key === this.last || !this.o.send({ t: InputType.RESIZE, ...size })) return null;
    this.last = key;
    return size;
  }
}
