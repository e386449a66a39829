// render-broker viewer: sign in, pick a pool, wait in the queue, stream the session, end it.
//
// Flow (one session at a time):
//   sign in (token or guest) -> pools -> POST /sessions -> the events stream (SSE) drives the view:
//   queued (position + ETA) -> starting (signaling + ICE progress) -> stream -> ended (reason).
// The broker is the source of truth for the session state; this page follows it.
//
// Modules: peer.js owns one WebRTC connection (offer, answer, candidates, data channel),
// input.js turns keyboard/mouse/gamepad/paste into data-channel messages, resize.js sends the video
// area's size (HiDPI), clipboard.js puts the remote clipboard into the system's, sound.js owns mute
// and volume, tabs.js keeps one tab at a time on the session, stats.js reads getStats and frame stamps.  This module owns the views, the session lifecycle and
// reconnecting: if the peer connection fails or the signaling socket drops, GET the session and,
// while it is still live, re-signal the same session with a new PeerLink (no new queue entry)
// until the pool's disconnect timeout would end it anyway.
//
// Size: about 720 lines on purpose: the views, the session lifecycle and reconnecting share one
// session's state; what does not need it already lives in peer.js, input.js, stats.js, playout.js,
// resize.js, clipboard.js, sound.js and tabs.js.

import {
  EndReason, EventType, InputType, NodeEventType, PoolKind, Role, SEATED_STATES, SessionState, VIEWER_STATS_INTERVAL_MS,
} from "./protocol.js";
import { $, ApiError, api, el, fmtDuration, problemText, render, sleep, tokenStore, withToken } from "./common.js";
import { hideWarning, showProblem, showWarning, toast } from "./ui.js";
import { PROFILE_LIMITS, estimateWaitS, evenSize } from "./calc.js";
import { InputController } from "./input.js";
import { RemoteClipboard } from "./clipboard.js";
import { ResizeFollower } from "./resize.js";
import { SoundControls } from "./sound.js";
import { TabGate, leaveOnPagehide, tabId, tabSignalUrl } from "./tabs.js";
import { showControls } from "./controls.js";
import { TOUCH_HINT, TouchController, touchPrimary } from "./touch.js";
import { PeerLink } from "./peer.js";
import { defaultPlayoutMode } from "./playout.js";
import { ShareControls } from "./share.js";
import { FrameStamps, readStats, renderStats } from "./stats.js";

const TOKEN_KEY = "rb.viewer.token";
// A guest's token and expiry, in localStorage (every tab of this origin, surviving a closed tab): a guest who
// closes the tab and opens the page again signs in as the same guest and resumes its live session (within
// the session's close grace). Signing out forgets it; an expired or refused one is dropped.
const GUEST_KEY = "rb.guest";

const guestStore = {
  keep(token, expiresAt) {
    try { localStorage.setItem(GUEST_KEY, JSON.stringify({ token, expires_at: expiresAt })); } catch { /* private mode */ }
  },
  get() {
    try {
      const g = JSON.parse(localStorage.getItem(GUEST_KEY) || "null");
      if (g && typeof g.token === "string" && g.expires_at * 1000 > Date.now()) return g.token;
      localStorage.removeItem(GUEST_KEY);
    } catch { /* private mode or a malformed entry */ }
    return "";
  },
  clear() { try { localStorage.removeItem(GUEST_KEY); } catch { /* private mode */ } },
};
const PC_DISCONNECTED_GRACE_MS = 4000; // ICE "disconnected" often recovers by itself; wait before re-signaling
const RECONNECT_MAX_DELAY_MS = 5000;
const DEFAULT_DISCONNECT_TIMEOUT_S = 300;
const TICK_MS = 1000; // stats sample and input-channel ping period
const POLL_INTERVAL_MS = 3000; // fallback when the events stream cannot be opened
const HINT_MS = 5000;
// receive-side buffering (playout.js): the page's ?playout= (low|sync|browser), else the user's "Lip sync"
// choice for this kind of pool, else "sync" for desktops and "low" for games (playoutMode())
const PLAYOUT_PARAM = new URLSearchParams(location.search).get("playout");
const PLAYOUT_KEY = "rb.playout."; // + pool kind: the user's "Lip sync" choice ("sync" | "low")
// ?relay=1: gather TURN (relay) candidates only, to check a TURN server or debug a viewer's network
const ICE_POLICY = new URLSearchParams(location.search).get("relay") === "1" ? "relay" : "all";

/** User-facing text for each end reason (tests/web/test_protocol_sync.py checks none is missing). */
const END_REASON_TEXT = Object.freeze({
  [EndReason.USER]: "You ended the session.",
  [EndReason.ADMIN]: "An administrator ended your session.",
  [EndReason.CANCELLED]: "You left the queue.",
  [EndReason.QUEUE_TIMEOUT]: "No seat became free in time, so you were taken out of the queue.",
  [EndReason.IDLE_TIMEOUT]: "Your session ended because it was idle for too long.",
  [EndReason.DISCONNECT_TIMEOUT]: "Your session ended because you were disconnected for too long.",
  [EndReason.MAX_DURATION]: "Your session reached its maximum duration.",
  [EndReason.HOST_LOST]: "The machine running your session stopped responding.",
  [EndReason.NODE_ENDED]: "The remote application exited, so the session ended.",
  [EndReason.START_FAILED]: "The render node could not start your session.",
  [EndReason.SCALE_IN]: "The pool reduced its capacity and ended your session after a warning.",
  [EndReason.STATE_LOST]: "The service lost track of your session during an outage; please start a new one.",
});

const app = {
  token: "",
  user: "",
  pools: [],
  pool: null, // pool record of the current session (kind, allow_resize, disconnect_timeout_s, ...)
  session: null, // latest session view from the broker
  view: "boot",
  es: null,
  pollTimer: 0,
  queue: null, // {sessionId, seenAt, lastPos, advances}
  link: null, // the current PeerLink
  connections: 0, // peer connections made by this page (reconnects included)
  reconnecting: false,
  lostAt: 0, // when the current outage began (0 while connected): the reconnect deadline counts from here
  retryDelay: 0, // grows across consecutive failed reconnects, reset once media flows again
  firstFrame: false,
  discTimer: 0,
  startedAt: 0,
  ending: false,
  statsVisible: false,
  statsPrev: null,
  lastStats: null,
  nodeStats: null,
  pingSeq: 0,
  inputRttMs: null,
  remoteCursor: null,
  remoteClipboard: "",
};

const video = $("#video");
// The session's sound (protocol v3) plays here; the video element stays muted (muted autoplay of the
// picture is always allowed).  The user clicked to start the session, so Chromium lets it play; where a
// browser still refuses, the next click or key in the page starts it.
const sound = el("audio", { id: "sound", autoplay: true, hidden: true });
document.body.append(sound);
new SoundControls(sound, $("#btn-mute"), $("#volume"));
const remoteClipboard = new RemoteClipboard({ button: $("#btn-clip"), notify: (text) => toast(text) });
const streamActive = () => app.view === "stream" && Boolean(app.link && app.link.channelOpen);
const resizer = new ResizeFollower({
  area: $("#view-stream"),
  send: (msg) => Boolean(app.link && app.link.send(msg)),
  allowed: () => Boolean(app.pool && app.pool.allow_resize),
  active: streamActive,
  button: $("#btn-hidpi"),
});
const input = new InputController({
  video,
  send: (msg) => Boolean(app.link && app.link.send(msg)),
  active: streamActive,
  backlog: () => (app.link ? app.link.backlog : 0),
  gameMode: () => Boolean(app.pool && app.pool.kind === PoolKind.GAME),
  toggleStats: () => toggleStats(),
  streaming: () => app.view === "stream",
  hint: (text) => hint(text),
  sink: $("#kbd-sink"),
  touch: () => touchPrimary(),
});
const TAB = tabId();
const tabGate = new TabGate($("#elsewhere"), () => { if (app.session) connect({ takeover: true }); });
leaveOnPagehide(() => (app.session && app.token && !tabGate.state && !app.ending
  && SEATED_STATES.includes(app.session.state) ? { sessionId: app.session.id, token: app.token } : null), TAB);
const touch = new TouchController({
  video, send: input.o.send, active: input.o.active, keyboardButton: $("#btn-keyboard"), keyboardInput: $("#osk"),
});
// ?stamps=all reads every frame's stamp (tests compare the frames two pages decoded), else a few a second
const stamps = new FrameStamps(video, () => app.view === "stream",
  { everyFrame: new URLSearchParams(location.search).get("stamps") === "all" });
const share = new ShareControls({
  call: (method, path, body) => api(app.token, method, path, body),
  sessionId: () => (app.session && SEATED_STATES.includes(app.session.state) ? app.session.id : null),
  shareButton: $("#btn-share"), listButton: $("#btn-sharing"), panel: $("#share-panel"), toast,
});

// =========================================================================================
// views
// =========================================================================================
function show(view) {
  app.view = view;
  document.body.dataset.view = view;
  for (const s of document.querySelectorAll("main > .view")) s.hidden = s.id !== `view-${view}`;
  document.body.classList.toggle("streaming", view === "stream");
  const signedIn = Boolean(app.token) && view !== "signin";
  $("#who").hidden = !signedIn;
  $("#signout").hidden = !signedIn || view === "stream";
  $("#stats").hidden = !(view === "stream" && app.statsVisible);
}

function setSession(view) {
  app.session = view;
  document.body.dataset.sessionState = view ? view.state : "";
  document.body.dataset.sessionId = view ? view.id : "";
}

let hintTimer = 0;
function hint(text) {
  const h = $("#hint");
  h.textContent = text;
  h.style.opacity = "1";
  clearTimeout(hintTimer);
  hintTimer = setTimeout(() => { h.style.opacity = "0"; }, HINT_MS);
}

// =========================================================================================
// sign in and pools
// =========================================================================================
async function signIn(token) {
  const who = await api(token, "GET", "whoami");
  if (who.role !== Role.USER) {
    const what = who.role === Role.ADMIN ? "an admin token: use it on the admin dashboard (/web/admin.html)"
      : `a ${who.role} token`;
    throw new ApiError(403, { title: "Not a user token", detail: `This is ${what}. Sessions need a user token.`,
                              code: "wrong_role" });
  }
  app.token = token;
  app.user = who.name;
  tokenStore.set(TOKEN_KEY, token);
  $("#who-name").textContent = who.name;
  // A live session of ours (after a reload or a closed tab) is resumed, never duplicated.
  const mine = await api(app.token, "GET", "sessions");
  const live = (mine.sessions || []).find((s) => s.state !== SessionState.ENDED);
  if (live) {
    await loadPool(live.pool);
    follow(live);
  } else {
    await showPools();
  }
}

function signOut() {
  teardown();
  app.token = "";
  tokenStore.clear(TOKEN_KEY);
  guestStore.clear();
  setSession(null);
  $("#token").value = "";
  show("signin");
}

async function showPools() {
  show("pools");
  showProblem("#pools-error", null);
  try {
    app.pools = (await api(app.token, "GET", "pools")).pools || [];
  } catch (err) {
    showProblem("#pools-error", err);
    return;
  }
  render($("#pools"), app.pools.length ? app.pools.map(poolCard)
    : el("div", { class: "card muted" }, "No pools are configured on this broker yet."));
}

function poolCard(p) {
  const game = p.kind === PoolKind.GAME;
  return el("article", { class: "card pool-card", dataset: { pool: p.name } },
    el("header", {}, el("h3", {}, p.name), el("span", { class: `kind ${p.kind}` }, p.kind)),
    el("p", {}, p.description || (game ? "Game streaming at 60 fps" : "Virtual desktop")),
    el("div", { class: "facts" },
      el("div", {}, el("b", {}, String(p.seats_free)), el("span", {}, p.seats_free === 1 ? "seat free" : "seats free")),
      el("div", {}, el("b", {}, String(p.seats_total)), el("span", {}, p.seats_total === 1 ? "seat" : "seats")),
      el("div", {}, el("b", {}, String(p.queue_length)), el("span", {}, "in queue"))),
    el("button", { class: "primary", "aria-label": `Start a session in ${p.name}`, onclick: (e) => startSession(p, e.currentTarget) },
      p.seats_free <= 0 ? "Join the queue" : game ? "Play" : "Start desktop"));
}

async function loadPool(name) {
  try {
    app.pool = await api(app.token, "GET", `pools/${encodeURIComponent(name)}`);
  } catch {
    app.pool = app.pools.find((p) => p.name === name) || { name, kind: PoolKind.DESKTOP, allow_resize: false };
  }
}

async function startSession(pool, button) {
  showProblem("#pools-error", null);
  button.disabled = true;
  try {
    app.pool = pool;
    // the viewport in CSS pixels, even (4:2:0 video): the remote desktop matches the page layout
    const profile = { ...evenSize(window.innerWidth, window.innerHeight, PROFILE_LIMITS),
                      fps: pool.kind === PoolKind.GAME ? 60 : 30 };
    follow(await api(app.token, "POST", "sessions", { pool: pool.name, profile }));
  } catch (err) {
    showProblem("#pools-error", err);
  } finally {
    button.disabled = false;
  }
}

// =========================================================================================
// following the session (events stream)
// =========================================================================================
function follow(view) {
  const previous = app.session;
  setSession(view);
  if (!previous || previous.id !== view.id) {
    app.queue = null;
    app.firstFrame = false;
    showControls($("#controls"), null); // until this session's node says what its controls are
    renderSyncButton();
    openEvents(view);
  }
  $("#toolbar-pool").textContent = view.pool;
  if (view.state === SessionState.QUEUED) {
    showQueue(view);
  } else if (SEATED_STATES.includes(view.state)) {
    if (!app.startedAt) app.startedAt = Date.now();
    if (view.state !== SessionState.STARTING && app.link) app.link.nodeReady();
    if (!app.firstFrame && app.view !== "starting") showStarting();
    if (!app.link && !app.reconnecting && !tabGate.state) connect();
  } else if (view.state === SessionState.ENDED) {
    finish(view);
  }
}

function openEvents(view) {
  closeEvents();
  const es = new EventSource(withToken(view.events_url || `/api/v1/sessions/${view.id}/events`, app.token));
  app.es = es;
  es.addEventListener(EventType.STATE, (e) => {
    if (app.es !== es) return;
    const data = JSON.parse(e.data);
    delete data.type;
    if (!app.session || data.id !== app.session.id) return;
    if (data.state === SessionState.ENDED) closeEvents(); // the broker closes the stream after this
    follow({ ...app.session, ...data });
  });
  es.addEventListener(EventType.WARNING, (e) => { if (app.es === es) showWarning(JSON.parse(e.data)); });
  es.onerror = () => {
    // EventSource reconnects by itself after a network error; CLOSED means it gave up (401/404/...).
    if (app.es === es && es.readyState === EventSource.CLOSED) {
      app.es = null;
      startPolling();
    }
  };
}

function closeEvents() {
  if (app.es) { app.es.close(); app.es = null; }
  clearInterval(app.pollTimer);
  app.pollTimer = 0;
}

function startPolling() {
  clearInterval(app.pollTimer);
  app.pollTimer = setInterval(async () => {
    if (!app.session || app.session.state === SessionState.ENDED) { clearInterval(app.pollTimer); return; }
    try {
      const view = await api(app.token, "GET", `sessions/${app.session.id}`);
      if (view.state !== app.session.state || view.queue_position !== app.session.queue_position) follow(view);
    } catch (err) {
      if (err.status === 404) finish({ ...app.session, end_reason: null });
    }
  }, POLL_INTERVAL_MS);
}

// ---- queue -----------------------------------------------------------------------------------
let queueTimer = 0;
function showQueue(view) {
  if (!app.queue || app.queue.sessionId !== view.id) {
    app.queue = { sessionId: view.id, seenAt: Date.now(), lastPos: null, advances: 0 };
  }
  const q = app.queue;
  const pos = view.queue_position;
  if (Number.isFinite(pos) && q.lastPos !== null && pos < q.lastPos) q.advances += q.lastPos - pos;
  if (Number.isFinite(pos)) q.lastPos = pos;
  $("#queue-pool").textContent = view.pool;
  $("#queue-position").textContent = Number.isFinite(pos) ? String(pos) : "–";
  const timeout = app.pool && app.pool.queue_timeout_s;
  $("#queue-note").textContent = timeout
    ? `If no seat frees up within ${fmtDuration(timeout)} of joining, you leave the queue automatically.` : "";
  if (app.view !== "queue") show("queue");
  updateEta();
  clearInterval(queueTimer);
  queueTimer = setInterval(updateEta, 1000);
}

function updateEta() {
  const q = app.queue;
  if (app.view !== "queue" || !q) { clearInterval(queueTimer); return; }
  const elapsed = (Date.now() - q.seenAt) / 1000;
  const eta = estimateWaitS(q.lastPos, q.advances, elapsed);
  const waited = `waiting ${fmtDuration(elapsed)}`;
  let text;
  if (eta !== null) text = q.lastPos === 1 ? `You're next · about ${fmtDuration(eta)} (${waited})`
    : `About ${fmtDuration(eta)} to go (${waited})`;
  else text = q.lastPos === 1 ? `You're next: you get the first seat that frees up (${waited})`
    : `Estimating your wait: no seat has freed up yet (${waited})`;
  $("#queue-eta").textContent = text;
}

// ---- starting ----------------------------------------------------------------------------------
let startingTimer = 0;
const STEPS = ["seat", "node", "ice", "frame"];

function showStarting() {
  show("starting");
  const s = app.session;
  $("#starting-sub").textContent = s && s.host
    ? `A seat is reserved for you on ${s.host}${s.gpu !== null && s.gpu !== undefined ? ` (GPU ${s.gpu})` : ""}.`
    : "A seat is reserved for you.";
  showProblem("#starting-error", null);
  step("seat", "done");
  if (!(app.link && app.link.answered)) step("node", "active");
  clearInterval(startingTimer);
  const t0 = app.startedAt || Date.now();
  const tick = () => { $("#starting-elapsed").textContent = fmtDuration((Date.now() - t0) / 1000); };
  tick();
  startingTimer = setInterval(() => { if (app.view !== "starting") clearInterval(startingTimer); else tick(); }, 1000);
}

function step(name, status) {
  const li = document.querySelector(`#steps li[data-step="${name}"]`);
  li.classList.toggle("done", status === "done");
  li.classList.toggle("active", status === "active");
  const done = STEPS.filter((n) => document.querySelector(`#steps li[data-step="${n}"]`).classList.contains("done"));
  const pct = 10 + Math.round((done.length / STEPS.length) * 90);
  const bar = $("#starting-bar");
  bar.setAttribute("aria-valuenow", String(pct));
  bar.firstElementChild.style.width = `${pct}%`;
}

// =========================================================================================
// the connection
// =========================================================================================
async function connect({ takeover = false } = {}) {
  closePeer();
  tabGate.hide();
  const s = app.session;
  const sig = s.signaling || { url: `/api/v1/sessions/${s.id}/signal`, ice_servers: [] };
  const mine = () => app.link === link; // handlers of a replaced link are ignored
  const link = new PeerLink({
    signalUrl: tabSignalUrl(sig.url, TAB, takeover), token: app.token, iceServers: sig.ice_servers || [],
    playout: playoutMode(), iceTransportPolicy: ICE_POLICY,
    starting: () => Boolean(app.session && app.session.state === SessionState.STARTING),
    on: {
      answered: () => { if (mine()) { step("node", "done"); step("ice", "active"); } },
      state: (st) => { if (mine()) onPeerState(st); },
      track: (stream) => { if (mine()) { video.srcObject = stream; watchFirstFrame(); } },
      audio: (stream) => { if (mine()) playSound(stream); },
      channelOpen: () => { if (mine()) { input.channelOpened(); resizer.channelOpened(); resizer.send(); } },
      nodeEvent: (data) => { if (mine()) onNodeEvent(data); },
      bye: (reason) => { if (mine()) checkSession(`the node said goodbye${reason ? ` (${reason})` : ""}`); },
      signalError: (msg) => {
        if (!mine()) return;
        toast(`Signaling error: ${msg.detail || msg.code || "unknown"}`);
        if (!link.answered) showProblem("#starting-error", new Error(`${msg.code}: ${msg.detail || ""}`));
      },
      signalClosed: () => { if (mine()) reconnect("the signaling connection dropped"); },
      elsewhere: (kind, detail) => {
        if (!mine()) return;
        input.releaseAll();
        closePeer(); // no reconnect: the user picks the tab (TabGate's button)
        tabGate.show(kind, detail);
      },
    },
  });
  app.link = link;
  stamps.reset();
  try {
    await link.start();
    if (mine()) app.connections += 1;
  } catch (err) {
    if (!mine()) return;
    showProblem("#starting-error", err);
    reconnect(`could not set up WebRTC: ${problemText(err)}`);
  }
}

function onPeerState(st) {
  $("#live-dot").classList.toggle("bad", st !== "connected");
  clearTimeout(app.discTimer);
  if (st === "connected") {
    app.reconnecting = false;
    app.lostAt = 0;
    app.retryDelay = 0;
    $("#reconnect").hidden = true;
    step("ice", "done");
    if (!app.firstFrame) step("frame", "active");
  } else if (st === "disconnected") {
    const link = app.link;
    app.discTimer = setTimeout(() => {
      if (app.link === link && link.pc.connectionState === "disconnected") reconnect("the connection was interrupted");
    }, PC_DISCONNECTED_GRACE_MS);
  } else if (st === "failed") {
    reconnect("the connection failed");
  }
}

function poolKind() { return app.pool && app.pool.kind === PoolKind.GAME ? PoolKind.GAME : PoolKind.DESKTOP; }

/** The receive-side buffering mode of the next connection (playout.js defaultPlayoutMode). */
function playoutMode() {
  let saved = null;
  try { saved = localStorage.getItem(PLAYOUT_KEY + poolKind()); } catch { /* private mode: the default */ }
  return defaultPlayoutMode(PLAYOUT_PARAM, saved, poolKind() === PoolKind.GAME);
}

/** The toolbar's "Lip sync" toggle: pressed in mode "sync"; hidden where ?playout= fixed the mode. */
function renderSyncButton() {
  const b = $("#btn-sync");
  b.hidden = PLAYOUT_PARAM !== null;
  b.setAttribute("aria-pressed", String(playoutMode() === "sync"));
}

/** The user turns lip sync on or off for this kind of pool: remembered, and the stream reconnects in it. */
function toggleSync() {
  const on = playoutMode() !== "sync";
  try { localStorage.setItem(PLAYOUT_KEY + poolKind(), on ? "sync" : "low"); } catch { /* this page only */ }
  renderSyncButton();
  hint(on ? "Lip sync on: the picture waits for the sound" : "Lip sync off: the picture is shown at once, the sound may lag");
  if (app.link && app.session && app.session.state === SessionState.RUNNING) connect();
}

function watchFirstFrame() {
  const onFrame = () => {
    if (app.firstFrame || !app.link) return;
    app.firstFrame = true;
    step("frame", "done");
    show("stream");
    share.refresh();
    input.focus();
    hint(app.pool && app.pool.kind === PoolKind.GAME ? "Click the video to capture the mouse · Esc releases it · F8 shows stats"
      : "F8 shows stats · paste with Ctrl+V sends your clipboard");
    if (touchPrimary()) hint(TOUCH_HINT); // a phone or tablet: no mouse, no F8
    resizer.send();
  };
  if ("requestVideoFrameCallback" in video) video.requestVideoFrameCallback(onFrame);
  else video.addEventListener("loadeddata", onFrame, { once: true });
  video.play().catch(() => { /* muted autoplay is allowed */ });
}

function playSound(stream) {
  sound.srcObject = stream;
  sound.play().catch(() => {
    const retry = () => {
      document.removeEventListener("pointerdown", retry, true);
      document.removeEventListener("keydown", retry, true);
      sound.play().catch(() => { /* still refused: the picture goes on without sound */ });
    };
    document.addEventListener("pointerdown", retry, true);
    document.addEventListener("keydown", retry, true);
    hint("Click the video to turn the sound on");
  });
}

function onNodeEvent(data) {
  let msg;
  try { msg = JSON.parse(typeof data === "string" ? data : new TextDecoder().decode(data)); } catch { return; }
  switch (msg.t) {
    case NodeEventType.PONG:
      if (Number.isFinite(msg.ts)) {
        const rtt = performance.now() - msg.ts;
        app.inputRttMs = app.inputRttMs === null ? rtt : app.inputRttMs * 0.7 + rtt * 0.3;
      }
      break;
    case NodeEventType.CLIPBOARD:
      if (typeof msg.text === "string") {
        app.remoteClipboard = msg.text;
        remoteClipboard.received(msg.text);
      }
      break;
    case NodeEventType.CURSOR:
      app.remoteCursor = msg;
      break;
    case NodeEventType.WARNING:
      showWarning(msg);
      break;
    case NodeEventType.STATS:
      app.nodeStats = msg;
      showControls($("#controls"), msg.controls, touchPrimary());
      // the node's own share of the jitter we measure: no reason for a buffer here (playout.js)
      if (app.link && app.link.playout && Number.isFinite(msg.send_jitter_ms)) {
        app.link.playout.nodeJitterMs = msg.send_jitter_ms;
      }
      break;
    default:
      break;
  }
}

// ---- reconnect ---------------------------------------------------------------------------------
/** GET the session; finish if it ended. Resolves true while it is (or may be) live. */
async function checkSession(why) {
  if (!app.session) return false;
  try {
    const view = await api(app.token, "GET", `sessions/${app.session.id}`);
    if (view.state === SessionState.ENDED) { finish(view); return false; }
    setSession({ ...app.session, ...view });
    return true;
  } catch (err) {
    if (err.status === 404) { finish({ ...app.session, end_reason: null }, why); return false; }
    if (err.status === 401) { signOut(); showProblem("#signin-error", err); return false; }
    return true; // broker unreachable: assume live and let the caller retry
  }
}

async function reconnect(why) {
  if (app.reconnecting || app.ending || !app.session || app.session.state === SessionState.ENDED) return;
  if (tabGate.state) return; // another tab has the session: only the user's choice reconnects
  app.reconnecting = true;
  closePeer();
  $("#live-dot").classList.add("bad");
  const pool = app.pool || {};
  const timeoutS = pool.disconnect_timeout_s > 0 ? pool.disconnect_timeout_s : DEFAULT_DISCONNECT_TIMEOUT_S;
  if (!app.lostAt) app.lostAt = Date.now();
  const deadline = app.lostAt + timeoutS * 1000;
  const overlay = app.view === "stream";
  if (overlay) $("#reconnect").hidden = false;
  // Back off across consecutive failures too: a socket that fails at once must not spin.
  if (app.retryDelay) await sleep(app.retryDelay);
  app.retryDelay = Math.min(Math.max(500, app.retryDelay * 2), RECONNECT_MAX_DELAY_MS);
  let delay = 500, attempt = 0;
  while (app.reconnecting && Date.now() < deadline) {
    attempt += 1;
    const left = Math.round((deadline - Date.now()) / 1000);
    const text = `${why[0].toUpperCase()}${why.slice(1)}. Reconnecting (attempt ${attempt}); `
      + `the session is kept for ${fmtDuration(left)}.`;
    $("#reconnect-text").textContent = text;
    if (!overlay) $("#starting-sub").textContent = text;
    let view = null;
    try {
      view = await api(app.token, "GET", `sessions/${app.session.id}`);
    } catch (err) {
      if (err.status === 404) { finish({ ...app.session, end_reason: null }); return; }
      if (err.status === 401) { signOut(); showProblem("#signin-error", err); return; }
    }
    if (!app.reconnecting) return; // ended or signed out meanwhile
    if (view && view.state === SessionState.ENDED) { finish(view); return; }
    if (view && SEATED_STATES.includes(view.state)) {
      setSession({ ...app.session, ...view });
      if (!app.es) openEvents(app.session);
      app.reconnecting = false;
      await connect(); // a fresh peer connection on the same seated session: no new queue entry
      return;
    }
    if (view && view.state === SessionState.QUEUED) { app.reconnecting = false; follow(view); return; }
    await sleep(delay);
    delay = Math.min(delay * 2, RECONNECT_MAX_DELAY_MS);
  }
  if (app.reconnecting) {
    finish({ ...app.session, end_reason: EndReason.DISCONNECT_TIMEOUT }, "The connection could not be re-established in time.");
  }
}

function closePeer() {
  clearTimeout(app.discTimer);
  if (app.link) { app.link.close(); app.link = null; }
  app.statsPrev = null;
}

function teardown() {
  input.releaseAll(); // while the channel is still open: nothing stays pressed on the remote side
  app.reconnecting = false;
  tabGate.hide();
  closePeer();
  closeEvents();
  clearInterval(queueTimer);
  clearInterval(startingTimer);
  video.srcObject = null;
  sound.srcObject = null;
  if (document.pointerLockElement) document.exitPointerLock();
  if (document.fullscreenElement) document.exitFullscreen().catch(() => {});
  app.startedAt = 0;
  app.firstFrame = false;
  app.lostAt = 0;
  app.retryDelay = 0;
}

function finish(view, extra) {
  teardown();
  share.reset();
  hideWarning();
  setSession({ ...view, state: SessionState.ENDED });
  app.ending = false;
  const reason = view.end_reason;
  $("#ended-reason").textContent = reason ? (END_REASON_TEXT[reason] || `Your session ended (${reason}).`)
    : "Your session is no longer available.";
  const bits = [];
  if (extra) bits.push(extra);
  if (view.started_ms && view.ended_ms) bits.push(`It ran for ${fmtDuration((view.ended_ms - view.started_ms) / 1000)}.`);
  if (reason) bits.push(`Reason code: ${reason}.`);
  $("#ended-detail").textContent = bits.join(" ");
  show("ended");
}

async function endSession() {
  if (!app.session) return;
  app.ending = true;
  try {
    finish(await api(app.token, "DELETE", `sessions/${app.session.id}`));
  } catch (err) {
    app.ending = false;
    if (err.status === 404) finish({ ...app.session, end_reason: null });
    else toast(`Could not end the session: ${problemText(err)}`, { error: true });
  }
}

// =========================================================================================
// stats, fullscreen, wiring
// =========================================================================================
function statsNow(update) {
  const link = app.link;
  if (!link || !link.pc) return Promise.resolve(null);
  return readStats(link.pc, app.statsPrev, { inputRttMs: app.inputRttMs, node: app.nodeStats,
                                             glassToGlassMs: stamps.glassToGlassMs,
                                             playoutMode: link.playout ? link.playout.mode : null,
                                             playoutTargetMs: link.playout ? link.playout.targetMs : null })
    .then((s) => { if (update && app.link === link) app.statsPrev = s; return s; });
}

function toggleStats() {
  app.statsVisible = !app.statsVisible;
  $("#stats").hidden = !(app.statsVisible && app.view === "stream");
  $("#btn-stats").setAttribute("aria-pressed", String(app.statsVisible));
  if (app.statsVisible) renderStats($("#stats"), app.lastStats);
}

async function tick() {
  if (!app.link || (app.view !== "stream" && app.view !== "starting")) return;
  try { app.lastStats = await statsNow(true); } catch { /* the peer connection closed under us */ }
  if (app.link) app.link.send({ t: InputType.PING, id: ++app.pingSeq, ts: performance.now() });
  if (app.statsVisible && app.view === "stream") renderStats($("#stats"), app.lastStats);
}

/** Report the glass-to-glass samples measured since the last report to the node ("vs"), when there are any. */
function sendViewerStats() {
  if (!app.link || !app.link.channelOpen || app.view !== "stream") return;
  const g2g = stamps.takeFresh();
  if (g2g.length) app.link.send({ t: InputType.VIEWER_STATS, g2g });
}

async function toggleFullscreen() {
  if (document.fullscreenElement) { await document.exitFullscreen().catch(() => {}); return; }
  try {
    await document.documentElement.requestFullscreen({ navigationUI: "hide" });
    // In fullscreen, Chromium lets the page capture Esc, Ctrl+W and friends for the remote side.
    if (navigator.keyboard && navigator.keyboard.lock) navigator.keyboard.lock().catch(() => {});
  } catch (err) {
    toast(`Fullscreen refused: ${err.message}`);
  }
  input.focus();
}

function wire() {
  $("#signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = $("#token").value.trim();
    showProblem("#signin-error", null);
    if (!token) { showProblem("#signin-error", new Error("Paste a token first.")); return; }
    $("#signin-submit").disabled = true;
    try { await signIn(token); } catch (err) { showProblem("#signin-error", err); } finally { $("#signin-submit").disabled = false; }
  });
  $("#guest").addEventListener("click", async () => {
    showProblem("#signin-error", null);
    $("#guest").disabled = true;
    try {
      const guest = await api("", "POST", "guest");
      guestStore.keep(guest.token, guest.expires_at);
      await signIn(guest.token);
      $("#guest").disabled = false;
    } catch (err) {
      showProblem("#signin-error", err);
      // guests stay refused on this broker: leave the button disabled, saying why
      $("#guest").disabled = err.status === 403;
      $("#guest").title = err.status === 403 ? problemText(err) : "";
    }
  });
  $("#signout").addEventListener("click", signOut);
  $("#pools-refresh").addEventListener("click", showPools);
  for (const id of ["#queue-leave", "#starting-cancel", "#reconnect-end"]) $(id).addEventListener("click", endSession);
  $("#btn-end").addEventListener("click", () => { input.focus(); endSession(); });
  $("#btn-stats").addEventListener("click", () => { toggleStats(); input.focus(); });
  $("#btn-fullscreen").addEventListener("click", toggleFullscreen);
  $("#btn-sync").addEventListener("click", () => { toggleSync(); video.focus(); });
  $("#ended-again").addEventListener("click", () => { hideWarning(); setSession(null); showPools(); });
  $("#banner-close").addEventListener("click", hideWarning);
  input.attach();
  resizer.attach();
  touch.attach();
  stamps.start();
  setInterval(tick, TICK_MS);
  setInterval(sendViewerStats, VIEWER_STATS_INTERVAL_MS);
}

// Test hook: read-only views of the client's state, getStats, and a simulated signaling drop.
window.renderBroker = Object.freeze({
  get state() { return app.session ? app.session.state : null; },
  get view() { return app.view; },
  get sessionId() { return app.session ? app.session.id : null; },
  get session() { return app.session; },
  get queuePosition() { return app.session ? app.session.queue_position : null; },
  get pc() { return app.link ? app.link.pc : null; },
  get dc() { return app.link ? app.link.dc : null; },
  get remoteClipboard() { return app.remoteClipboard; },
  get clipboardWrites() { return remoteClipboard.writes; },
  get clipboardPending() { return remoteClipboard.pending; },
  get sound() { return { muted: sound.muted, volume: sound.volume }; },
  get hidpi() { return resizer.hidpi; },
  get playout() {
    const p = app.link && app.link.playout;
    return p ? { mode: p.mode, targetMs: p.targetMs, sync: p.sync.last } : null;
  },
  get lastResize() { return resizer.last; },
  get clipboardReceived() { return remoteClipboard.count; },
  get connections() { return app.connections; },
  get elsewhere() { return tabGate.state; },
  get tab() { return TAB; },
  get frameNumbers() { return stamps.frameNumbers.slice(); },
  get shares() { return share.shares; },
  get shareLink() { return share.lastLink; },
  stats: () => statsNow(false),
  lastStats: () => app.lastStats,
  send: (msg) => Boolean(app.link && app.link.send(msg)),
  dropSignaling: () => { if (app.link) app.link.dropSignaling(); },
});

async function boot() {
  wire();
  // this tab's token (a reload), else a guest's from a closed tab
  const saved = tokenStore.get(TOKEN_KEY) || guestStore.get();
  if (saved) {
    try {
      await signIn(saved);
      return;
    } catch (err) {
      tokenStore.clear(TOKEN_KEY);
      guestStore.clear();
      if (err.status && err.status !== 401) showProblem("#signin-error", err);
    }
  }
  show("signin");
  $("#token").focus();
}

boot();
