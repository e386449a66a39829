// Helpers shared by the viewer (client.js) and the admin dashboard (admin.js):
// the REST call wrapper with RFC 9457 problem bodies, token storage, a tiny DOM
// builder and formatters.  No framework, no network access beyond the broker.

import { API_PREFIX } from "./protocol.js";

/** An HTTP error from the broker; `problem` is its JSON problem body when it sent one. */
export class ApiError extends Error {
  constructor(status, problem, fallback) {
    const detail = problem && (problem.detail || problem.title);
    super(detail || fallback || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || null;
    this.code = (problem && problem.code) || (status ? `http_${status}` : "network");
  }
}

/**
 * Call the broker API. `path` is relative to API_PREFIX unless it starts with "/api" or "/".
 * Resolves to the parsed JSON body (or null for 204); rejects with ApiError.
 */
export async function api(token, method, path, body, { signal } = {}) {
  const url = path.startsWith("/") ? path : `${API_PREFIX}/${path}`;
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(url, {
      method, headers, signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new ApiError(0, null, "the broker is unreachable (network error)");
  }
  if (resp.status === 204) return null;
  let data = null;
  const text = await resp.text();
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!resp.ok) throw new ApiError(resp.status, data, `${resp.status} ${resp.statusText}`);
  return data;
}

/** Append ?access_token= (EventSource and WebSocket cannot send an Authorization header). */
export function withToken(path, token) {
  return `${path}${path.includes("?") ? "&" : "?"}access_token=${encodeURIComponent(token)}`;
}

/** ws:// or wss:// URL for a same-origin path. */
export function wsUrl(path) {
  const u = new URL(path, location.href);
  u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return u.toString();
}

// ---- token storage: per tab (sessionStorage) so two tabs can hold two identities ----------
export const tokenStore = {
  get(key) { try { return sessionStorage.getItem(key) || ""; } catch { return ""; } },
  set(key, value) { try { sessionStorage.setItem(key, value); } catch { /* private mode */ } },
  clear(key) { try { sessionStorage.removeItem(key); } catch { /* private mode */ } },
};

/**
 * el("div", {class: "x", onclick: fn, dataset: {a: 1}}, child, "text", [more children])
 * Strings become text nodes (never HTML), so broker data cannot inject markup.
 */
export function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "style" && typeof v === "object") Object.assign(node.style, v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  appendAll(node, children);
  return node;
}

function appendAll(node, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) appendAll(node, c);
    else node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replace a container's children. */
export function render(container, ...children) {
  container.replaceChildren();
  appendAll(container, children);
}

export const $ = (sel, root = document) => root.querySelector(sel);

// ---- formatters -----------------------------------------------------------------------------
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} min ${String(s % 60).padStart(2, "0")} s` : `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return m % 60 ? `${h} h ${String(m % 60).padStart(2, "0")} min` : `${h} h`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

export function fmtAgo(ms, now = Date.now()) {
  if (!ms) return "–";
  const s = (now - ms) / 1000;
  if (s < 5) return "just now";
  return `${fmtDuration(s)} ago`;
}

export function fmtTime(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
                                       second: "2-digit", hour12: false });
}

export function fmtNum(v, digits = 0, unit = "") {
  if (v === null || v === undefined || !Number.isFinite(Number(v))) return "–";
  return `${Number(v).toFixed(digits)}${unit}`;
}

export function fmtBitrate(bps) {
  if (bps === null || bps === undefined || !Number.isFinite(bps)) return "–";
  if (bps >= 1e6) return `${(bps / 1e6).toFixed(2)} Mbit/s`;
  return `${Math.round(bps / 1e3)} kbit/s`;
}

export function fmtMiB(mb) {
  if (mb === null || mb === undefined || !Number.isFinite(Number(mb))) return "–";
  return mb >= 1024 ? `${(mb / 1024).toFixed(1)} GiB` : `${Math.round(mb)} MiB`;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Human text for a problem (title + detail) for banners. */
export function problemText(err) {
  if (err instanceof ApiError) {
    const p = err.problem;
    if (p && p.title && p.detail) return `${p.title}: ${p.detail}`;
    return err.message;
  }
  return String((err && err.message) || err);
}
