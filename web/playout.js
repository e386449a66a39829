// Receive-side buffering: how long the viewer's jitter buffer holds each frame before showing it.
//
// Cloud gaming wants the picture as soon as it is decoded.  The node sends the RTP playout-delay
// extension with min = max = 0 (streamer/media/peer.py), which makes Chromium show each frame once
// it is complete and decoded, without its jitter-buffer wait (~1.5 frames at 60 fps on loopback).
// This module keeps the receiver's own floor (RTCRtpReceiver.jitterBufferTarget) at 0 while the
// path is smooth and raises it only when the measured jitter needs a buffer: RFC 3550 interarrival
// jitter (inbound-rtp `jitter`, a mean deviation) over JITTER_GROW_MS means frames often arrive
// more than a frame interval late, and the picture would judder.  The floor is then
// JITTER_FACTOR x the highest jitter of the last SHRINK_AFTER_MS (about the p99 of the arrival
// deviation), so it grows at once and shrinks only after the jitter has stayed lower that long.
// Chromium ignores the floor while the extension's maximum is 0, so the node relaxes the maximum on
// the same figure (its receiver reports carry this jitter) with the same two constants
// (streamer/abr/playout.py; tests/web/test_playout.py checks they agree).  Both judge the path's
// share of the jitter: the node reports its own (render-to-send times vary with its encoder and CPU;
// its stats event's send_jitter_ms), and a buffer here cannot make a late node on time, only later.
//
// playoutTarget() is pure (state, jitter, now) -> decision; PlayoutControl applies it to a
// receiver from the stats reports its owner reads anyway (no getStats of its own).
//
// Modes: "low" (the default: negotiate the extension, floor 0, grow on jitter) and "browser"
// (leave Chromium's own buffering: the extension is not negotiated and the floor never set;
// bench/bench_glass.py measures both side by side, a page opened with ?playout=browser uses it).

export const PLAYOUT_DELAY_URI = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay";
export const PLAYOUT_MODES = Object.freeze(["low", "browser"]);
export const JITTER_GROW_MS = 20; // RFC 3550 jitter above this needs a buffer (3 x 20 = 60 ms: 3.5 frames at 60 fps)
export const JITTER_FACTOR = 3; // buffer = this x jitter (the mean deviation): about its p99 for a Laplace spread
export const SHRINK_AFTER_MS = 5000; // the buffer follows the highest jitter of this window: it shrinks this late
export const BUFFER_STEP_MS = 10; // targets are multiples of this (the extension's unit; fewer changes)
export const MAX_BUFFER_MS = 250; // never more than this (a path this jittery needs a lower bitrate, not a buffer)

/** A fresh policy state: no jitter seen, floor 0. */
export function initialPlayout() {
  return { peaks: [], targetMs: 0 };
}

/**
 * Fold one jitter sample (ms, or null when unknown) taken at nowMs into the state.
 * Returns {targetMs, changed, reason, state}: the floor to set on the receiver, whether it differs
 * from the previous one, and why ("smooth": jitter under JITTER_GROW_MS, "jitter": a buffer for it,
 * "max": capped at MAX_BUFFER_MS).
 */
export function playoutTarget(state, jitterMs, nowMs) {
  // a monotonic windowed maximum: (time, jitter) pairs, values strictly decreasing front to back
  let peaks = state.peaks.filter(([t]) => t > nowMs - SHRINK_AFTER_MS);
  if (Number.isFinite(jitterMs) && jitterMs >= 0) {
    peaks = peaks.filter(([, v]) => v > jitterMs);
    peaks.push([nowMs, jitterMs]);
  }
  const peak = peaks.length ? peaks[0][1] : 0;
  let targetMs = 0, reason = "smooth";
  if (peak > JITTER_GROW_MS) {
    targetMs = Math.ceil((JITTER_FACTOR * peak) / BUFFER_STEP_MS) * BUFFER_STEP_MS;
    reason = "jitter";
    if (targetMs > MAX_BUFFER_MS) { targetMs = MAX_BUFFER_MS; reason = "max"; }
  }
  return { targetMs, changed: targetMs !== state.targetMs, reason, state: { peaks, targetMs } };
}

/** The path's share of the viewer's jitter (ms): independent deviations add as squares. */
export function pathJitterMs(viewerMs, nodeMs) {
  if (!Number.isFinite(viewerMs)) return null;
  const node = Number.isFinite(nodeMs) ? nodeMs : 0;
  return Math.sqrt(Math.max(0, viewerMs * viewerMs - node * node));
}

/** The inbound video's RFC 3550 jitter in ms from a getStats() report (null when not there yet). */
export function inboundJitterMs(report) {
  let jitter = null;
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "video" && Number.isFinite(s.jitter)) jitter = s.jitter * 1000;
  });
  return jitter;
}

/**
 * Ask for (mode "low") or leave out (mode "browser") the playout-delay extension on a transceiver, before
 * the offer.  Returns false where the browser cannot choose (no setHeaderExtensionsToNegotiate): its default.
 */
export function negotiatePlayoutDelay(transceiver, mode) {
  if (!transceiver.getHeaderExtensionsToNegotiate || !transceiver.setHeaderExtensionsToNegotiate) return false;
  const wanted = mode === "browser" ? "stopped" : "recvonly";
  const exts = transceiver.getHeaderExtensionsToNegotiate().map((e) => (
    e.uri === PLAYOUT_DELAY_URI ? { ...e, direction: wanted } : e));
  try {
    transceiver.setHeaderExtensionsToNegotiate(exts);
  } catch {
    return false; // a browser that refuses the change keeps its default
  }
  return true;
}

/** Applies playoutTarget() to one receiver (mode "low"); does nothing in mode "browser". */
export class PlayoutControl {
  /** @param {RTCRtpReceiver} receiver  @param {string} mode  "low" | "browser" */
  constructor(receiver, mode = "low") {
    this.receiver = receiver;
    this.mode = PLAYOUT_MODES.includes(mode) ? mode : "low";
    this.state = initialPlayout();
    this.nodeJitterMs = 0; // the node's own share of the jitter (its stats event), taken out
    this.reason = this.mode === "low" ? "smooth" : "browser";
    if (this.mode === "low") this.apply(0);
  }

  /** The floor in force (ms), or null when the browser's own buffering is left alone. */
  get targetMs() { return this.mode === "low" ? this.state.targetMs : null; }

  /** Feed one stats report (the caller's periodic getStats()); nowMs: performance.now(). */
  observe(report, nowMs) {
    if (this.mode !== "low") return;
    const d = playoutTarget(this.state, pathJitterMs(inboundJitterMs(report), this.nodeJitterMs), nowMs);
    this.state = d.state;
    this.reason = d.reason;
    if (d.changed) this.apply(d.targetMs);
  }

  apply(ms) {
    if (!("jitterBufferTarget" in this.receiver)) return;
    try { this.receiver.jitterBufferTarget = ms; } catch { /* out of the browser's range: keep its value */ }
  }
}
