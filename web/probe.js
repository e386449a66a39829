// Answers to the render node's delay probes (its bitrate control: streamer/media/probe.py).
//
// The node sends {"t":"probe","id":n} every 25 ms on the PROBE_CHANNEL_LABEL channel; we answer
// at once with {"t":"pa","id":n,"rx":packets,"rx_ms":ms,"fd":frames}: the video RTP packets
// received so far (inbound-rtp packetsReceived), when that count was read (performance.now())
// and the frames decoded by then (framesDecoded).  The node reads three things from the answers:
// the probe's round trip (it grows as a queue builds on the path, well before RTCP reports a
// second later), our receive rate (the rate to cut to), and a picture frozen while packets still
// arrive (a lost packet never repaired: the node sends a keyframe instead of our browser asking
// for one after seconds).
//
// The channel is unordered with no retransmissions: a lost probe is just lost, instead of holding
// the ones behind it until SCTP retransmits it.  getStats() is asynchronous, so the count comes
// from a poll every RX_POLL_MS and the answer carries the newest one with its own time: the node
// divides count differences by time differences of the same polls.

import { InputType, NodeEventType, PROBE_CHANNEL_LABEL } from "./protocol.js";

const RX_POLL_MS = 100;

/**
 * Open `pc`'s probe channel (before the offer is made) and answer the node's probes.
 * @param {RTCPeerConnection} pc
 * @param {{onReport?: (report: RTCStatsReport) => void}} [opts]  onReport sees every stats report
 *   polled (every RX_POLL_MS), for other receive-side readings (web/playout.js)
 * @returns {{channel: RTCDataChannel, stop: () => void}}
 */
export function answerProbes(pc, opts = {}) {
  const channel = pc.createDataChannel(PROBE_CHANNEL_LABEL, { ordered: false, maxRetransmits: 0 });
  let rx = 0;
  let rxMs = 0;
  let fd = null;
  let polling = false;
  let stopped = false;
  const poll = async () => {
    if (polling || stopped) return;
    polling = true;
    try {
      let count = null;
      let frames = null;
      const report = await pc.getStats();
      if (stopped) return;
      if (opts.onReport) {
        try { opts.onReport(report); } catch (err) { console.warn("stats report handler failed:", err); }
      }
      report.forEach((s) => {
        if (s.type !== "inbound-rtp" || s.kind !== "video") return;
        count = (count ?? 0) + (s.packetsReceived ?? 0);
        if (typeof s.framesDecoded === "number") frames = (frames ?? 0) + s.framesDecoded;
      });
      if (count !== null) {
        rx = count;
        rxMs = performance.now();
        fd = frames;
      }
    } catch {
      // the connection closed under us
    } finally {
      polling = false;
    }
  };
  const timer = setInterval(poll, RX_POLL_MS);
  channel.onmessage = (e) => {
    let msg;
    try { msg = JSON.parse(e.data); } catch { return; }
    if (!msg || msg.t !== NodeEventType.PROBE || channel.readyState !== "open") return;
    const answer = { t: InputType.PROBE_ACK, id: msg.id, rx, rx_ms: Math.round(rxMs * 10) / 10 };
    if (fd !== null) answer.fd = fd;
    channel.send(JSON.stringify(answer));
  };
  return {
    channel,
    stop() {
      stopped = true;
      clearInterval(timer);
      try { channel.close(); } catch { /* already closed */ }
    },
  };
}
