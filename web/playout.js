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
// Modes: "low" (games: negotiate the extension, floor 0, grow on jitter), "sync" (desktops with
// sound: the picture waits for the sound, below) and "browser" (leave Chromium's own buffering: the
// extension is not negotiated and the floor never set; bench/bench_glass.py measures it beside "low").
// defaultPlayoutMode() says which one a session gets.
//
// "sync": the node sends picture and sound as separate streams, so Chromium does no lip sync of its
// own, and "low" shows each frame as soon as it is decoded while the sound waits in Chromium's audio
// jitter buffer (NetEq, 36-111 ms on a loaded 2-core viewer) and the audio output (~42 ms): the sound
// came 70-140 ms after the picture (bench/bench_avsync.py).  In "sync" the extension is not negotiated
// (with its maximum at 0 Chromium ignores the floor) and every SYNC_INTERVAL_MS the video floor
// follows the sound's measured delay: NetEq's current hold (audio inbound-rtp jitterBufferDelay /
// jitterBufferEmittedCount over the interval) plus the output's (media-playout totalPlayoutDelay /
// totalSamplesCount, or the owner's outputLatencyMs where Chromium has no such stats), less what
// the video path holds beyond its floor (video inbound-rtp totalProcessingDelay / framesDecoded over
// the interval, arrival to decoded, less the floor in force).  Smoothed (SYNC_SMOOTHING of the way
// each step), within [0, MAX_SYNC_MS].  No constant: if the floor is under the video's own buffering
// the measured video delay does not follow it and the next step raises it by the gap.

export const PLAYOUT_DELAY_URI = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay";
export const PLAYOUT_MODES = Object.freeze(["low", "sync", "browser"]);
export const JITTER_GROW_MS = 20; // RFC 3550 jitter above this needs a buffer (3 x 20 = 60 ms: 3.5 frames at 60 fps)
export const JITTER_FACTOR = 3; // buffer = this x jitter (the mean deviation): about its p99 for a Laplace spread
export const SHRINK_AFTER_MS = 5000; // the buffer follows the highest jitter of this window: it shrinks this late
export const BUFFER_STEP_MS = 10; // targets are multiples of this (the extension's unit; fewer changes)
export const MAX_BUFFER_MS = 250; // never more than this (a path this jittery needs a lower bitrate, not a buffer)
export const SYNC_INTERVAL_MS = 500; // "sync": the floor is re-evaluated this often (deltas of the cumulative stats)
export const SYNC_SMOOTHING = 0.5; // "sync": each step moves the floor this share of the way to the wanted one
export const MAX_SYNC_MS = 400; // "sync": never hold the picture longer than this for the sound

/**
 * The mode a session gets: the page's ?playout= when it names one (benchmarks, debugging), else the
 * user's choice for this kind of pool (the toolbar's "Lip sync" toggle, remembered), else "low" for
 * games (latency matters more than sync) and "sync" for desktops (their sound: videos, calls).
 * @param {string | null} param  the page's ?playout= value  @param {string | null} saved  the user's choice
 * @param {boolean} game  a game pool
 */
export function defaultPlayoutMode(param, saved, game) {
  if (PLAYOUT_MODES.includes(param)) return param;
  if (saved === "sync" || saved === "low") return saved;
  return game ? "low" : "sync";
}

/** The cumulative counters "sync" reads from one getStats() report (absent ones are null). */
export function syncCounters(report) {
  const c = { audioDelayS: null, audioEmitted: null, playoutDelayS: null, playoutSamples: null,
    videoProcessingS: null, videoDecoded: null };
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      c.audioDelayS = s.jitterBufferDelay ?? null;
      c.audioEmitted = s.jitterBufferEmittedCount ?? null;
    } else if (s.type === "inbound-rtp" && s.kind === "video") {
      c.videoProcessingS = s.totalProcessingDelay ?? null;
      c.videoDecoded = s.framesDecoded ?? null;
    } else if (s.type === "media-playout" && (s.kind === undefined || s.kind === "audio")) {
      c.playoutDelayS = s.totalPlayoutDelay ?? null;
      c.playoutSamples = s.totalSamplesCount ?? null;
    }
  });
  return c;
}

/** Mean ms per unit of a cumulative (seconds, count) pair between two readings; null without new units. */
function perUnitMs(prevS, curS, prevN, curN) {
  if (![prevS, curS, prevN, curN].every(Number.isFinite)) return null;
  const n = curN - prevN;
  return n > 0 ? ((curS - prevS) / n) * 1000 : null;
}

/**
 * The delays of the interval between two syncCounters() readings (ms, null where unknown): audioMs
 * (NetEq's hold), outputMs (the audio output's, from media-playout), videoMs (arrival to decoded).
 */
export function syncDelays(prev, cur) {
  return {
    audioMs: perUnitMs(prev.audioDelayS, cur.audioDelayS, prev.audioEmitted, cur.audioEmitted),
    outputMs: perUnitMs(prev.playoutDelayS, cur.playoutDelayS, prev.playoutSamples, cur.playoutSamples),
    videoMs: perUnitMs(prev.videoProcessingS, cur.videoProcessingS, prev.videoDecoded, cur.videoDecoded),
  };
}

/**
 * One "sync" step (pure): the floor that makes the picture wait as long as the sound.
 * d: syncDelays() of the last interval; fallbackOutputMs: the output latency where d has none;
 * floorMs: the floor in force during the interval.  Returns {targetMs, wantedMs, ownMs, soundMs, outputMs}
 * (ms), or null when either path had no new samples (the floor stays).
 */
export function syncTarget(d, fallbackOutputMs, floorMs) {
  if (!Number.isFinite(d.audioMs) || !Number.isFinite(d.videoMs)) return null;
  const outputMs = Number.isFinite(d.outputMs) ? d.outputMs : (Number.isFinite(fallbackOutputMs) ? fallbackOutputMs : 0);
  const ownMs = d.videoMs - floorMs; // the video path's delay beyond its floor
  const wantedMs = Math.min(MAX_SYNC_MS, Math.max(0, d.audioMs + outputMs - ownMs));
  const targetMs = Math.round(floorMs + SYNC_SMOOTHING * (wantedMs - floorMs));
  return { targetMs, wantedMs, ownMs, soundMs: d.audioMs + outputMs, outputMs };
}

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
 * Ask for (mode "low") or leave out (modes "sync", "browser") the playout-delay extension on a transceiver, before
 * the offer.  Returns false where the browser cannot choose (no setHeaderExtensionsToNegotiate): its default.
 */
export function negotiatePlayoutDelay(transceiver, mode) {
  if (!transceiver.getHeaderExtensionsToNegotiate || !transceiver.setHeaderExtensionsToNegotiate) return false;
  const wanted = mode === "low" ? "recvonly" : "stopped"; // "sync" sets a floor: a maximum of 0 would void it
  const exts = transceiver.getHeaderExtensionsToNegotiate().map((e) => (
    e.uri === PLAYOUT_DELAY_URI ? { ...e, direction: wanted } : e));
  try {
    transceiver.setHeaderExtensionsToNegotiate(exts);
  } catch {
    return false; // a browser that refuses the change keeps its default
  }
  return true;
}

/** Applies playoutTarget() (mode "low") or syncTarget() (mode "sync") to one receiver; nothing in mode "browser". */
export class PlayoutControl {
  /** @param {RTCRtpReceiver} receiver  @param {string} mode  "low" | "sync" | "browser" */
  constructor(receiver, mode = "low") {
    this.receiver = receiver;
    this.mode = PLAYOUT_MODES.includes(mode) ? mode : "low";
    this.state = initialPlayout();
    this.nodeJitterMs = 0; // the node's own share of the jitter (its stats event), taken out
    this.reason = this.mode === "browser" ? "browser" : this.mode === "sync" ? "sync" : "smooth";
    this.outputLatencyMs = null; // "sync": the audio output's latency where Chromium reports no media-playout
    this.sync = { counters: null, atMs: -Infinity, last: null }; // "sync": the previous reading, the last step
    if (this.mode !== "browser") this.apply(0);
  }

  /** The floor in force (ms), or null when the browser's own buffering is left alone. */
  get targetMs() { return this.mode === "browser" ? null : this.state.targetMs; }

  /** Feed one stats report (the caller's periodic getStats()); nowMs: performance.now(). */
  observe(report, nowMs) {
    if (this.mode === "sync") { this.observeSync(report, nowMs); return; }
    if (this.mode !== "low") return;
    const d = playoutTarget(this.state, pathJitterMs(inboundJitterMs(report), this.nodeJitterMs), nowMs);
    this.state = d.state;
    this.reason = d.reason;
    if (d.changed) this.apply(d.targetMs);
  }

  observeSync(report, nowMs) {
    if (nowMs - this.sync.atMs < SYNC_INTERVAL_MS) return;
    const counters = syncCounters(report);
    const prev = this.sync.counters;
    this.sync.counters = counters;
    this.sync.atMs = nowMs;
    if (!prev) return;
    const step = syncTarget(syncDelays(prev, counters), this.outputLatencyMs, this.state.targetMs);
    if (!step) return;
    this.sync.last = step;
    if (step.targetMs !== this.state.targetMs) {
      this.state = { ...this.state, targetMs: step.targetMs };
      this.apply(step.targetMs);
    }
  }

  apply(ms) {
    if (!("jitterBufferTarget" in this.receiver)) return;
    try { this.receiver.jitterBufferTarget = ms; } catch { /* out of the browser's range: keep its value */ }
  }
}
