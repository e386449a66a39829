// Small UI pieces both pages use: problem boxes (RFC 9457 bodies from the broker), toasts,
// the warning banner.  They write into elements the pages declare (#toast, #banner, ...).

import { $, ApiError, el, fmtDuration, problemText, render } from "./common.js";

/** Show an error in `selector` (title, detail, "HTTP 403 · forbidden"); hide the box for a null error. */
export function showProblem(selector, err) {
  const box = $(selector);
  if (!err) { box.hidden = true; return; }
  const p = err instanceof ApiError ? err.problem : null;
  render(box,
    el("strong", {}, p && p.title ? p.title : "Error"),
    el("div", { "data-testid": "problem-detail" }, p && p.detail ? p.detail : problemText(err)),
    err instanceof ApiError && err.status
      ? el("div", { class: "code" }, `HTTP ${err.status}${p && p.code ? ` · ${p.code}` : ""}`) : null);
  box.hidden = false;
}

let toastTimer = 0;
/** A short message in the corner (#toast). */
export function toast(text, { error = false, ms = 4000 } = {}) {
  const t = $("#toast");
  t.className = `toast notice ${error ? "error" : "info"}`;
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, ms);
}

let bannerTimer = 0;
/** The warning banner (#banner) for a broker "warning" event or a node "warn" message, with a countdown. */
export function showWarning(msg) {
  const endsAt = Number.isFinite(msg.ends_in_s) ? Date.now() + msg.ends_in_s * 1000 : null;
  // The broker's detail may end with its own countdown ("... in 300 s"), stale a second later:
  // drop it and count down here.
  let base = String(msg.detail || "").replace(/\s+in \d+\s*s\.?$/, "").trim();
  base = base ? `${base[0].toUpperCase()}${base.slice(1)}.` : "Your session is about to end.";
  $("#banner").title = msg.detail || "";
  const update = () => {
    const left = endsAt ? Math.max(0, (endsAt - Date.now()) / 1000) : null;
    $("#banner-text").textContent = left !== null ? `${base} Save your work: it ends in ${fmtDuration(left)}.` : base;
  };
  update();
  $("#banner").hidden = false;
  document.body.classList.add("has-banner");
  clearInterval(bannerTimer);
  if (endsAt) bannerTimer = setInterval(update, 1000);
}

export function hideWarning() {
  clearInterval(bannerTimer);
  $("#banner").hidden = true;
  document.body.classList.remove("has-banner");
}
