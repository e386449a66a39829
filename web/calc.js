// Pure calculations of the viewer: no DOM, no clock, no I/O (tests/web/test_calc.py runs them in Node).

import {
  GAMEPAD_MAX_AXES, GAMEPAD_MAX_BUTTONS, GAMEPAD_MAX_INDEX, InputType, WHEEL_MAX_NOTCHES,
} from "./protocol.js";

export const WHEEL_PX_PER_NOTCH = 100; // Chromium/Firefox report 100 px (DOM_DELTA_PIXEL) per mouse-wheel notch
export const WHEEL_LINES_PER_NOTCH = 3; // DOM_DELTA_LINE: three lines per notch
export const PROFILE_LIMITS = Object.freeze({ minW: 160, minH: 120, maxW: 7680, maxH: 4320 }); // broker PROFILE_SCHEMA
export const RESIZE_LIMITS = Object.freeze({ minW: 64, minH: 64, maxW: 7680, maxH: 4320 }); // node's bounds for "rs"

export const even = (n) => Math.floor(n / 2) * 2;
export const clamp = (v, lo, hi) => Math.min(hi, Math.max(lo, v));

/** Even pixel size within limits (4:2:0 video needs even dimensions). */
export function evenSize(width, height, limits) {
  return {
    width: clamp(even(Math.round(width)), limits.minW, limits.maxW),
    height: clamp(even(Math.round(height)), limits.minH, limits.maxH),
  };
}

/**
 * The on-screen rectangle of a video's picture inside its element box when scaled with
 * object-fit: contain (letterbox or pillarbox bars around it).  null while the size is unknown.
 */
export function contentRect(box, videoW, videoH) {
  if (!videoW || !videoH || !box.width || !box.height) return null;
  const scale = Math.min(box.width / videoW, box.height / videoH);
  const w = videoW * scale, h = videoH * scale;
  return { left: box.left + (box.width - w) / 2, top: box.top + (box.height - h) / 2, width: w, height: h };
}

/** A client point as 0..1 coordinates of the picture (clamped to its edges), 5 decimals. */
export function relativePoint(rect, clientX, clientY) {
  const r5 = (v) => Math.round(v * 1e5) / 1e5;
  return { x: r5(clamp((clientX - rect.left) / rect.width, 0, 1)), y: r5(clamp((clientY - rect.top) / rect.height, 0, 1)) };
}

/** Wheel delta in notches for a WheelEvent.deltaMode, clamped to the protocol limit; 2 decimals. */
export function wheelNotches(delta, mode) {
  const perNotch = mode === 1 ? WHEEL_LINES_PER_NOTCH : mode === 2 ? 1 : WHEEL_PX_PER_NOTCH;
  const v = Math.round(clamp(delta / perNotch, -WHEEL_MAX_NOTCHES, WHEEL_MAX_NOTCHES) * 100) / 100;
  return v === 0 ? 0 : v; // no -0 on the wire
}

/**
 * Estimated queue wait in seconds: position / (queue advances per second seen since joining).
 * null until at least one seat has been handed out while we waited.
 */
export function estimateWaitS(position, advances, elapsedS) {
  if (!Number.isFinite(position) || !(advances > 0) || !(elapsedS > 0)) return null;
  return position / (advances / elapsedS);
}

export const RTP_VIDEO_CLOCK_PER_MS = 90; // the node's RTP timestamps: its render clock at 90 kHz + a random origin
export const RTP_WRAP = 2 ** 32;

/** The most common value in a list (of tied values, the first to reach the top count), or null when empty. */
export function mode(values) {
  const counts = new Map();
  let best = null, bestCount = 0;
  for (const v of values) {
    const c = (counts.get(v) || 0) + 1;
    counts.set(v, c);
    if (c > bestCount) { best = v; bestCount = c; }
  }
  return best;
}

/**
 * Render-time gap (ms) between the frame a requestVideoFrameCallback describes and the frame
 * whose stamp was read from the drawn image: under load Chromium can draw a newer frame than its
 * metadata describes. `offset` = (rtpTimestamp - stampMs * 90) mod 2^32 is the same for every
 * correctly paired sample (the RTP origin), so a sample's deviation from the usual offset
 * (`origin`, the mode of recent offsets) is that gap. 0 when either is unknown.
 */
export function rtpShiftMs(offset, origin) {
  if (offset === null || origin === null) return 0;
  let d = (((offset - origin) % RTP_WRAP) + RTP_WRAP) % RTP_WRAP;
  if (d >= RTP_WRAP / 2) d -= RTP_WRAP;
  return d / RTP_VIDEO_CLOCK_PER_MS;
}

/** (rtpTimestamp - stampMs * 90) mod 2^32, or null when the callback gave no RTP timestamp. */
export function rtpOffset(rtpTimestamp, stampMs) {
  if (typeof rtpTimestamp !== "number") return null;
  return (((rtpTimestamp - stampMs * RTP_VIDEO_CLOCK_PER_MS) % RTP_WRAP) + RTP_WRAP) % RTP_WRAP;
}

// A canary class's count per running minute of the sessions whose nodes reported it (the rollout
// judge's rate, broker/rollout/policy.py ClassHealth.per_min), 2 decimals; "–" when nobody reported it.
export function perMinute(count, minutes) {
  if (!Number.isFinite(count)) return "–";
  return minutes > 0 ? (count / minutes).toFixed(2) : "0.00";
}

const round3 = (v) => Math.round(v * 1000) / 1000;

/**
 * The "gp" message for one Gamepad API pad, or null when it must not be sent: an index past
 * GAMEPAD_MAX_INDEX, or a pad the browser does not know the layout of (mapping !== "standard": its
 * button and axis numbers mean something else, and the node's virtual pad would press the wrong buttons).
 */
export function gamepadMessage(pad) {
  if (!pad || pad.index > GAMEPAD_MAX_INDEX || pad.mapping !== "standard") return null;
  return {
    t: InputType.GAMEPAD, i: pad.index,
    ax: Array.from(pad.axes).slice(0, GAMEPAD_MAX_AXES).map((v) => round3(clamp(v, -1, 1))),
    bt: Array.from(pad.buttons).slice(0, GAMEPAD_MAX_BUTTONS).map((b) => round3(clamp(b.value, 0, 1))),
  };
}
