// The admin dashboard's "Scaling plan & recommendation" cards: a pool's scaling plan
// (GET /api/v1/pools/{name}/plan: its mode -- reactive or predictive with its margin --, phase
// tables, the phase running now marked), its sizing recommendation (GET /api/v1/pools/{name}/
// recommendation: host-hours compared, each as a multiple of the zero-wait packing oracle's and of
// the lower bound's, scenario results, the tuned plan) and, when the caller passes the autoscaler
// view (GET /api/v1/pools/{name}/autoscale), its latest decisions with their reasons and numbers
// (forecast, margin, actual).  A shape this module does not know is still shown, as plain
// key/value tables.  The exported helpers below `scalingCard` are pure (tests/web/test_scaling.py
// runs them in Node).

import { el, fmtDuration, fmtNum, fmtTime, problemText } from "./common.js";

/** One pool's card; `plan`, `rec` and `status` (optional) are the parsed bodies, null (404) or an Error. */
export function scalingCard(pool, plan, rec, status = null) {
  if (plan === null && rec === null) {
    return el("article", { class: "card scaling-card compact", dataset: { pool: pool.name } },
      el("h3", {}, pool.name, el("span", { class: "badge" }, "autoscaling off")),
      el("p", { class: "muted small", style: { margin: 0 } }, "No scaling plan and no recommendation yet: "
        + `PUT /api/v1/pools/${pool.name}/plan turns autoscaling on, POST …/simulate recommends one.`));
  }
  const phase = plan && !(plan instanceof Error) ? plan.phase : null;
  return el("article", { class: "card scaling-card", dataset: { pool: pool.name } },
    el("h3", {}, pool.name,
      plan && !(plan instanceof Error) ? el("span", { class: "badge up" }, "autoscaling on") : el("span", { class: "badge" }, "autoscaling off"),
      phase ? el("span", { class: "chip" }, "phase ", el("b", {}, String(phase.name).replace("_", " ")),
        ` · ${phase.strategy} · scale out above ${phase.capacity_threshold_pct} % · keep ${phase.min_hosts_pct} % hosts`) : null),
    el("div", { class: "scaling-cols" },
      el("div", {}, el("h4", {}, "Scaling plan"), scalingBlock(plan, renderPlan, "No plan: the pool is not autoscaled.")),
      el("div", {}, el("h4", {}, "Recommendation"), scalingBlock(rec, renderRecommendation,
        "No recommendation yet (POST …/simulate computes one)."))),
    status && !(status instanceof Error) && Array.isArray(status.decisions) && status.decisions.length
      ? el("details", {}, el("summary", { class: "small" }, `Latest autoscaler decisions (${status.decisions.length})`),
        scalingBlock(status.decisions, renderDecisions, "")) : null);
}

/** How a plan sizes the pool, in one line: reactive thresholds, or predictive with its margin. */
export function planModeText(plan) {
  const p = plan && plan.plan && Array.isArray(plan.plan.schedules) ? plan.plan : plan;
  if (!p || p.mode !== "predictive") return "reactive: phase thresholds on live load";
  const s = p.predictive || {};
  const parts = [`margin ${num(s.margin_pct)} % + ${num(s.margin_seats)} seats`];
  if (Number.isFinite(s.boot_s)) parts.push(`looks ${num(s.boot_s)} s + one interval ahead`);
  if (Number.isFinite(s.history_weeks)) parts.push(`${num(s.history_weeks)} weeks of history`);
  return `predictive: forecast demand, ${parts.join(" · ")}`;
}

/** Host-hours of each simulated plan with its multiple of the packing oracle and of the lower bound. */
export function yardstickRows(report) {
  const hh = (report && report.host_hours) || {};
  const y = (report && report.yardsticks) || {};
  const oracle = Number(y.oracle_host_hours);
  const bound = Number(y.lower_bound_host_hours);
  const ratio = (h, ref) => (ref > 0 ? Math.round((1000 * h) / ref) / 1000 : null);
  const rows = Object.entries(hh).filter(([, v]) => Number.isFinite(v))
    .map(([key, hours]) => ({ key, hours, vsOracle: ratio(hours, oracle), vsBound: ratio(hours, bound) }));
  if (oracle > 0) rows.push({ key: "oracle", hours: oracle, vsOracle: 1, vsBound: ratio(oracle, bound) });
  if (bound > 0) rows.push({ key: "lower_bound", hours: bound, vsOracle: ratio(bound, oracle), vsBound: 1 });
  return rows;
}

/** The numbers behind one logged decision (its `detail` object), in one line; "" when it has none. */
export function decisionFacts(detail) {
  const d = detail || {};
  if (!Number.isFinite(d.target)) return "";
  const parts = [];
  if (Number.isFinite(d.forecast)) parts.push(`forecast ${num(d.forecast)} (x${num(d.correction, 2)} correction)`);
  if (Number.isFinite(d.trend)) parts.push(`trend ${num(d.trend)}`);
  if (Number.isFinite(d.actual)) parts.push(`actual ${num(d.actual)}`);
  parts.push(`margin ${num(d.margin_pct)} % + ${num(d.margin_seats)}`);
  return `${parts.join(" · ")} → target ${num(d.target)} seats, capacity ${num(d.capacity)}`;
}

function num(v, digits = 0) {
  if (!Number.isFinite(v)) return "–";
  return Number.isInteger(v) && !digits ? String(v) : Number(v).toFixed(digits);
}

const yardLabel = { oracle: "packing oracle", lower_bound: "lower bound" };

/** The decision log (newest first): when, what, why, and the numbers behind it. */
function renderDecisions(decisions) {
  return el("div", { class: "table-wrap" }, el("table", { class: "compact" },
    el("thead", {}, el("tr", {}, ["When", "Phase", "Decision", "Reason", "Numbers"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, decisions.slice(0, 20).map((d) => el("tr", {},
      el("td", { class: "small" }, d.ts_ms ? fmtTime(d.ts_ms) : "–"), el("td", { class: "small" }, label(d.phase || "")),
      el("td", { class: "small" }, `${label(d.kind || "")} ${d.host || (Number.isFinite(d.count) ? `× ${d.count}` : "")}`),
      el("td", { class: "small mono" }, d.reason || ""),
      el("td", { class: "small wrap" }, decisionFacts(d.detail) || (d.detail && d.detail.detail) || ""))))));
}

function scalingBlock(value, renderer, none) {
  if (value === null) return el("div", { class: "faint small" }, none);
  if (value instanceof Error) return el("div", { class: "notice error small" }, problemText(value));
  try {
    return renderer(value);
  } catch {
    return renderGeneric(value); // an unexpected shape still shows, plainly
  }
}

const PHASES = ["ramp_up", "peak", "ramp_down", "off_peak"];
const label = (k) => String(k).replaceAll("_", " ");

/** A plan (the plan body itself, or the GET view {pool, plan, updated_ms, phase}) as phase tables. */
function renderPlan(view) {
  const p = view && view.plan && Array.isArray(view.plan.schedules) ? view.plan : view;
  if (!p || !Array.isArray(p.schedules)) return renderGeneric(view);
  const phase = view.phase || null;
  return el("div", { class: "stack" },
    el("div", { class: "small muted" }, el("b", { style: { color: "var(--text)" } }, p.name || "plan"),
      ` · ${planModeText(p)}`, ` · ${p.time_zone || "UTC"}`,
      Number.isFinite(p.scale_in_cooldown_min) ? ` · scale-in cooldown ${p.scale_in_cooldown_min} min` : "",
      Number.isFinite(p.scale_in_margin_pct) ? ` · margin ${p.scale_in_margin_pct} %` : "",
      view.updated_ms ? ` · updated ${fmtTime(view.updated_ms)}` : ""),
    p.schedules.map((sc) => el("div", { class: "table-wrap" }, el("table", { class: "compact" },
      el("caption", {}, el("b", {}, sc.name || "schedule"), ` · ${(sc.days || []).join(", ")}`,
        sc.scale_in_mode ? ` · scale-in: ${label(sc.scale_in_mode)}` : ""),
      el("thead", {}, el("tr", {}, ["Phase", "Start", "Strategy", "Scale out at", "Min hosts"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, PHASES.filter((ph) => sc[ph]).map((ph) => {
        const current = phase && phase.schedule === sc.name && phase.name === ph;
        return el("tr", { class: current ? "current" : "" },
          el("th", { scope: "row" }, label(ph), current ? el("span", { class: "badge up", style: { marginLeft: "0.4em" } }, "now") : null),
          el("td", { class: "mono" }, sc[ph].start), el("td", { class: "small" }, sc[ph].strategy),
          el("td", { class: "num" }, `${sc[ph].capacity_threshold_pct} %`), el("td", { class: "num" }, `${sc[ph].min_hosts_pct} %`));
      }))))));
}

/** The sizing report of POST …/simulate: host-hours compared, scenario results, the tuned plan. */
function renderRecommendation(r) {
  if (!r || !Array.isArray(r.results)) return renderGeneric(r);
  const hh = r.host_hours || {};
  const maxH = Math.max(1, ...Object.values(hh).filter(Number.isFinite));
  const params = r.recommended_params || {};
  const cols = [["label", "Scenario"], ["host_hours", "Host h"], ["cost", "Cost"], ["served", "Served"],
    ["abandoned", "Left"], ["wait_p95_s", "Wait p95"], ["waited_over_60s_pct", "Wait > 60 s"], ["peak_hosts_on", "Peak hosts"]];
  const cell = (k, v) => {
    if (k === "wait_p95_s") return fmtDuration(v);
    if (k === "waited_over_60s_pct") return `${fmtNum(v, 1)} %`;
    if (k === "host_hours" || k === "cost") return fmtNum(v, 1);
    return scalarText(v);
  };
  return el("div", { class: "stack" },
    el("div", { class: "row small" },
      r.recommended_plan ? el("span", {}, "Tuned plan ", el("b", {}, r.recommended_plan.name || "")) : null,
      "meets_target" in r ? el("span", { class: `badge ${r.meets_target ? "up" : "draining"}` },
        r.meets_target ? "meets the wait target" : "misses the wait target") : null,
      Object.keys(params).length ? el("span", { class: "muted" }, Object.entries(params).map(([k, v]) => `${label(k)} ${v}`).join(" · ")) : null),
    el("div", { class: "hh-bars" }, yardstickRows(r).map(({ key: k, hours: v, vsOracle }) => el("div", { class: "hh" },
      el("span", { class: "muted small" }, yardLabel[k] || label(k)),
      el("div", { class: "meter" }, el("span", { style: { width: `${(100 * v) / maxH}%` } })),
      el("span", { class: "small num" }, `${fmtNum(v, 1)} h`,
        r.savings_pct && Number.isFinite(r.savings_pct[k]) && Math.abs(r.savings_pct[k]) >= 0.05
          ? el("span", { class: "faint" }, ` (${r.savings_pct[k] > 0 ? "−" : "+"}${fmtNum(Math.abs(r.savings_pct[k]), 1)} %)`) : "",
        vsOracle !== null && !yardLabel[k] ? el("span", { class: "faint" }, ` · ${num(vsOracle, 2)}× oracle`) : "")))),
    r.yardsticks ? el("div", { class: "faint small" }, "Oracle: zero wait, perfect foresight, depth-first packing, "
      + "each host started one boot before needed and stopped when empty; lower bound: ceil(concurrent / seats) "
      + "looking one boot ahead.") : null,
    el("div", { class: "table-wrap" }, el("table", { class: "compact" },
      el("thead", {}, el("tr", {}, cols.map(([, h], i) => el("th", { scope: "col", class: i ? "num" : "" }, h)))),
      el("tbody", {}, r.results.map((row) => el("tr", {}, cols.map(([k], i) => i
        ? el("td", { class: "num" }, cell(k, row[k])) : el("th", { scope: "row", class: "small wrap" }, String(row[k])))))))),
    el("div", { class: "faint small" }, [
      r.source ? `${r.source} demand` : null, Number.isFinite(r.days) ? `${r.days} days` : null,
      Number.isFinite(r.arrivals) ? `${r.arrivals} arrivals` : null,
      Number.isFinite(r.max_hosts) ? `up to ${r.max_hosts} hosts × ${r.seats_per_host} seats` : null,
      r.ts_ms ? `computed ${fmtTime(r.ts_ms)}` : null].filter(Boolean).join(" · ")),
    r.recommended_plan ? el("details", {}, el("summary", { class: "small" }, "Tuned plan phases"), renderPlan(r.recommended_plan)) : null);
}

/** Any JSON: scalars as a definition list, arrays of objects as tables, the rest as JSON. */
export function renderGeneric(value) {
  if (value === null || typeof value !== "object") return el("div", {}, String(value));
  if (Array.isArray(value)) {
    if (value.length && value.every((v) => v && typeof v === "object" && !Array.isArray(v))) {
      const cols = [...new Set(value.flatMap((v) => Object.keys(v)))].slice(0, 8);
      return el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, cols.map((c) => el("th", { scope: "col" }, c.replaceAll("_", " "))))),
        el("tbody", {}, value.map((v) => el("tr", {}, cols.map((c) => el("td", { class: "small" }, scalarText(v[c]))))))));
    }
    return el("div", { class: "mono small" }, value.map(scalarText).join(", "));
  }
  const entries = Object.entries(value);
  return el("div", { class: "stack" },
    el("dl", { class: "kv" }, entries.filter(([, v]) => v === null || typeof v !== "object")
      .flatMap(([k, v]) => [el("dt", {}, k.replaceAll("_", " ")), el("dd", {}, scalarText(v))])),
    entries.filter(([, v]) => v !== null && typeof v === "object")
      .map(([k, v]) => el("div", {}, el("div", { class: "muted small" }, k.replaceAll("_", " ")), renderGeneric(v))));
}

function scalarText(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(2);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

