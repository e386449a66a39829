// The view-only page of a share link (/watch?token=<share token>, protocol v5): it shows the session's
// stream and, unless the owner hands it control, sends nothing but its own connection's signaling. The broker relays the offer to the node
// tagged with this viewer's id; the node answers from a peer fed by the session's one encode and drops
// any input. The page offers once per connection (PeerLink); the node answers the same offer again with
// the same answer, so a re-sent copy never replaces the connection the page is on.
//
// Control (protocol v7): the owner may hand this viewer control ({"type":"control","granted":true} on the
// socket): the page shows "You have control" and sends keyboard, mouse and gamepad input (input.js, as the
// owner's page does) until control is taken back, the link is revoked or the connection drops (a new
// connection is a new viewer id: control does not follow it, the owner hands it again).
//
// Ends: "bye" share_revoked (the owner stopped sharing) or a 403 share_revoked when (re)connecting shows
// "The owner stopped sharing this session" and never reconnects; the session's end shows that it ended.
// A dropped socket or a failed connection reconnects after RECONNECT_MS, asking the broker first.

import { ByeReason } from "./protocol.js";
import { InputController } from "./input.js";
import { PeerLink } from "./peer.js";
import { FrameStamps } from "./stats.js";

const RECONNECT_MS = 2000;
const STOPPED_TEXT = "The owner stopped sharing this session";

const params = new URLSearchParams(location.search);
const token = params.get("token") || "";
const video = document.getElementById("video");
const statusBox = document.getElementById("watch-status");
const stamps = new FrameStamps(video, () => true, { everyFrame: params.get("stamps") === "all" });
const controlBox = document.getElementById("watch-control");
const watch = { state: "connecting", link: null, connections: 0, timer: 0, control: false };
const input = new InputController({
  video,
  send: (msg) => Boolean(watch.link && watch.link.send(msg)),
  active: () => watch.control && watch.state === "watching" && Boolean(watch.link && watch.link.channelOpen),
  backlog: () => (watch.link ? watch.link.backlog : 0),
  gameMode: () => false,
  toggleStats: () => {},
  streaming: () => watch.state === "watching",
  hint: () => {},
});

/** The owner handed this viewer control (true) or took it back (false). */
function setControl(granted) {
  if (!granted && watch.control) input.releaseAll();
  watch.control = granted;
  controlBox.hidden = !granted;
  document.body.classList.toggle("in-control", granted);
  if (granted) video.focus();
}

function setState(state, text) {
  watch.state = state;
  document.body.dataset.state = state;
  statusBox.textContent = text;
  statusBox.hidden = state === "watching";
}

/** Stop for good: the link was revoked or the session ended. */
function end(state, text) {
  setControl(false);
  clearTimeout(watch.timer);
  if (watch.link) watch.link.close();
  watch.link = null;
  video.srcObject = null;
  setState(state, text);
}

/** What the broker says about the link now (null: it said stop, and end() ran). */
async function linkInfo() {
  let resp;
  try {
    resp = await fetch(`/watch?token=${encodeURIComponent(token)}`, { headers: { Accept: "application/json" },
                                                                     cache: "no-store" });
  } catch {
    return undefined; // the broker is unreachable: try again later
  }
  let body = null;
  try { body = await resp.json(); } catch { body = null; }
  if (resp.ok) return body;
  if (resp.status === 403 && body && body.code === ByeReason.SHARE_REVOKED) end("stopped", STOPPED_TEXT);
  else if (resp.status === 401) end("ended", "This link is not valid any more (it expired)");
  else if (resp.status >= 400 && resp.status < 500) end("ended", (body && body.detail) || `This link does not work (${resp.status})`);
  else return undefined;
  return null;
}

function reconnectLater() {
  if (watch.state === "stopped" || watch.state === "ended") return;
  setControl(false);
  if (watch.link) watch.link.close();
  watch.link = null;
  setState("connecting", "Reconnecting…");
  clearTimeout(watch.timer);
  watch.timer = setTimeout(connect, RECONNECT_MS);
}

async function connect() {
  if (watch.state === "stopped" || watch.state === "ended") return;
  const info = await linkInfo();
  if (info === null) return;
  if (info === undefined) { reconnectLater(); return; }
  const link = new PeerLink({
    signalUrl: info.signaling_url, token, iceServers: info.ice_servers || [], starting: () => false,
    on: {
      answered() {},
      state(s) {
        if (watch.link !== link) return;
        if (s === "connected") setState("watching", "");
        else if (s === "failed") reconnectLater();
      },
      track(stream) { if (watch.link === link) video.srcObject = stream; },
      audio() {}, // view-only links carry no sound at this version
      channelOpen() { if (watch.link === link) input.channelOpened(); },
      control(granted) { if (watch.link === link) setControl(granted); },
      nodeEvent() {},
      bye(reason) {
        if (reason === ByeReason.SHARE_REVOKED) end("stopped", STOPPED_TEXT);
        else end("ended", "The session ended");
      },
      signalError(msg) { statusBox.textContent = msg.detail || msg.code || "signaling error"; },
      signalClosed() { if (watch.link === link) reconnectLater(); },
      elsewhere() {},
    },
  });
  watch.link = link;
  watch.connections += 1;
  try {
    await link.start();
  } catch (err) {
    console.warn("could not connect:", err);
    reconnectLater();
  }
}

// Test hook: read-only views of the page's state.
window.renderBroker = Object.freeze({
  get state() { return watch.state; },
  get connections() { return watch.connections; },
  get control() { return watch.control; },
  get pc() { return watch.link ? watch.link.pc : null; },
  get frameNumbers() { return stamps.frameNumbers.slice(); },
  framesDecoded: async () => {
    const pc = watch.link && watch.link.pc;
    if (!pc) return 0;
    let n = 0;
    (await pc.getStats()).forEach((r) => { if (r.type === "inbound-rtp" && r.kind === "video") n = r.framesDecoded || 0; });
    return n;
  },
});

stamps.start();
input.attach();
connect();
