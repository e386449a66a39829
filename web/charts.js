// A small time-series line chart drawn as inline SVG (no library, nothing fetched).
//
// lineChart({title, x0, x1, yMax, yFmt, yLabel, integer, series: [{name, color, points: [[t_ms, v]],
//            area?, dashed?, step?}]}) -> HTMLElement
// Axes with "nice" ticks, horizontal grid, a legend with the latest and peak values, gaps where
// samples are missing (no line drawn across an outage), and a hover read-out.

import { el } from "./common.js";

const W = 520, H = 210;
const M = { left: 56, right: 12, top: 12, bottom: 26 };
const MIN = 60_000, HOUR = 3_600_000, DAY = 86_400_000;
const X_STEPS = [MIN, 5 * MIN, 10 * MIN, 15 * MIN, 30 * MIN, HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY,
  2 * DAY, 7 * DAY];
const MAX_POINTS = 600; // more points than this per series (30 days of 1-minute samples) are bucketed
let uid = 0;

/**
 * At most about `max` points: the samples in each of `max / 2` equal time buckets are reduced to
 * their minimum and maximum (in time order), so peaks and dips survive and a line still looks
 * like the raw data at this width.
 */
export function downsample(points, x0, x1, max) {
  if (points.length <= max) return points;
  const buckets = Math.max(1, Math.floor(max / 2));
  const width = (x1 - x0) / buckets;
  const out = [];
  let i = 0;
  for (let b = 0; b < buckets && i < points.length; b++) {
    const end = b === buckets - 1 ? Infinity : x0 + (b + 1) * width;
    let lo = null, hi = null;
    for (; i < points.length && points[i][0] < end; i++) {
      const p = points[i];
      if (!lo || p[1] < lo[1]) lo = p;
      if (!hi || p[1] > hi[1]) hi = p;
    }
    if (lo) out.push(...(lo === hi ? [lo] : lo[0] <= hi[0] ? [lo, hi] : [hi, lo]));
  }
  return out;
}

/** A step of 1, 2, 2.5 or 5 x 10^k giving about `count` intervals up to `max`. */
export function niceStep(max, count = 4, integer = false) {
  if (!(max > 0)) return 1;
  const raw = max / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = mag;
  for (const m of [1, 2, 2.5, 5, 10]) { step = m * mag; if (step >= raw) break; }
  if (integer) step = Math.max(1, Math.ceil(step));
  return step;
}

function timeTicks(x0, x1) {
  const span = x1 - x0;
  const step = X_STEPS.find((s) => span / s <= 6) || X_STEPS[X_STEPS.length - 1];
  const off = new Date().getTimezoneOffset() * MIN; // align ticks to local wall-clock multiples
  const ticks = [];
  for (let t = Math.ceil((x0 - off) / step) * step + off; t <= x1; t += step) ticks.push(t);
  return { ticks, step };
}

function timeLabel(t, step) {
  const d = new Date(t);
  if (step >= DAY) return d.toLocaleDateString(undefined, { weekday: "short", day: "numeric" });
  return d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", hour12: false });
}

/** Split sorted points into runs, breaking where the gap is well over the usual spacing. */
function segments(points) {
  if (points.length < 2) return points.length ? [points] : [];
  const gaps = [];
  for (let i = 1; i < points.length; i++) gaps.push(points[i][0] - points[i - 1][0]);
  const median = [...gaps].sort((a, b) => a - b)[Math.floor(gaps.length / 2)];
  const limit = Math.max(median * 3, 2 * MIN);
  const out = [[points[0]]];
  for (let i = 1; i < points.length; i++) {
    if (points[i][0] - points[i - 1][0] > limit) out.push([]);
    out[out.length - 1].push(points[i]);
  }
  return out;
}

export function lineChart({ title, x0, x1, yMax, yFmt = String, yLabel = "", integer = false, series }) {
  const wrap = el("div", { class: "chart" }, el("div", { class: "title" }, title));
  const clean = series.map((s) => ({ ...s, points: s.points.filter(([t, v]) => t >= x0 && t <= x1 && Number.isFinite(v))
    .sort((a, b) => a[0] - b[0]) }));
  if (!clean.some((s) => s.points.length)) {
    wrap.append(el("div", { class: "no-data" }, "No samples in this range yet"));
    return wrap;
  }
  const step = niceStep(yMax, 4, integer);
  const top = Math.max(step, Math.ceil(yMax / step) * step);
  const iw = W - M.left - M.right, ih = H - M.top - M.bottom;
  const sx = (t) => M.left + ((t - x0) / (x1 - x0)) * iw;
  const sy = (v) => M.top + ih - (Math.min(v, top) / top) * ih;
  const id = `c${++uid}`;

  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": summary(title, clean, yFmt) });
  const defs = el("svg:defs", {});
  svg.append(defs);
  // grid + y axis
  const grid = el("svg:g", { class: "grid" });
  const yAxis = el("svg:g", { class: "axis" });
  for (let v = 0; v <= top + 1e-9; v += step) {
    grid.append(el("svg:line", { x1: M.left, x2: W - M.right, y1: sy(v), y2: sy(v) }));
    yAxis.append(el("svg:text", { x: M.left - 6, y: sy(v) + 3.5, "text-anchor": "end" }, yFmt(v)));
  }
  const { ticks, step: xStep } = timeTicks(x0, x1);
  const xAxis = el("svg:g", { class: "axis" });
  for (const t of ticks) {
    grid.append(el("svg:line", { x1: sx(t), x2: sx(t), y1: M.top, y2: M.top + ih, "stroke-dasharray": "2 4" }));
    xAxis.append(el("svg:text", { x: sx(t), y: H - 8, "text-anchor": "middle" }, timeLabel(t, xStep)));
  }
  svg.append(grid, yAxis, xAxis,
    el("svg:line", { x1: M.left, x2: W - M.right, y1: M.top + ih, y2: M.top + ih, stroke: "#3a4459" }));
  if (yLabel) {
    svg.append(el("svg:text", { class: "axis-label", x: 10, y: M.top + ih / 2,
                                transform: `rotate(-90 10 ${M.top + ih / 2})`, "text-anchor": "middle" }, yLabel));
  }
  // series
  clean.forEach((s, i) => {
    const gid = `${id}-g${i}`;
    if (s.area) {
      defs.append(el("svg:linearGradient", { id: gid, x1: 0, x2: 0, y1: 0, y2: 1 },
        el("svg:stop", { offset: "0%", "stop-color": s.color, "stop-opacity": 0.35 }),
        el("svg:stop", { offset: "100%", "stop-color": s.color, "stop-opacity": 0.02 })));
    }
    for (const raw of segments(s.points)) {
      // gaps are found on the raw samples; each run is then thinned to its share of MAX_POINTS
      const share = Math.max(4, Math.round((MAX_POINTS * (raw[raw.length - 1][0] - raw[0][0])) / (x1 - x0)));
      const seg = downsample(raw, raw[0][0], raw[raw.length - 1][0] + 1, share);
      if (seg.length === 1) {
        svg.append(el("svg:circle", { cx: sx(seg[0][0]), cy: sy(seg[0][1]), r: 2.5, fill: s.color }));
        continue;
      }
      let d = `M${sx(seg[0][0]).toFixed(1)},${sy(seg[0][1]).toFixed(1)}`;
      for (let k = 1; k < seg.length; k++) {
        const [t, v] = seg[k];
        d += s.step ? `H${sx(t).toFixed(1)}V${sy(v).toFixed(1)}` : `L${sx(t).toFixed(1)},${sy(v).toFixed(1)}`;
      }
      if (s.area) {
        const base = sy(0).toFixed(1);
        svg.append(el("svg:path", { d: `${d}V${base}H${sx(seg[0][0]).toFixed(1)}Z`, fill: `url(#${gid})`, stroke: "none" }));
      }
      svg.append(el("svg:path", { d, fill: "none", stroke: s.color, "stroke-width": s.dashed ? 1.5 : 2,
                                  "stroke-dasharray": s.dashed ? "5 4" : null, "stroke-linejoin": "round",
                                  "stroke-linecap": "round" }));
    }
  });
  // hover read-out
  const cursor = el("svg:line", { y1: M.top, y2: M.top + ih, stroke: "#9ba5b9", "stroke-width": 1, visibility: "hidden" });
  const dots = clean.map((s) => el("svg:circle", { r: 3.5, fill: s.color, stroke: "#0d1017", "stroke-width": 1.5, visibility: "hidden" }));
  const hit = el("svg:rect", { x: M.left, y: M.top, width: iw, height: ih, fill: "transparent" });
  svg.append(cursor, ...dots, hit);
  const tip = el("div", { class: "tip", hidden: true });
  hit.addEventListener("mousemove", (e) => {
    const box = svg.getBoundingClientRect();
    const t = x0 + (((e.clientX - box.left) * (W / box.width) - M.left) / iw) * (x1 - x0);
    const lines = [];
    let at = null;
    clean.forEach((s, i) => {
      const p = nearest(s.points, t);
      if (!p || Math.abs(p[0] - t) > (x1 - x0) / 20) { dots[i].setAttribute("visibility", "hidden"); return; }
      at = at ?? p[0];
      dots[i].setAttribute("cx", sx(p[0]));
      dots[i].setAttribute("cy", sy(p[1]));
      dots[i].setAttribute("visibility", "visible");
      lines.push(el("div", {}, el("span", { style: { color: s.color } }, "● "), `${s.name}: `, el("b", {}, yFmt(p[1]))));
    });
    if (at === null) { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); return; }
    cursor.setAttribute("x1", sx(at));
    cursor.setAttribute("x2", sx(at));
    cursor.setAttribute("visibility", "visible");
    tip.replaceChildren(el("div", { class: "muted" }, new Date(at).toLocaleString(undefined, { hour12: false })), ...lines);
    tip.hidden = false;
    const px = (sx(at) / W) * box.width;
    tip.style.left = `${Math.min(px + 12, box.width - 170)}px`;
    tip.style.top = "18px";
  });
  hit.addEventListener("mouseleave", () => {
    tip.hidden = true;
    cursor.setAttribute("visibility", "hidden");
    for (const d of dots) d.setAttribute("visibility", "hidden");
  });
  wrap.append(svg, tip, el("div", { class: "legend" }, clean.map((s) => {
    const vals = s.points.map((p) => p[1]);
    const last = vals.length ? yFmt(vals[vals.length - 1]) : "–";
    const peak = vals.length ? yFmt(Math.max(...vals)) : "–";
    return el("span", { style: { color: s.color } },
      el("i", { class: s.dashed ? "dashed" : "", style: { background: s.color } }),
      el("span", { style: { color: "var(--muted)" } }, `${s.name} `),
      el("b", { style: { color: "var(--text)" } }, last), el("span", { class: "faint" }, ` · peak ${peak}`));
  })));
  return wrap;
}

function nearest(points, t) {
  if (!points.length) return null;
  let lo = 0, hi = points.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] < t) lo = mid; else hi = mid;
  }
  return Math.abs(points[lo][0] - t) <= Math.abs(points[hi][0] - t) ? points[lo] : points[hi];
}

function summary(title, series, yFmt) {
  const parts = series.filter((s) => s.points.length).map((s) => {
    const vals = s.points.map((p) => p[1]);
    return `${s.name} now ${yFmt(vals[vals.length - 1])}, peak ${yFmt(Math.max(...vals))}`;
  });
  return `${title}: ${parts.join("; ")}`;
}
