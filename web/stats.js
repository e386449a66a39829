// Stream statistics for the viewer's overlay and test hook: a summary of the inbound video from
// RTCPeerConnection.getStats(), and glass-to-glass latency read from frame stamps.
//
// readStats() is a function of (peer connection, previous sample): rates are deltas against the
// previous periodic sample the caller keeps.  FrameStamps samples the displayed video a few times a
// second (requestVideoFrameCallback) and keeps the recent glass-to-glass values; takeFresh() hands the
// ones measured since its last call to the "vs" message that reports them to the node.

import { mode, rtpOffset, rtpShiftMs } from "./calc.js";
import { el, fmtBitrate, fmtNum, render } from "./common.js";
import { STAMP_COLUMNS, STAMP_ROWS, cellBits, median, parseStamp, stampHeight } from "./stamp.js";
import { VIEWER_STATS_MAX_SAMPLES } from "./protocol.js";

const STAMP_SCALE = 4; // stamp strip sampled at 4 x 4 canvas pixels per cell
const STAMP_SAMPLE_MS = 250; // read a frame stamp at most this often (4x slower after repeated misses)
const FRAME_NUMBERS_KEPT = 600; // frame numbers kept for comparing what two pages decoded (20 s at 30 fps)
const STAMP_WINDOW = 30; // glass-to-glass is the median of this many recent stamped frames

/**
 * Summary of the inbound video: fps, resolution, bitrate, RTT, jitter, loss, decode time, jitter
 * buffer.  `prev` is an earlier result (or null); `extra` is merged in (input RTT, node stats, ...).
 */
export async function readStats(pc, prev, extra = {}) {
  const report = await pc.getStats();
  let inbound = null, transport = null, pair = null;
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "video") inbound = s;
    else if (s.type === "transport") transport = s;
  });
  if (transport && transport.selectedCandidatePairId) pair = report.get(transport.selectedCandidatePairId);
  if (!pair) report.forEach((s) => { if (s.type === "candidate-pair" && s.nominated && s.state === "succeeded") pair = s; });
  const codec = inbound && inbound.codecId ? report.get(inbound.codecId) : null;
  const local = pair && pair.localCandidateId ? report.get(pair.localCandidateId) : null;
  const i = inbound || {};
  const out = {
    connectionState: pc.connectionState,
    codec: codec ? codec.mimeType.replace(/^video\//, "") : null,
    width: i.frameWidth ?? null,
    height: i.frameHeight ?? null,
    fps: i.framesPerSecond ?? null,
    framesDecoded: i.framesDecoded ?? 0,
    framesDropped: i.framesDropped ?? 0,
    bytesReceived: i.bytesReceived ?? 0,
    packetsReceived: i.packetsReceived ?? 0,
    packetsLost: i.packetsLost ?? 0,
    totalDecodeTime: i.totalDecodeTime ?? 0,
    jitterMs: Number.isFinite(i.jitter) ? i.jitter * 1000 : null,
    localCandidateType: local ? local.candidateType : null, // host | srflx | prflx | relay
    rttMs: pair && Number.isFinite(pair.currentRoundTripTime) ? pair.currentRoundTripTime * 1000 : null,
    decodeMs: i.framesDecoded ? (i.totalDecodeTime / i.framesDecoded) * 1000 : null,
    jitterBufferMs: i.jitterBufferEmittedCount ? (i.jitterBufferDelay / i.jitterBufferEmittedCount) * 1000 : null,
    jitterBufferDelay: i.jitterBufferDelay ?? 0, // s, summed over frames (the figure above is recent)
    jitterBufferEmittedCount: i.jitterBufferEmittedCount ?? 0,
    bitrateBps: null,
    lossPct: null,
    timestamp: inbound ? inbound.timestamp : null,
    ...extra,
  };
  if (prev && inbound && prev.timestamp !== null && out.timestamp > prev.timestamp) {
    const dt = (out.timestamp - prev.timestamp) / 1000;
    out.bitrateBps = ((out.bytesReceived - prev.bytesReceived) * 8) / dt;
    const lost = out.packetsLost - prev.packetsLost, got = out.packetsReceived - prev.packetsReceived;
    out.lossPct = lost + got > 0 ? (Math.max(0, lost) / (lost + got)) * 100 : 0;
    const emitted = out.jitterBufferEmittedCount - (prev.jitterBufferEmittedCount ?? 0);
    if (emitted > 0) out.jitterBufferMs = ((out.jitterBufferDelay - (prev.jitterBufferDelay ?? 0)) / emitted) * 1000;
    const frames = out.framesDecoded - prev.framesDecoded;
    if (frames > 0) {
      out.decodeMs = ((out.totalDecodeTime - prev.totalDecodeTime) / frames) * 1000; // recent, not lifetime
      if (out.fps === null) out.fps = frames / dt;
    }
  }
  return out;
}

/** Fill the overlay box with a stats summary (or a waiting note). */
export function renderStats(box, s) {
  if (!s) { render(box, el("div", { class: "title" }, "Stats"), el("div", {}, "waiting for video…")); return; }
  const row = (k, v) => [el("dt", {}, k), el("dd", {}, v)];
  const n = s.node || {};
  render(box, el("div", { class: "title" }, "Stream stats · F8 to hide"), el("dl", {},
    row("Resolution", s.width ? `${s.width}×${s.height}` : "–"),
    row("Frame rate", fmtNum(s.fps, 0, " fps")),
    row("Bitrate", fmtBitrate(s.bitrateBps)),
    row("Codec", s.codec || "–"),
    row("Path", s.localCandidateType === "relay" ? "relay (TURN)" : s.localCandidateType || "–"),
    row("RTT (ICE)", fmtNum(s.rttMs, 1, " ms")),
    row("Input RTT", fmtNum(s.inputRttMs, 1, " ms")),
    Number.isFinite(n.probe_rtt_ms) ? row("Probe RTT (node)", fmtNum(n.probe_rtt_ms, 1, " ms")) : null,
    row("Jitter", fmtNum(s.jitterMs, 1, " ms")),
    row("Packet loss", fmtNum(s.lossPct, 2, " %")),
    row("Decode time", fmtNum(s.decodeMs, 2, " ms")),
    row("Jitter buffer", fmtNum(s.jitterBufferMs, 1, " ms")),
    row("Buffer floor", s.playoutMode === "browser" ? "browser default"
      : fmtNum(s.playoutTargetMs, 0, s.playoutMode === "sync" ? " ms (lip sync)" : " ms")),
    row("Frames dropped", String(s.framesDropped)),
    n.encoder ? row("Encoder", String(n.encoder)) : null,
    Number.isFinite(n.encode_ms) ? row("Encode time", fmtNum(n.encode_ms, 2, " ms")) : null,
    Number.isFinite(n.target_bps) ? row("Target bitrate", fmtBitrate(n.target_bps)) : null,
    row("Glass to glass", s.glassToGlassMs === null || s.glassToGlassMs === undefined ? "n/a (no frame stamp)"
      : fmtNum(s.glassToGlassMs, 0, " ms"))));
}

/** Glass-to-glass latency from the render stamps in displayed frames (when the stream has them). */
export class FrameStamps {
  /** @param {HTMLVideoElement} video  @param {() => boolean} active  sample only while this is true
   *  @param {{everyFrame?: boolean}} [opts]  everyFrame: read every frame's stamp (else every STAMP_SAMPLE_MS) */
  constructor(video, active, opts = {}) {
    this.video = video;
    this.active = active;
    this.everyFrame = Boolean(opts.everyFrame);
    this.frameNumbers = []; // frame numbers of the newest stamped frames read (at most FRAME_NUMBERS_KEPT)
    this.samples = [];
    this.fresh = []; // samples not yet reported to the node (takeFresh), the newest VIEWER_STATS_MAX_SAMPLES
    this.offsets = []; // recent RTP offsets (see rtpShiftMs), to pair each sample with its frame
    this.misses = 0;
    this.lastAt = 0;
    this.ctx = null;
  }

  /** Start the per-frame callback loop (once; it follows whatever stream the element shows). */
  start() {
    const v = this.video;
    if (!("requestVideoFrameCallback" in v)) return;
    const loop = (_now, meta) => {
      this.onFrame(meta);
      v.requestVideoFrameCallback(loop);
    };
    v.requestVideoFrameCallback(loop);
  }

  /** Forget old samples (a new connection). */
  reset() {
    this.samples = [];
    this.fresh = [];
    this.offsets = [];
    this.misses = 0;
  }

  /** Median of the recent samples in ms, or null when no frame carried a stamp. */
  get glassToGlassMs() {
    return median(this.samples);
  }

  /** The samples (ms, 0.1 ms steps) measured since the last call, oldest first; [] when there are none. */
  takeFresh() {
    const out = this.fresh.map((ms) => Math.round(ms * 10) / 10);
    this.fresh = [];
    return out;
  }

  onFrame(meta) {
    const v = this.video;
    if (!this.active() || !v.videoWidth) return;
    const now = performance.now();
    if (!this.everyFrame && now - this.lastAt < (this.misses > 8 ? 4 * STAMP_SAMPLE_MS : STAMP_SAMPLE_MS)) return;
    this.lastAt = now;
    const cw = STAMP_COLUMNS * STAMP_SCALE, ch = STAMP_ROWS * STAMP_SCALE;
    if (!this.ctx) {
      const canvas = document.createElement("canvas");
      canvas.width = cw;
      canvas.height = ch;
      this.ctx = canvas.getContext("2d", { willReadFrequently: true });
    }
    try {
      this.ctx.drawImage(v, 0, 0, v.videoWidth, stampHeight(v.videoWidth), 0, 0, cw, ch);
      const stamp = parseStamp(cellBits(this.ctx.getImageData(0, 0, cw, ch).data, STAMP_SCALE));
      if (!stamp) { this.misses += 1; return; }
      this.misses = 0;
      this.frameNumbers.push(stamp.frameNo);
      if (this.frameNumbers.length > FRAME_NUMBERS_KEPT) this.frameNumbers.shift();
      const shownAt = performance.timeOrigin + (meta && meta.expectedDisplayTime ? meta.expectedDisplayTime : now);
      // the metadata's frame may be older than the drawn one: measure from the metadata frame's render time
      const offset = rtpOffset(meta ? meta.rtpTimestamp : undefined, stamp.tsMs);
      if (offset !== null) {
        this.offsets.push(offset);
        if (this.offsets.length > STAMP_WINDOW) this.offsets.shift();
      }
      const g2g = shownAt - (stamp.tsMs + rtpShiftMs(offset, mode(this.offsets)));
      if (g2g > -1000 && g2g < 60_000) { // clocks of different machines may disagree: keep plausible values only
        this.samples.push(g2g);
        if (this.samples.length > STAMP_WINDOW) this.samples.shift();
        this.fresh.push(g2g);
        if (this.fresh.length > VIEWER_STATS_MAX_SAMPLES) this.fresh.shift();
      }
    } catch { /* no decodable frame yet */ }
  }
}
