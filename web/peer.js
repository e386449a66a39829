// One WebRTC connection to a session's render node: the RTCPeerConnection, the input data channel
// and the signaling WebSocket that the broker relays to the node.
//
// We are the offerer: a recvonly video transceiver, a recvonly audio transceiver (protocol v3: the
// session's sound as Opus; the node answers it inactive where the session has none, e.g. the built-in
// game) plus the INPUT_CHANNEL_LABEL data channel,
// built with the session's ICE servers only (an empty list stays empty: no public STUN fallback).
// We send the offer once our first candidate is gathered (Chromium takes ~130 ms more to declare
// gathering complete even with host candidates only: time a user waits for the first frame) and
// trickle the candidates gathered after it (no end-of-candidates); we accept trickled candidates
// from the node.  A re-sent offer carries every candidate gathered by then.  A PeerLink is used once: reconnecting means close() and a new one.
// After close() no handler fires.
//
// A second channel (probe.js) answers the node's delay probes for its bitrate control.
//
// Receive-side buffering (playout.js): the offer asks for the node's playout-delay extension (frames are
// shown once decoded, no jitter-buffer wait) and the receiver's floor (jitterBufferTarget) starts at 0;
// it grows only when the jitter in the stats probe.js polls needs a buffer.  o.playout = "browser"
// leaves Chromium's own buffering instead (the benchmark's baseline).
//
// Input channel: ordered and reliable (the defaults).  Key and button events are state changes:
// a lost key-up leaves a key stuck on the remote side, and a reordered down/up pair does the same,
// so unordered or partially reliable delivery would trade latency for stuck input.  Latency is
// kept low by sending little instead (see input.js: coalesced, backlog-aware pointer moves).
//
// Offer re-sends: the node replaces its peer for every offer it accepts, so an answer to an older
// copy no longer matches the node's peer.  A copy goes out only when the first cannot have been
// used: after the node reports "running" (nodeReady), after a "not_running" error, on the node's
// peer_joined, or for a session already running after a long silence.

import { INPUT_CHANNEL_LABEL, SignalError, SignalType } from "./protocol.js";
import { withToken, wsUrl } from "./common.js";
import { answerProbes } from "./probe.js";
import { PlayoutControl, negotiatePlayoutDelay } from "./playout.js";

const FIRST_CANDIDATE_TIMEOUT_MS = 1000; // send the offer without candidates if none comes (the rest trickles)
const OFFER_RESEND_MS = 10_000; // last resort, only for an offer sent to a running session
const RUNNING_GRACE_MS = 1500; // after the node reports "running", wait this long for the answer to a held offer
const NOT_RUNNING_RETRY_MS = 500; // "not_running" although the broker says running: retry soon
const NO_UDP_PORT_RETRY_MS = 3000; // "no_udp_port": every media port of the node is taken; a session must end first

// Resolves once the local description holds a candidate, gathering completed, or timeoutMs passed.
function firstCandidate(pc, timeoutMs) {
  const has = () => pc.iceGatheringState === "complete" || /a=candidate:/.test(pc.localDescription.sdp);
  if (has()) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icecandidate", check);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => { if (has()) done(); };
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener("icecandidate", check);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

export class PeerLink {
  /**
   * @param {object} o
   * @param {string} o.signalUrl  the session's signaling path (session view signaling.url)
   * @param {string} o.token  bearer token, sent as ?access_token= (WebSockets cannot set headers)
   * @param {object[]} o.iceServers  the session's ICE servers, used as given
   * @param {() => boolean} o.starting  true while the broker still reports the session "starting"
   * @param {string} [o.playout]  receive-side buffering: "low" (default) or "browser" (see playout.js)
   * @param {string} [o.iceTransportPolicy]  "all" (default) or "relay": only TURN candidates (the page's ?relay=1)
   * @param {object} o.on  handlers: answered(), state(connectionState), track(MediaStream) for the video,
   *   audio(MediaStream) for the session's sound,
   *   channelOpen(), nodeEvent(rawData), bye(reason), signalError(msg), signalClosed(),
   *   elsewhere(kind, detail) when the broker says another tab holds the session ("in_use") or took
   *   it ("moved"): the link is closed and does not report signalClosed; optional control(granted) for a
   *   share viewer the owner handed control to (true) or took it back from (false)
   */
  constructor(o) {
    this.o = o;
    this.pc = null;
    this.dc = null;
    this.probes = null;
    this.playout = null;
    this.ws = null;
    this.offer = null;
    this.answered = false;
    this.closed = false;
    this.resendWhenRunning = false;
    this.pendingCandidates = [];
    this.trickle = []; // our candidates gathered after the offer was built, until it is sent
    this.offerSent = false;
    this.timer = 0;
  }

  /** Build the peer connection, gather, open signaling and send the offer. Rejects on setup errors. */
  async start() {
    const pc = new RTCPeerConnection({ iceServers: this.o.iceServers || [], bundlePolicy: "max-bundle",
      iceTransportPolicy: this.o.iceTransportPolicy === "relay" ? "relay" : "all" });
    this.pc = pc;
    const video = pc.addTransceiver("video", { direction: "recvonly" });
    const mode = this.o.playout || "low";
    negotiatePlayoutDelay(video, mode);
    pc.addTransceiver("audio", { direction: "recvonly" });
    const playout = new PlayoutControl(video.receiver, mode);
    this.playout = playout;
    const dc = pc.createDataChannel(INPUT_CHANNEL_LABEL, { ordered: true });
    this.dc = dc;
    // the node's delay probes (its bitrate control); their stats polls feed the jitter buffer's floor
    this.probes = answerProbes(pc, { onReport: (report) => playout.observe(report, performance.now()) });
    dc.onopen = () => { if (!this.closed) this.o.on.channelOpen(); };
    dc.onmessage = (e) => { if (!this.closed) this.o.on.nodeEvent(e.data); };
    pc.ontrack = (e) => {
      if (this.closed) return;
      // the node sends each track in a stream of its own: the sound must not replace the picture
      const stream = e.streams && e.streams[0] ? e.streams[0] : new MediaStream([e.track]);
      if (e.track.kind === "audio") { if (this.o.on.audio) this.o.on.audio(stream); } else this.o.on.track(stream);
    };
    pc.onconnectionstatechange = () => { if (!this.closed) this.o.on.state(pc.connectionState); };
    pc.onicecandidate = (e) => this.localCandidate(e.candidate);
    this.openSignal(); // in parallel with gathering: the offer goes out as soon as both are ready
    await pc.setLocalDescription(await pc.createOffer());
    await firstCandidate(pc, FIRST_CANDIDATE_TIMEOUT_MS);
    if (this.closed) return;
    this.offer = { type: SignalType.OFFER, sdp: pc.localDescription.sdp };
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.sendOffer();
  }

  /** A candidate we gathered: trickled when the offer built before it lacks it.
   *
   * No end-of-candidates (null): the node would then declare ICE failed as soon as its own checks to
   * our candidates fail, before our checks reach it (a peer-reflexive pair: on loopback that is the
   * pair that works), as a complete offer without a=end-of-candidates never did. */
  localCandidate(candidate) {
    if (this.closed || !this.offer || !candidate) return; // not built yet: the offer's SDP will carry it
    const msg = { type: SignalType.CANDIDATE, ...candidate.toJSON() };
    if (this.offerSent) this.sendSignal(msg);
    else this.trickle.push(msg);
  }

  get channelOpen() { return Boolean(this.dc && this.dc.readyState === "open"); }

  /** Send one input message on the data channel; false when it is not open. */
  send(msg) {
    if (this.closed || !this.channelOpen) return false;
    this.dc.send(JSON.stringify(msg));
    return true;
  }

  /** Bytes waiting in the data channel. */
  get backlog() { return this.dc ? this.dc.bufferedAmount : 0; }

  /** The broker reports the session past "starting": a held offer is answered now, a dropped one is re-sent. */
  nodeReady() {
    if (!this.resendWhenRunning || this.answered || this.closed) return;
    this.resendWhenRunning = false;
    this.schedule(RUNNING_GRACE_MS);
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    const { ws, dc, pc } = this;
    if (this.probes) this.probes.stop();
    if (ws) { try { ws.close(1000, "closing"); } catch { /* already closed */ } }
    if (dc) { try { dc.close(); } catch { /* already closed */ } }
    if (pc) { try { pc.close(); } catch { /* already closed */ } }
  }

  /** Close the signaling socket as a network drop would (tests use it for the reconnect path). */
  dropSignaling() {
    if (this.ws) this.ws.close(4000, "simulated drop");
  }

  // ---- signaling ---------------------------------------------------------------------------------
  openSignal() {
    const ws = new WebSocket(wsUrl(withToken(this.o.signalUrl, this.o.token)));
    this.ws = ws;
    ws.onopen = () => { if (!this.closed && !this.answered) this.sendOffer(); };
    ws.onmessage = (e) => {
      if (this.closed) return;
      let msg;
      try { msg = JSON.parse(e.data); } catch { return; }
      this.onSignal(msg);
    };
    ws.onclose = () => {
      if (this.closed || this.ws !== ws) return;
      this.ws = null;
      // The broker tells the node "peer_left" when this socket closes and the node drops its peer:
      // the media path goes with it, so the owner re-signals at once rather than waiting for ICE.
      this.o.on.signalClosed();
    };
  }

  sendSignal(msg) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(msg));
  }

  sendOffer() {
    if (!this.offer || this.closed) return;
    if (this.offerSent) this.offer.sdp = this.pc.localDescription.sdp; // a copy carries every candidate so far
    this.sendSignal(this.offer);
    if (!this.offerSent && this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.offerSent = true;
      for (const c of this.trickle.splice(0)) this.sendSignal(c);
    }
    clearTimeout(this.timer);
    if (this.o.starting()) this.resendWhenRunning = true; // the node may hold it until its session runs
    else this.schedule(OFFER_RESEND_MS);
  }

  schedule(ms) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => { if (!this.answered) this.sendOffer(); }, ms);
  }

  async onSignal(msg) {
    const pc = this.pc;
    switch (msg.type) {
      case SignalType.ANSWER:
        if (!pc || pc.signalingState !== "have-local-offer") return; // a duplicate answer to a re-sent offer
        try {
          await pc.setRemoteDescription({ type: "answer", sdp: msg.sdp });
        } catch (err) {
          if (!this.closed) this.o.on.signalError({ code: "bad_answer", detail: String(err && err.message) });
          return;
        }
        if (this.closed) return;
        this.answered = true;
        this.resendWhenRunning = false;
        clearTimeout(this.timer);
        for (const c of this.pendingCandidates.splice(0)) this.addCandidate(c);
        this.o.on.answered();
        break;
      case SignalType.CANDIDATE:
        if (!msg.candidate) return; // end of candidates
        if (this.answered) this.addCandidate(msg);
        else this.pendingCandidates.push(msg);
        break;
      case SignalType.PEER_JOINED:
        if (!this.answered) this.sendOffer(); // the node (re)connected: it has not seen our offer
        break;
      case SignalType.PEER_LEFT:
        break; // the peer connection's own state tells whether media still flows
      case SignalType.BYE:
        this.o.on.bye(msg.reason || null);
        break;
      case SignalType.IN_USE:
      case SignalType.MOVED:
        this.close(); // the broker closes the socket: not a drop to reconnect from
        this.o.on.elsewhere(msg.type, msg.detail || "");
        break;
      case SignalType.ERROR:
        if (msg.code === SignalError.NOT_RUNNING && !this.answered) {
          // the node is still starting the session: its "running" report (nodeReady) re-sends
          this.resendWhenRunning = true;
          if (!this.o.starting()) this.schedule(NOT_RUNNING_RETRY_MS);
          break;
        }
        this.o.on.signalError(msg);
        if (msg.code === SignalError.NO_UDP_PORT && !this.answered) {
          this.schedule(NO_UDP_PORT_RETRY_MS); // the node's port range is full: offer again in a while
          break;
        }
        if ((msg.code === SignalError.ICE_FAILED || msg.code === SignalError.DTLS_FAILED) && this.answered) {
          // the node dropped this connection (its detail says why): fail now rather than wait for our
          // own ICE consent checks to notice, so the owner reconnects with a new peer connection
          this.o.on.state("failed");
        }
        break;
      case SignalType.CONTROL:
        if (this.o.on.control) this.o.on.control(Boolean(msg.granted));
        break;
      default:
        break;
    }
  }

  addCandidate(msg) {
    if (!this.pc) return;
    this.pc.addIceCandidate({
      candidate: msg.candidate,
      sdpMid: msg.sdpMid ?? null,
      sdpMLineIndex: msg.sdpMLineIndex ?? (msg.sdpMid === undefined ? 0 : null),
    }).catch((err) => console.warn("ignored a remote ICE candidate:", err));
  }
}
