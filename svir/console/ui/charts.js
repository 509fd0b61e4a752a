// Small charts as inline SVG (no library): lines over time and bars by category. Each chart is an
// image with a text alternative that says what it shows and its latest values.

const NS = "http://www.w3.org/2000/svg";

function s(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  }
  for (const c of children) if (c) el.append(c);
  return el;
}

function text(x, y, content, attrs = {}) {
  const t = s("text", { x, y, ...attrs });
  t.textContent = content;
  return t;
}

export function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function short(v) {
  if (v >= 1e9) return `${+(v / 1e9).toFixed(1)}G`;
  if (v >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
  return `${+v.toFixed(v < 10 ? 2 : 0)}`;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false }).slice(0, 5);
}

function legend(series) {
  const box = document.createElement("ul");
  box.className = "legend";
  series.forEach((sr, i) => {
    const li = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `swatch c${sr.color ?? i}`;
    li.append(swatch, document.createTextNode(sr.name));
    box.append(li);
  });
  return box;
}

function figure(title, svg, series, summary) {
  const fig = document.createElement("figure");
  fig.className = "chart";
  const cap = document.createElement("figcaption");
  cap.textContent = title;
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${title}: ${summary}`);
  fig.append(cap, svg);
  if (series.length > 1) fig.append(legend(series));
  return fig;
}

const W = 480;
const H = 160;
const PAD = { l: 38, r: 8, t: 8, b: 20 };

// Lines over time: series [{name, points: [[t, v], ...], color}], t in epoch seconds.
export function lineChart(title, series, { span, unit = "" } = {}) {
  const all = series.flatMap((sr) => sr.points);
  const tMax = all.length ? Math.max(...all.map((p) => p[0])) : Date.now() / 1000;
  const tMin = span ? tMax - span : (all.length ? Math.min(...all.map((p) => p[0])) : tMax - 60);
  const vMax = niceMax(Math.max(0, ...all.map((p) => p[1])));
  const x = (t) => PAD.l + ((t - tMin) / Math.max(1, tMax - tMin)) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / vMax) * (H - PAD.t - PAD.b);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot" });
  for (const f of [0, 0.5, 1]) {
    const v = vMax * f;
    svg.append(s("line", { x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), class: "gridline" }));
    svg.append(text(PAD.l - 4, y(v) + 4, short(v), { class: "tick", "text-anchor": "end" }));
  }
  svg.append(text(PAD.l, H - 4, clock(tMin), { class: "tick" }));
  svg.append(text(W - PAD.r, H - 4, clock(tMax), { class: "tick", "text-anchor": "end" }));
  if (!all.length) svg.append(text(W / 2, H / 2, "no data yet", { class: "nodata" }));
  series.forEach((sr, i) => {
    if (!sr.points.length) return;
    const d = sr.points.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`)
      .join("");
    svg.append(s("path", { d, class: `line c${sr.color ?? i}` }));
  });
  const summary = series.map((sr) => {
    const last = sr.points[sr.points.length - 1];
    return `${sr.name} ${last ? short(last[1]) : "none"}${unit}`;
  }).join(", ");
  return figure(title, svg, series, `latest ${summary}`);
}

// Bars by category: labels [str], series [{name, values: [number], color}] stacked per label.
export function barChart(title, labels, series, { unit = "", format = short } = {}) {
  const totals = labels.map((_, i) => series.reduce((a, sr) => a + (sr.values[i] || 0), 0));
  const vMax = niceMax(Math.max(0, ...totals));
  const n = Math.max(1, labels.length);
  const band = (W - PAD.l - PAD.r) / n;
  const bw = Math.max(2, Math.min(48, band * 0.7));
  const y = (v) => H - PAD.b - (v / vMax) * (H - PAD.t - PAD.b);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot" });
  for (const f of [0, 0.5, 1]) {
    const v = vMax * f;
    svg.append(s("line", { x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), class: "gridline" }));
    svg.append(text(PAD.l - 4, y(v) + 4, format(v), { class: "tick", "text-anchor": "end" }));
  }
  if (!labels.length) svg.append(text(W / 2, H / 2, "no requests", { class: "nodata" }));
  labels.forEach((label, i) => {
    const cx = PAD.l + band * i + band / 2;
    let base = 0;
    series.forEach((sr, k) => {
      const v = sr.values[i] || 0;
      if (v <= 0) return;
      const rect = s("rect", {
        x: cx - bw / 2, y: y(base + v), width: bw, height: y(base) - y(base + v),
        class: `bar c${sr.color ?? k}`,
      });
      const tip = s("title");
      tip.textContent = `${label}: ${sr.name} ${format(v)}${unit}`;
      rect.append(tip);
      svg.append(rect);
      base += v;
    });
    if (n <= 12 || i % Math.ceil(n / 12) === 0) {
      svg.append(text(cx, H - 4, label.length > 12 ? `${label.slice(0, 11)}…` : label,
        { class: "tick", "text-anchor": "middle" }));
    }
  });
  const summary = labels.map((l, i) => `${l} ${format(totals[i])}${unit}`).join(", ");
  return figure(title, svg, series, summary || "no data");
}

// A bar against its limit (a budget): a native meter with its figures in words.
export function budgetBar(label, used, limit, format = short) {
  const wrap = document.createElement("div");
  wrap.className = "budget";
  const id = `m-${Math.random().toString(36).slice(2)}`;
  const lab = document.createElement("label");
  lab.htmlFor = id;
  lab.textContent = label;
  const meter = document.createElement("meter");
  meter.id = id;
  meter.min = 0;
  meter.max = limit;
  meter.value = Math.min(used, limit);
  meter.low = limit * 0.7;
  meter.high = limit * 0.9;
  meter.optimum = 0;
  const figures = document.createElement("span");
  figures.className = "figures";
  const pct = limit > 0 ? Math.round((used / limit) * 100) : 0;
  figures.textContent = `${format(used)} of ${format(limit)} (${pct}%)`;
  wrap.append(lab, meter, figures);
  return wrap;
}
