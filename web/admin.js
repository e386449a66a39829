// render-broker admin dashboard: pools, hosts (GPU telemetry, drain/undrain), live sessions
// (end), utilization charts from pool samples, the audit log, and the scaling plan and
// recommendation when the broker serves them.
//
// Refresh model: one refresh() every REFRESH_MS while the tab is visible reads pools, hosts,
// sessions and the newest audit page in parallel and re-renders the tables; samples and the
// scaling section are slower-moving and refresh every SLOW_REFRESH_MS.  Re-rendering keeps the
// keyboard focus on the same control (data-focus-key) so auto-refresh never yanks focus away.

import { HostState, PoolKind, Role, SessionState } from "./protocol.js";
import {
  $, ApiError, api, el, fmtAgo, fmtBitrate, fmtDuration, fmtMiB, fmtNum, fmtTime, problemText, render, tokenStore,
} from "./common.js";
import { perMinute } from "./calc.js";
import { lineChart } from "./charts.js";
import { scalingCard } from "./scaling.js";
import { showProblem, toast } from "./ui.js";

const TOKEN_KEY = "rb.admin.token";
const REFRESH_MS = 5000;
const SLOW_REFRESH_MS = 30_000;
const AUDIT_PAGE = 50;
const CONFIRM_MS = 4000; // a destructive button asks "Confirm?" for this long
const KNOWN_ACTIONS = ["pool.create", "pool.update", "pool.delete", "host.register", "host.drain", "host.undrain",
  "host.remove", "session.start", "session.end", "token.mint"];

const st = {
  token: "",
  timer: 0,
  lastRefresh: 0,
  lastSlow: 0,
  pools: [],
  hosts: [],
  sessions: [],
  audit: [],
  auditMore: false, // the user paged back: keep older entries across refreshes
  rangeH: 24,
  confirm: new Map(), // key -> expiry ms
  busy: new Set(), // keys of actions in flight
  refreshing: false,
};

// =========================================================================================
// sign in
// =========================================================================================
function showSignin(err) {
  stopTimer();
  document.body.dataset.view = "signin";
  $("#signin").hidden = false;
  $("#dashboard").hidden = true;
  for (const id of ["#ready", "#updated", "#auto-wrap", "#refresh", "#signout"]) $(id).hidden = true;
  showProblem("#signin-error", err);
  $("#token").focus();
}

async function signIn(token) {
  // An admin-only endpoint is the real check: a user or node token gets the broker's 403 problem.
  await api(token, "GET", "audit?limit=1");
  const who = await api(token, "GET", "whoami");
  if (who.role !== Role.ADMIN) throw new ApiError(403, { title: "Not allowed", detail: "not an admin token", code: "forbidden" });
  st.token = token;
  tokenStore.set(TOKEN_KEY, token);
  document.body.dataset.view = "dashboard";
  $("#signin").hidden = true;
  $("#dashboard").hidden = false;
  for (const id of ["#ready", "#updated", "#auto-wrap", "#refresh", "#signout"]) $(id).hidden = false;
  st.lastSlow = 0;
  await refresh();
  startTimer();
}

function signOut() {
  st.token = "";
  tokenStore.clear(TOKEN_KEY);
  $("#token").value = "";
  showSignin(null);
}

// =========================================================================================
// refresh loop
// =========================================================================================
function startTimer() {
  stopTimer();
  // tick every second for the "updated … ago" chip; refresh when REFRESH_MS has passed
  st.timer = setInterval(() => {
    if (!document.hidden && $("#auto").checked && Date.now() - st.lastRefresh >= REFRESH_MS) refresh();
    updateAgo();
  }, 1000);
}
function stopTimer() { clearInterval(st.timer); st.timer = 0; }

async function refresh() {
  if (!st.token || st.refreshing) return;
  st.refreshing = true;
  try {
    const auditQuery = `audit?limit=${AUDIT_PAGE}${auditAction() ? `&action=${encodeURIComponent(auditAction())}` : ""}`;
    const [pools, hosts, sessions, audit] = await Promise.all([
      api(st.token, "GET", "pools"), api(st.token, "GET", "hosts"), api(st.token, "GET", "sessions"),
      api(st.token, "GET", auditQuery),
    ]);
    st.pools = pools.pools || [];
    st.hosts = hosts.hosts || [];
    st.sessions = sessions.sessions || [];
    mergeAudit(audit.entries || []);
    showProblem("#dash-error", null);
    renderAll();
    st.lastRefresh = Date.now();
    updateAgo();
    readiness();
    if (Date.now() - st.lastSlow > SLOW_REFRESH_MS) {
      st.lastSlow = Date.now();
      await Promise.all([renderCharts(), renderScaling(), renderRollouts()]);
    }
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      tokenStore.clear(TOKEN_KEY);
      st.token = "";
      showSignin(err);
    } else {
      showProblem("#dash-error", err);
    }
  } finally {
    st.refreshing = false;
  }
}

async function readiness() {
  const chip = $("#ready");
  try {
    const r = await fetch("/readyz", { cache: "no-store" });
    const body = await r.json();
    const bad = Object.entries(body.checks || {}).filter(([, v]) => v !== "ok").map(([k, v]) => `${k} ${v}`);
    render(chip, el("span", { class: `badge ${r.ok ? "up" : "down"}` }, r.ok ? "ready" : "not ready"),
      bad.length ? el("span", {}, bad.join(", ")) : el("span", {}, "Redis + SQL ok"));
  } catch {
    render(chip, el("span", { class: "badge down" }, "unreachable"));
  }
}

function updateAgo() {
  if (st.lastRefresh) $("#updated").textContent = `updated ${fmtAgo(st.lastRefresh)}`;
}

/** Re-render a container, keeping focus on the control with the same data-focus-key. */
function keepFocus(container, fn) {
  const a = document.activeElement;
  const key = a && container.contains(a) ? a.dataset.focusKey : null;
  fn();
  if (key) {
    const again = container.querySelector(`[data-focus-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
}

function renderAll() {
  renderTiles();
  keepFocus($("#pools-table"), renderPools);
  keepFocus($("#hosts-table"), renderHosts);
  keepFocus($("#sessions-table"), renderSessions);
  keepFocus($("#audit-table"), renderAudit);
}

// =========================================================================================
// tiles
// =========================================================================================
function renderTiles() {
  const seatsTotal = st.pools.reduce((a, p) => a + p.seats_total, 0);
  const seatsUsed = st.pools.reduce((a, p) => a + p.seats_used, 0);
  const queued = st.pools.reduce((a, p) => a + p.queue_length, 0);
  const by = (s) => st.sessions.filter((x) => x.state === s).length;
  const hostsBy = (s) => st.hosts.filter((h) => h.state === s).length;
  const tile = (label, value, sub) => el("div", { class: "card tile" },
    el("div", { class: "label" }, label), el("div", { class: "value" }, value), el("div", { class: "sub" }, sub));
  render($("#tiles"),
    tile("Pools", String(st.pools.length), `${st.pools.filter((p) => p.kind === PoolKind.GAME).length} game · `
      + `${st.pools.filter((p) => p.kind === PoolKind.DESKTOP).length} desktop`),
    tile("Hosts up", String(hostsBy(HostState.UP)), `${hostsBy(HostState.DRAINING)} draining · ${hostsBy(HostState.DOWN)} down`),
    tile("Seat utilization", seatsTotal ? `${Math.round((seatsUsed / seatsTotal) * 100)} %` : "–",
      `${seatsUsed} of ${seatsTotal} seats in use`),
    tile("Running", String(by(SessionState.RUNNING)), `${by(SessionState.STARTING)} starting · ${by(SessionState.DISCONNECTED)} disconnected`),
    tile("Queued", String(queued), queued ? "waiting for a seat" : "nobody waiting"));
}

// =========================================================================================
// pools
// =========================================================================================
function meter(frac, label) {
  const pct = Math.max(0, Math.min(1, Number.isFinite(frac) ? frac : 0));
  return el("div", { class: `meter ${pct >= 0.9 ? "high" : pct >= 0.7 ? "mid" : ""}`, role: "meter",
                     "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(Math.round(pct * 100)),
                     "aria-label": label },
    el("span", { style: { width: `${(pct * 100).toFixed(1)}%` } }));
}

function renderPools() {
  const body = $("#pools-table tbody");
  if (!st.pools.length) { render(body, el("tr", {}, el("td", { colspan: 8, class: "empty" }, "No pools yet: PUT /api/v1/pools/{name}"))); return; }
  render(body, st.pools.map((p) => el("tr", { dataset: { pool: p.name } },
    el("th", { scope: "row" }, el("div", {}, p.name), p.description ? el("div", { class: "muted small" }, p.description) : null),
    el("td", {}, el("span", { class: `kind ${p.kind}` }, p.kind)),
    el("td", { class: "small" }, p.strategy),
    el("td", {}, el("div", { class: "state-chips" },
      Object.entries(p.hosts || {}).filter(([, n]) => n > 0).map(([s, n]) => el("span", { class: `badge ${s}` }, `${n} ${s}`)),
      Object.values(p.hosts || {}).every((n) => !n) ? el("span", { class: "faint" }, "none") : null)),
    el("td", {}, el("div", { class: "seat-cell" },
      el("div", { class: "nums" }, el("span", {}, `${p.seats_used} / ${p.seats_total}`),
        el("span", { class: "muted" }, p.seats_total ? `${Math.round((p.seats_used / p.seats_total) * 100)} %` : "")),
      meter(p.seats_total ? p.seats_used / p.seats_total : 0, `${p.name} seat usage`))),
    el("td", { class: "num" }, String(p.seats_free)),
    el("td", { class: "num" }, String(p.queue_length)),
    el("td", {}, el("div", { class: "state-chips" },
      Object.entries(p.sessions || {}).map(([s, n]) => el("span", { class: `badge ${n ? s : ""}` }, `${n} ${s}`)))))));
}

// =========================================================================================
// hosts
// =========================================================================================
// How a registered GPU encodes; nodes from before the "encode" field only said nvenc true/false.
function gpuEncode(g) { return g.encode || (g.nvenc ? "nvenc" : "software"); }

function encodeBadge(g) {
  const mode = gpuEncode(g);
  return el("span", { class: `encode ${mode}`, "data-testid": "gpu-encode", dataset: { encode: mode },
                      title: g.reason || (mode === "software" ? "sessions on this GPU encode on the CPU" : "hardware encode") },
    mode === "software" ? "software encode" : "NVENC");
}

function gpuCard(g, tel) {
  const t = tel || {};
  const num = (v) => (Number.isFinite(v) ? v : null);
  const util = num(t.utilization);
  const enc = num(t.encoder_utilization);
  const vram = num(t.vram_used_mb);
  const total = num(t.vram_total_mb) ?? g.vram_mb; // NVML's figure, else the registered size (MiB)
  const temp = num(t.temperature_c);
  const power = num(t.power_w);
  const sessions = num(t.encoder_sessions);
  const fps = num(t.encoder_fps);
  const throttled = (t.throttle_reasons || []).filter((r) => r !== "gpu_idle"); // idle clocks are not a problem
  const metric = (label, value, frac) => el("div", { class: "metric" }, el("b", {}, value), label,
    frac === null || frac === undefined ? null : meter(frac, label));
  const encoderLabel = sessions === null ? "encoder" : `encoder · ${sessions} sess.${fps ? ` · ${Math.round(fps)} fps` : ""}`;
  return el("div", { class: "gpu", dataset: { gpu: g.index, encode: gpuEncode(g) } },
    el("div", { class: "name" },
      el("span", {}, el("b", {}, `GPU ${g.index}`), ` · ${g.model || "unknown"} `, encodeBadge(g)),
      el("span", { class: "muted" }, `${g.used ?? 0}/${g.seats ?? "?"} seats`)),
    el("div", { class: "metrics" },
      metric("util", util === null ? "–" : `${Math.round(util)} %`, util === null ? null : util / 100),
      metric("VRAM", vram === null ? fmtMiB(total) : `${fmtMiB(vram)} / ${fmtMiB(total)}`,
        vram === null || !total ? null : vram / total),
      metric(encoderLabel, enc === null ? "–" : `${Math.round(enc)} %`, enc === null ? null : enc / 100),
      metric("temp", temp === null ? "–" : `${Math.round(temp)} °C`, temp === null ? null : temp / 95),
      metric("power", power === null ? "–" : `${Math.round(power)} W`, null)),
    throttled.length ? el("div", { class: "throttle small", "data-testid": "gpu-throttle" },
      `throttled: ${throttled.join(", ")}`) : null);
}

function hostAction(h) {
  if (h.state === HostState.DOWN) return el("span", { class: "faint small" }, "down");
  const draining = h.state === HostState.DRAINING;
  const key = `host:${h.id}:${draining ? "undrain" : "drain"}`;
  return el("button", {
    class: `sm ${draining ? "" : "warn"}`, "data-focus-key": key, dataset: { action: draining ? "undrain" : "drain" },
    disabled: st.busy.has(key), "aria-label": `${draining ? "Undrain" : "Drain"} host ${h.id}`,
    onclick: () => hostCommand(h.id, draining ? "undrain" : "drain", key),
  }, draining ? "Undrain" : "Drain");
}

function renderHosts() {
  const body = $("#hosts-table tbody");
  if (!st.hosts.length) { render(body, el("tr", {}, el("td", { colspan: 6, class: "empty" }, "No render nodes have registered."))); return; }
  render(body, st.hosts.map((h) => {
    const tel = h.telemetry || {};
    const telByIndex = new Map((tel.gpus || []).map((g) => [g.index, g]));
    const stale = !h.alive && h.state !== HostState.DOWN;
    return el("tr", { dataset: { host: h.id, state: h.state } },
      el("th", { scope: "row" }, el("div", {}, h.id), el("div", { class: "muted small" }, `${h.pool || "–"} · ${h.address || ""}`),
        h.version ? el("div", { class: "faint small" }, `v${h.version}`) : null),
      el("td", {}, el("span", { class: `badge ${h.state}`, "data-testid": "host-state" }, h.state),
        stale ? el("div", { class: "small", style: { color: "var(--warn)" } }, "lease expired") : null),
      el("td", { class: "small" }, el("div", {}, h.heartbeat_ms ? fmtAgo(h.heartbeat_ms) : "never"),
        el("div", { class: "faint" }, `lease ${fmtDuration(h.lease_ttl_ms / 1000)}`),
        Number.isFinite(tel.cpu_percent) ? el("div", { class: "faint" }, `CPU ${Math.round(tel.cpu_percent)} %`) : null),
      el("td", {}, el("div", { class: "seat-cell" },
        el("div", { class: "nums" }, el("span", {}, `${h.seats_used ?? 0} / ${h.seats_total ?? 0}`),
          el("span", { class: "muted" }, `${(h.sessions || []).length} sess.`)),
        meter(h.seats_total ? (h.seats_used || 0) / h.seats_total : 0, `${h.id} seat usage`))),
      el("td", {}, el("div", { class: "gpu-list" }, (h.gpus || []).map((g) => gpuCard(g, telByIndex.get(g.index))))),
      el("td", {}, hostAction(h)));
  }));
}

async function hostCommand(id, action, key) {
  st.busy.add(key);
  keepFocus($("#hosts-table"), renderHosts);
  try {
    await api(st.token, "POST", `hosts/${encodeURIComponent(id)}/${action}`);
    toast(`Host ${id}: ${action === "drain" ? "draining — no new sessions will be placed on it" : "accepting sessions again"}`);
  } catch (err) {
    toast(`${action} ${id} failed: ${problemText(err)}`, { error: true });
  } finally {
    st.busy.delete(key);
  }
  await refresh();
  const again = document.querySelector(`[data-focus-key="host:${CSS.escape(id)}:${action === "drain" ? "undrain" : "drain"}"]`);
  if (again) again.focus();
}

// =========================================================================================
// sessions
// =========================================================================================
function streamTelemetry() {
  const m = new Map();
  for (const h of st.hosts) for (const s of (h.telemetry && h.telemetry.sessions) || []) m.set(s.id, s);
  return m;
}

function renderSessions() {
  const body = $("#sessions-table tbody");
  const order = { running: 0, starting: 1, disconnected: 2, queued: 3 };
  const rows = [...st.sessions].sort((a, b) => (order[a.state] ?? 9) - (order[b.state] ?? 9)
    || (a.queue_position ?? 0) - (b.queue_position ?? 0) || a.created_ms - b.created_ms);
  $("#sessions-count").textContent = `${rows.length} live`;
  if (!rows.length) { render(body, el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No live sessions."))); return; }
  const tel = streamTelemetry();
  const now = Date.now();
  render(body, rows.map((s) => {
    const t = tel.get(s.id);
    const pr = s.profile || {};
    const key = `session:${s.id}:end`;
    const confirming = (st.confirm.get(key) || 0) > now;
    return el("tr", { dataset: { session: s.id, state: s.state } },
      el("th", { scope: "row" }, el("span", { class: "mono", title: s.id }, s.id.slice(0, 8))),
      el("td", {}, s.user),
      el("td", {}, s.pool),
      el("td", {}, el("span", { class: `badge ${s.state}` }, s.state),
        s.state === SessionState.QUEUED && s.queue_position ? el("span", { class: "muted small" }, ` #${s.queue_position}`) : null),
      el("td", { class: "small" }, s.host ? `${s.host} · GPU ${s.gpu ?? "?"}` : el("span", { class: "faint" }, "—")),
      el("td", { class: "small mono" }, pr.width ? `${pr.width}×${pr.height}@${pr.fps}` : "–"),
      el("td", { class: "small" }, t ? [
        el("div", {}, `${fmtNum(t.fps, 0, " fps")} · ${fmtBitrate(t.bitrate_bps)}`,
          t.candidate ? el("span", { class: `badge path-${t.candidate}`, title: PATH_TITLES[t.candidate] || "",
            dataset: { path: t.candidate } }, t.candidate) : null),
        el("div", { class: "faint" }, `rtt ${fmtNum(t.rtt_ms, 0, " ms")} · loss ${fmtNum((t.loss ?? NaN) * 100, 1, " %")}${t.encoder ? ` · ${t.encoder}` : ""}`),
      ] : el("span", { class: "faint" }, "—")),
      el("td", { class: "small" }, fmtDuration((now - s.created_ms) / 1000)),
      el("td", {}, el("button", {
        class: "sm danger", "data-focus-key": key, dataset: { action: "end" }, disabled: st.busy.has(key),
        "aria-label": confirming ? `Confirm ending session ${s.id.slice(0, 8)} of ${s.user}` : `End session ${s.id.slice(0, 8)} of ${s.user}`,
        onclick: () => endSession(s, key),
      }, confirming ? "Confirm end" : "End")));
  }));
}

async function endSession(s, key) {
  const now = Date.now();
  if ((st.confirm.get(key) || 0) <= now) {
    st.confirm.set(key, now + CONFIRM_MS);
    keepFocus($("#sessions-table"), renderSessions);
    setTimeout(() => { st.confirm.delete(key); keepFocus($("#sessions-table"), renderSessions); }, CONFIRM_MS + 50);
    return;
  }
  st.confirm.delete(key);
  st.busy.add(key);
  try {
    await api(st.token, "DELETE", `sessions/${encodeURIComponent(s.id)}`);
    toast(`Ended session ${s.id.slice(0, 8)} of ${s.user}`);
  } catch (err) {
    toast(`Could not end ${s.id.slice(0, 8)}: ${problemText(err)}`, { error: true });
  } finally {
    st.busy.delete(key);
  }
  await refresh();
}

// =========================================================================================
// charts
// =========================================================================================
async function renderCharts() {
  const box = $("#charts");
  if (!st.pools.length) { render(box, el("div", { class: "placeholder" }, "No pools to chart.")); return; }
  const hours = st.rangeH;
  const results = await Promise.all(st.pools.map((p) =>
    api(st.token, "GET", `pools/${encodeURIComponent(p.name)}/samples?hours=${hours}`).then((r) => r.samples || [], (err) => err)));
  const until = Date.now();
  const since = until - hours * 3_600_000;
  render(box, st.pools.map((p, i) => {
    const samples = results[i];
    const card = el("article", { class: "card chart-card", dataset: { pool: p.name } },
      el("h3", {}, p.name, el("span", { class: `kind ${p.kind}` }, p.kind)));
    if (samples instanceof Error) { card.append(el("div", { class: "notice error" }, problemText(samples))); return card; }
    const pts = (f) => samples.map((s) => [s.ts_ms, f(s)]);
    // headroom above the highest line so the capacity line does not sit on the frame
    const capacity = Math.max(1, ...samples.map((s) => Math.max(s.seats_total, s.sessions, s.queue_length))) * 1.1;
    card.append(el("div", { class: "chart-pair" },
      lineChart({
        title: "Concurrent sessions", x0: since, x1: until, yMax: capacity, yFmt: (v) => String(Math.round(v)),
        yLabel: "sessions", integer: true,
        series: [
          { name: "sessions", color: "#6d8cff", points: pts((s) => s.sessions), area: true },
          { name: "queued", color: "#f3a93b", points: pts((s) => s.queue_length) },
          { name: "seats (capacity)", color: "#9ba5b9", points: pts((s) => s.seats_total), dashed: true, step: true },
        ],
      }),
      lineChart({
        title: "Seat utilization", x0: since, x1: until, yMax: 100, yFmt: (v) => `${Math.round(v)} %`, yLabel: "% of seats",
        series: [
          { name: "seats used", color: "#39c98a", area: true,
            points: samples.filter((s) => s.seats_total > 0).map((s) => [s.ts_ms, (s.seats_used / s.seats_total) * 100]) },
        ],
      })));
    return card;
  }));
}

// =========================================================================================
// scaling plan & recommendation (optional API: the section stays hidden while it answers 404)
// =========================================================================================
async function getOptional(path) {
  try {
    return await api(st.token, "GET", path);
  } catch (err) {
    if (err instanceof ApiError && (err.status === 404 || err.status === 405)) return null;
    return err;
  }
}

// how a session's media reaches its viewer (the node reports the nominated ICE pair)
const PATH_TITLES = {
  host: "direct: node and viewer reach each other",
  srflx: "through a NAT mapping (STUN)",
  relay: "relayed by the TURN server: costs TURN bandwidth, adds a hop",
};

async function renderScaling() {
  const section = $("#scaling-section");
  const box = $("#scaling");
  const results = await Promise.all(st.pools.map(async (p) => {
    const name = encodeURIComponent(p.name);
    const [plan, rec] = await Promise.all([getOptional(`pools/${name}/plan`), getOptional(`pools/${name}/recommendation`)]);
    // the latest decisions and the numbers behind them, only where the pool is autoscaled
    const status = plan && !(plan instanceof Error) ? await getOptional(`pools/${name}/autoscale?limit=20`) : null;
    return { pool: p, plan, rec, status };
  }));
  const any = results.filter((r) => (r.plan && !(r.plan instanceof Error)) || (r.rec && !(r.rec instanceof Error)));
  if (!any.length) { section.hidden = true; render(box); return; }
  section.hidden = false;
  keepFocus(box, () => render(box, results.map(({ pool, plan, rec, status }) => scalingCard(pool, plan, rec, status))));
}

// =========================================================================================
// canary rollouts (GET /pools/{name}/rollout answers 404 where a pool has none)
// =========================================================================================
async function renderRollouts() {
  const section = $("#rollout-section");
  const box = $("#rollouts");
  const results = (await Promise.all(st.pools.map(async (p) => ({
    pool: p, r: await getOptional(`pools/${encodeURIComponent(p.name)}/rollout`) }))))
    .filter(({ r }) => r !== null);
  if (!results.length) { section.hidden = true; render(box); return; }
  section.hidden = false;
  keepFocus(box, () => render(box, results.map(({ pool, r }) => rolloutCard(pool, r))));
}

function healthRow(label, h) {
  if (!h) return null;
  // seated -> first decoded frame where nodes report it, else seated -> running (what the judge compares)
  const viewer = Number.isFinite(h.viewer_first_frame_ms_p50);
  const ffMs = viewer ? h.viewer_first_frame_ms_p50 : h.first_frame_ms_p50;
  const ff = Number.isFinite(ffMs) ? `${Math.round(ffMs)} ms${viewer ? "" : " (start)"}` : "–";
  return el("tr", {}, el("th", { scope: "row" }, label), el("td", {}, fmtNum(h.sessions)),
    el("td", {}, `${h.start_failed} (${h.start_failure_pct} %)`), el("td", {}, `${h.crashed} (${h.crash_pct} %)`),
    el("td", {}, perMinute(h.freezes, h.reported_minutes)), el("td", {}, perMinute(h.encoder_errors, h.reported_minutes)),
    el("td", {}, ff));
}

function rolloutCard(pool, r) {
  if (r instanceof Error) {
    return el("article", { class: "card scaling-card compact", dataset: { pool: pool.name } },
      el("h3", {}, pool.name), el("p", { class: "small", style: { color: "var(--danger)" } }, problemText(r)));
  }
  const p = r.policy;
  const rolledBack = r.state === "rolled_back";
  const last = r.last || null;
  const key = (action) => `rollout:${pool.name}:${action}`;
  const button = (action, label, cls) => el("button", {
    class: `sm ${cls}`, "data-focus-key": key(action), dataset: { action }, disabled: st.busy.has(key(action)),
    "aria-label": `${label} the canary of pool ${pool.name}`, onclick: () => rolloutCommand(pool.name, action, key(action)),
  }, label);
  return el("article", { class: "card scaling-card", dataset: { pool: pool.name, state: r.state } },
    el("h3", {}, pool.name,
      el("span", { class: `badge ${rolledBack ? "down" : "up"}`, "data-testid": "rollout-state" }, r.state.replace("_", " ")),
      el("span", { class: "chip" }, "candidate ", el("b", {}, p.candidate_version),
        ` · ${r.split ? r.split.share_pct : p.share_pct} % of new sessions · ${r.candidate_hosts.length} candidate / `
        + `${r.stable_hosts.length} stable host(s)`)),
    last ? el("p", { class: "small" }, el("b", {}, `${last.action}: ${last.reason.replaceAll("_", " ")}`), ` — ${last.detail}`,
      el("span", { class: "faint" }, ` (${fmtAgo(last.ts_ms)})`))
      : el("p", { class: "muted small" }, "Not judged yet."),
    last && last.candidate ? el("table", { class: "small" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "sessions"), el("th", {}, "start failures"),
        el("th", {}, "crashes"), el("th", {}, "freezes/min"), el("th", {}, "encoder errors/min"),
        el("th", {}, "first frame p50"))),
      el("tbody", {}, healthRow(`candidate ${p.candidate_version}`, last.candidate), healthRow("stable", last.stable))) : null,
    el("div", { class: "row" },
      button("promote", "Promote", ""),
      rolledBack ? null : button("rollback", "Roll back", "warn")));
}

async function rolloutCommand(pool, action, key) {
  st.busy.add(key);
  try {
    await api(st.token, "POST", `pools/${encodeURIComponent(pool)}/rollout/${action}`, { reason: "from the dashboard" });
    toast(`Pool ${pool}: ${action === "promote" ? "candidate promoted" : "canary rolled back, its hosts draining"}`);
  } catch (err) {
    toast(`${action} ${pool} failed: ${problemText(err)}`, { error: true });
  } finally {
    st.busy.delete(key);
    st.lastSlow = 0;
    refresh();
  }
}

// =========================================================================================
// audit log
// =========================================================================================
function auditAction() { return $("#audit-action").value; }

function mergeAudit(newest) {
  if (!st.auditMore) { st.audit = newest; return; }
  const seen = new Set(st.audit.map((e) => e.id));
  st.audit = [...newest.filter((e) => !seen.has(e.id)), ...st.audit];
}

function renderAudit() {
  const body = $("#audit-table tbody");
  const sel = $("#audit-action");
  const known = new Set([...KNOWN_ACTIONS, ...st.audit.map((e) => e.action)]);
  for (const a of [...known].sort()) {
    if (![...sel.options].some((o) => o.value === a)) sel.append(el("option", { value: a }, a));
  }
  if (!st.audit.length) { render(body, el("tr", {}, el("td", { colspan: 5, class: "empty" }, "No audit entries."))); return; }
  render(body, st.audit.map((e) => el("tr", { dataset: { action: e.action } },
    el("td", { class: "small", title: new Date(e.ts_ms).toISOString() }, fmtTime(e.ts_ms)),
    el("td", {}, e.actor, el("span", { class: "faint small" }, ` (${e.role})`)),
    el("td", {}, el("code", {}, e.action)),
    el("td", { class: "small mono" }, e.target || "–"),
    el("td", {}, e.detail && Object.keys(e.detail).length
      ? el("div", { class: "detail-json", title: JSON.stringify(e.detail, null, 1) }, JSON.stringify(e.detail)) : el("span", { class: "faint" }, "—")))));
}

async function loadOlderAudit() {
  const last = st.audit[st.audit.length - 1];
  if (!last) return;
  const q = `audit?limit=${AUDIT_PAGE}&before_id=${last.id}${auditAction() ? `&action=${encodeURIComponent(auditAction())}` : ""}`;
  try {
    const older = (await api(st.token, "GET", q)).entries || [];
    st.auditMore = true;
    st.audit = [...st.audit, ...older];
    $("#audit-more").disabled = older.length < AUDIT_PAGE;
    keepFocus($("#audit-table"), renderAudit);
  } catch (err) {
    toast(problemText(err), { error: true });
  }
}

// =========================================================================================
// wiring
// =========================================================================================
function wire() {
  $("#signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = $("#token").value.trim();
    showProblem("#signin-error", null);
    if (!token) { showProblem("#signin-error", new Error("Paste the admin token first.")); return; }
    $("#signin-submit").disabled = true;
    try { await signIn(token); } catch (err) { showProblem("#signin-error", err); } finally { $("#signin-submit").disabled = false; }
  });
  $("#signout").addEventListener("click", signOut);
  $("#refresh").addEventListener("click", () => { st.lastSlow = 0; refresh(); });
  $("#range").addEventListener("change", () => { st.rangeH = Number($("#range").value); renderCharts(); });
  $("#audit-action").addEventListener("change", () => { st.auditMore = false; $("#audit-more").disabled = false; refresh(); });
  $("#audit-more").addEventListener("click", loadOlderAudit);
  document.addEventListener("visibilitychange", () => { if (!document.hidden && st.token) refresh(); });
}

window.renderBrokerAdmin = Object.freeze({
  refresh: () => { st.lastSlow = 0; return refresh(); },
  get state() { return { pools: st.pools, hosts: st.hosts, sessions: st.sessions, lastRefresh: st.lastRefresh }; },
});

async function boot() {
  wire();
  const saved = tokenStore.get(TOKEN_KEY);
  if (saved) {
    try { await signIn(saved); return; } catch (err) { tokenStore.clear(TOKEN_KEY); showSignin(err); return; }
  }
  showSignin(null);
}

boot();
