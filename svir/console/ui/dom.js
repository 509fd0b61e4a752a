// Building the page: elements from plain data (no HTML strings, so nothing a server sends is ever
// parsed as markup), and the formats every page shares.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  if (!attrs) return;
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.className = value;
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "value" || name === "checked" || name === "selected") {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

let ids = 0;
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// A labelled form control: the label names the control (for screen readers and tests).
export function field(label, control, hint) {
  if (!control.id) control.id = uid("f");
  const out = h("div", { class: "field" }, h("label", { for: control.id }, label), control);
  if (hint) {
    const hintEl = h("small", { id: uid("hint") }, hint);
    control.setAttribute("aria-describedby", hintEl.id);
    out.append(hintEl);
  }
  return out;
}

export function select(options, value, attrs) {
  const el = h("select", attrs);
  for (const opt of options) {
    const [v, text] = Array.isArray(opt) ? opt : [opt, opt];
    el.append(h("option", { value: v, selected: v === value }, text));
  }
  return el;
}

// A table from rows: columns are [header, row => cell content] pairs.
export function table(columns, rows, opts = {}) {
  const head = h("tr", null, columns.map(([title]) => h("th", { scope: "col" }, title)));
  const body = h("tbody");
  for (const row of rows) body.append(tableRow(columns, row, opts));
  const t = h("table", { class: opts.class || "grid" },
    opts.caption ? h("caption", null, opts.caption) : null, h("thead", null, head), body);
  return h("div", { class: "table-wrap" }, t);
}

export function tableRow(columns, row, opts = {}) {
  const tr = h("tr", opts.rowAttrs ? opts.rowAttrs(row) : null);
  for (const [, cell, cls] of columns) {
    const content = cell(row);
    tr.append(h("td", cls ? { class: cls } : null, content ?? "–"));
  }
  return tr;
}

export function emptyNote(text) {
  return h("p", { class: "empty" }, text);
}

export function scopeNote(text) {
  return h("p", { class: "scope-note" }, h("span", { class: "badge" }, "scope"), " ", text);
}

export function section(title, ...children) {
  const id = uid("s");
  return h("section", { class: "card", "aria-labelledby": id },
    h("h2", { id }, title), ...children);
}

// Formats

export function num(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toLocaleString("en-US", {
    maximumFractionDigits: digits, minimumFractionDigits: 0,
  });
}

export function ms(v) {
  if (v === null || v === undefined) return "–";
  return v >= 10000 ? `${num(v / 1000, 1)} s` : `${num(v, v < 10 ? 1 : 0)} ms`;
}

export function usd(v) {
  if (v === null || v === undefined) return "–";
  if (v === 0) return "$0";
  return v < 0.01 ? `$${v.toPrecision(2)}` : `$${num(v, 2)}`;
}

export function bytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let n = v;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${num(n, i ? 1 : 0)} ${units[i]}`;
}

export function time(epoch) {
  if (!epoch) return "–";
  const d = new Date(epoch * 1000);
  return d.toLocaleTimeString("en-GB", { hour12: false });
}

export function dateTime(epoch) {
  if (!epoch) return "–";
  const d = new Date(epoch * 1000);
  return `${d.toISOString().slice(0, 10)} ${d.toLocaleTimeString("en-GB", { hour12: false })}`;
}

export function ago(epoch) {
  if (!epoch) return "–";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${num(s / 3600, 1)} h ago`;
  return `${num(s / 86400, 1)} d ago`;
}

export function statusBadge(status) {
  const s = status ?? "running";
  const kind = s === "ok" ? "ok" : s === "running" ? "run" : "bad";
  return h("span", { class: `status ${kind}` }, s);
}

export function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value, null, 2);
}
