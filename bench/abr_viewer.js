// The Chromium viewer of bench/bench_abr.py, run in headless Chromium by bench/abr_chromium.py.
//
// It connects like the product's client (web/peer.js): the offerer, a recvonly video transceiver,
// the ordered INPUT_CHANNEL_LABEL data channel, then answerProbes(pc) (web/probe.js: the node's
// bitrate control needs the answers), one complete offer after ICE gathering.  Python hands the
// offer to the sender and the answer back (window.abr.start / answer), then collects the raw
// records with window.abr.finish(); it turns them into bench_abr's viewer result (pairing frames,
// goodput bins).  Records, all times wall clock (ms since the epoch unless said otherwise):
//   frames: per requestVideoFrameCallback with a readable stamp (web/stamp.js, sampled as
//     web/stats.js does), [callback time, metadata rtpTimestamp, stamp ts_ms, stamp frame
//     number, metadata width, height, expectedDisplayTime - presentationTime, callback time -
//     presentationTime, presentationTime - receiveTime];
//   polls: every STATS_POLL_MS, [wall s, inbound-rtp video bytesReceived, retransmittedBytesReceived (a part of it)];
//   pings: {"t":"ping"} every pingMs on the input channel; [sent wall s, rtt ms] per pong.
// Wall time = performance clock + an offset read once at a Date.now() tick (Date.now() counts whole
// ms), so every record shares one clock with the node's stamps (same machine).
//
// Per-frame work is kept small (the machine's two cores also run the sender, its encoder and the
// delay emulator): one draw of the stamp strip into a 160 x 12 canvas and one getImageData.

import { INPUT_CHANNEL_LABEL, InputType, NodeEventType } from "/web/protocol.js";
import { answerProbes } from "/web/probe.js";
import { STAMP_COLUMNS, STAMP_ROWS, cellBits, parseStamp, stampHeight } from "/web/stamp.js";

const STAMP_SCALE = 4; // canvas pixels per stamp cell, as web/stats.js
const STATS_POLL_MS = 100; // goodput poll period (bench_abr bins are 100 ms)
const ICE_GATHER_TIMEOUT_MS = 5000;
const INBOUND_KEYS = [ // kept from the last inbound-rtp report, for the run's diagnostics
  "bytesReceived", "retransmittedBytesReceived", "packetsReceived", "retransmittedPacketsReceived", "packetsLost",
  "nackCount", "pliCount", "firCount", "framesReceived", "framesDecoded", "framesDropped", "keyFramesDecoded",
  "freezeCount", "totalFreezesDuration", "pauseCount", "jitterBufferDelay", "jitterBufferEmittedCount",
  "totalDecodeTime", "decoderImplementation", "frameWidth", "frameHeight",
];

/** performance.now() + this = wall ms: read just after Date.now() ticks, where it is exact. */
function wallOffsetMs() {
  const start = Date.now();
  let now = start;
  while (now === start) now = Date.now(); // at most 1 ms
  return now - performance.now();
}

function iceGatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { clearTimeout(timer); resolve(); }
    });
  });
}

const round1 = (v) => Math.round(v * 10) / 10;

class AbrViewer {
  constructor(video) {
    this.video = video;
    this.offset = wallOffsetMs();
    this.frames = [];
    this.unreadable = 0;
    this.callbacks = 0;
    this.lastRtp = undefined;
    this.polls = [];
    this.inbound = null;
    this.pings = [];
    this.sent = new Map(); // ping id -> [sent wall ms, sent performance ms]
    this.nextId = 1;
    this.stopped = false;
    this.firstShown = false;
    const cw = STAMP_COLUMNS * STAMP_SCALE, ch = STAMP_ROWS * STAMP_SCALE;
    const canvas = document.createElement("canvas");
    canvas.width = cw;
    canvas.height = ch;
    this.ctx = canvas.getContext("2d", { willReadFrequently: true });
  }

  wallMs(perfMs) { return perfMs + this.offset; }

  /** Build the peer connection like web/peer.js; resolves to the complete offer SDP. */
  async start({ pingMs }) {
    const pc = new RTCPeerConnection({ iceServers: [], bundlePolicy: "max-bundle" });
    this.pc = pc;
    this.receiver = pc.addTransceiver("video", { direction: "recvonly" }).receiver;
    this.dc = pc.createDataChannel(INPUT_CHANNEL_LABEL, { ordered: true });
    this.probes = answerProbes(pc); // right after the input channel, before the offer (web/peer.js)
    this.dc.onmessage = (e) => this.onNodeEvent(e.data);
    pc.ontrack = (e) => {
      this.video.srcObject = e.streams && e.streams[0] ? e.streams[0] : new MediaStream([e.track]);
      this.video.play().catch(() => { /* autoplay of a muted element is allowed; play() may race srcObject */ });
    };
    this.video.requestVideoFrameCallback((now, meta) => this.onFrame(meta));
    this.pingTimer = setInterval(() => this.ping(), pingMs);
    this.pollTimer = setInterval(() => this.poll(), STATS_POLL_MS);
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, ICE_GATHER_TIMEOUT_MS);
    return pc.localDescription.sdp;
  }

  async answer(sdp) {
    await this.pc.setRemoteDescription({ type: "answer", sdp });
  }

  onFrame(meta) {
    if (this.stopped) return;
    const v = this.video;
    v.requestVideoFrameCallback((now, m) => this.onFrame(m));
    this.callbacks += 1;
    const w = v.videoWidth;
    if (!w) return;
    const rtp = Number.isFinite(meta.rtpTimestamp) ? meta.rtpTimestamp : null;
    if (rtp !== null && rtp === this.lastRtp) return; // the same frame again
    this.lastRtp = rtp;
    let stamp = null;
    try {
      const cw = STAMP_COLUMNS * STAMP_SCALE, ch = STAMP_ROWS * STAMP_SCALE;
      this.ctx.drawImage(v, 0, 0, w, stampHeight(w), 0, 0, cw, ch);
      stamp = parseStamp(cellBits(this.ctx.getImageData(0, 0, cw, ch).data, STAMP_SCALE));
    } catch { /* no drawable frame yet */ }
    if (!stamp) { this.unreadable += 1; return; }
    // shown = when this callback runs, on the page's real clock.  Not metadata.presentationTime:
    // frame delays read from it drifted (up to 2.5 ms/s, negative within a 20 s run) in some runs,
    // cause not found (abr_chromium.py); the callback runs a few ms after it (column 8).
    const cbMs = performance.now();
    const shown = this.wallMs(cbMs);
    this.frames.push([round1(shown), rtp, stamp.tsMs, stamp.frameNo, meta.width, meta.height,
      round1(meta.expectedDisplayTime - meta.presentationTime), round1(cbMs - meta.presentationTime),
      Number.isFinite(meta.receiveTime) ? round1(meta.presentationTime - meta.receiveTime) : null]);
    if (!this.firstShown) {
      this.firstShown = true;
      if (window.abrFirstFrame) window.abrFirstFrame(shown / 1000); // exposed by abr_chromium.py
    }
  }

  ping() {
    if (this.stopped || this.dc.readyState !== "open") return;
    const id = this.nextId++;
    const at = performance.now();
    const wall = this.wallMs(at);
    this.sent.set(id, [wall, at]);
    this.dc.send(JSON.stringify({ t: InputType.PING, id, ts: round1(wall) }));
  }

  onNodeEvent(data) {
    let msg;
    try { msg = JSON.parse(data); } catch { return; }
    if (!msg || msg.t !== NodeEventType.PONG) return;
    const sent = this.sent.get(msg.id);
    if (!sent) return;
    this.sent.delete(msg.id);
    this.pings.push([Math.round(sent[0] * 10) / 10000, Math.round((performance.now() - sent[1]) * 100) / 100]);
  }

  async poll() {
    if (this.polling || !this.receiver) return;
    this.polling = true;
    try {
      const report = await this.receiver.getStats();
      const at = this.wallMs(performance.now());
      let inbound = null;
      report.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "video") inbound = s; });
      if (inbound) {
        this.inbound = inbound;
        this.polls.push([Math.round(at) / 1000, inbound.bytesReceived ?? 0, inbound.retransmittedBytesReceived ?? null]);
      } else {
        this.polls.push([Math.round(at) / 1000, 0, null]); // before the stream: a zero baseline
      }
    } catch { /* the connection closed under us */ } finally {
      this.polling = false;
    }
  }

  /** Stop everything, close the connection and hand over the records. */
  async finish() {
    clearInterval(this.pingTimer);
    clearInterval(this.pollTimer);
    while (this.polling) await new Promise((r) => setTimeout(r, 5));
    await this.poll(); // the bytes since the last poll
    this.stopped = true;
    this.probes.stop();
    try { this.dc.close(); } catch { /* already closed */ }
    this.pc.close();
    const inbound = {};
    for (const k of INBOUND_KEYS) if (this.inbound && this.inbound[k] !== undefined) inbound[k] = this.inbound[k];
    return {
      frames: this.frames,
      unreadable: this.unreadable,
      callbacks: this.callbacks,
      polls: this.polls,
      pings: this.pings,
      unanswered: [...this.sent.values()].map(([wall]) => Math.round(wall * 10) / 10000),
      inbound,
      clockOffsetMs: this.offset - performance.timeOrigin, // wall - (timeOrigin + performance.now())
    };
  }
}

window.abr = new AbrViewer(document.getElementById("video"));
