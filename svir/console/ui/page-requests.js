// Requests: the live feed of this worker (GET /admin/events: a request appears when it starts, its
// tokens count up while it streams, its outcome when it ends) and the ledger's history from the
// shared store (GET /admin/requests), with filters.

import { api, subscribe } from "./api.js";
import {
  clear, dateTime, field, h, ms, num, scopeNote, section, select, statusBadge, table, time,
} from "./dom.js";

const LIVE_ROWS = 100;

function link(id) {
  return h("a", { href: `#/requests/${encodeURIComponent(id)}` }, id);
}

export async function render(main, ctx) {
  const liveState = h("span", { class: "live-state", role: "status" }, "connecting…");
  const liveBody = h("tbody", { id: "live-rows" });
  const liveTable = h("div", { class: "table-wrap" }, h("table", { class: "grid live" },
    h("caption", null, "Requests as they run (this worker)"),
    h("thead", null, h("tr", null, ["Started", "Request", "Front end", "Model", "Key", "Status",
      "Tokens out", "Latency", "Tokens/s"].map((t) => h("th", { scope: "col" }, t)))),
    liveBody));
  const liveEmpty = h("p", { class: "empty" }, "Waiting for requests…");

  const inputs = {
    key: h("input", { name: "key", placeholder: "key_…" }),
    model: h("input", { name: "model", placeholder: "local/gemma-3-270m" }),
    provider: h("input", { name: "provider", placeholder: "local" }),
    api: select(["", "openai", "completions", "anthropic", "responses", "ollama", "threads",
      "embeddings"].map((v) => [v, v || "any"]), "", { name: "api" }),
    status: h("input", { name: "status", placeholder: "ok, cancelled, …" }),
    since: h("input", { name: "since", type: "datetime-local" }),
    until: h("input", { name: "until", type: "datetime-local" }),
  };
  const historyBox = h("div");
  const more = h("button", { type: "button", class: "quiet", hidden: true }, "Older");
  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter the history" },
    field("Key", inputs.key), field("Model", inputs.model), field("Provider", inputs.provider),
    field("Front end", inputs.api), field("Status", inputs.status),
    field("Since", inputs.since), field("Until", inputs.until),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Filter"),
      h("button", { type: "reset", class: "quiet" }, "Clear")));

  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Requests"), liveState),
    scopeNote("The live feed is the worker that answered this page's connection (with several " +
      "workers, each streams its own requests); the history is the ledger in the shared store, " +
      "every worker's, written a moment after each request ends."),
    section("Live", liveEmpty, liveTable),
    section("History", form, historyBox, more),
  );

  // Live feed
  const rows = new Map();
  const cells = (tr) => [...tr.children];
  const setRow = (id, fill) => {
    let tr = rows.get(id);
    if (!tr) {
      tr = h("tr", { dataset: { id } }, Array.from({ length: 9 }, () => h("td")));
      rows.set(id, tr);
      liveBody.prepend(tr);
      liveEmpty.hidden = true;
      while (liveBody.children.length > LIVE_ROWS) {
        const last = liveBody.lastElementChild;
        rows.delete(last.dataset.id);
        last.remove();
      }
    }
    fill(cells(tr), tr);
  };
  subscribe("/admin/events", (event, d) => {
    if (!d || typeof d !== "object" || !d.id) return;
    if (event === "request.started") {
      setRow(d.id, (c, tr) => {
        tr.className = "running";
        c[0].textContent = time(d.ts);
        clear(c[1]).append(link(d.id));
        c[2].textContent = d.api ?? "–";
        c[3].textContent = d.model ?? "–";
        c[4].textContent = d.key_id ?? "–";
        clear(c[5]).append(statusBadge(d.stream ? "streaming" : "running"));
        c[6].textContent = "0";
      });
    } else if (event === "request.progress") {
      setRow(d.id, (c) => {
        c[6].textContent = num(d.completion_tokens);
      });
    } else if (event === "request.finished") {
      setRow(d.id, (c, tr) => {
        tr.className = d.status === "ok" ? "done" : "failed";
        if (!c[1].firstChild) clear(c[1]).append(link(d.id));
        if (d.served_model || d.model) c[3].textContent = d.served_model || d.model;
        clear(c[5]).append(statusBadge(d.status));
        if (d.error) c[5].title = typeof d.error === "string" ? d.error : JSON.stringify(d.error);
        c[6].textContent = num(d.completion_tokens);
        c[7].textContent = ms(d.latency_ms);
        c[8].textContent = num(d.tokens_per_second, 1);
      });
    }
  }, {
    signal: ctx.signal,
    onState: (state, why) => {
      liveState.textContent = state === "live" ? "live" : state === "retrying"
        ? `reconnecting (${why})` : "stopped";
      liveState.className = `live-state ${state}`;
    },
  });

  // History
  let cursor = null;
  const query = () => {
    const q = new URLSearchParams({ limit: "50" });
    for (const name of ["key", "model", "provider", "api", "status"]) {
      const v = inputs[name].value.trim();
      if (v) q.set(name, v);
    }
    for (const name of ["since", "until"]) {
      const v = inputs[name].value;
      if (v) q.set(name, String(Math.floor(new Date(v).getTime() / 1000)));
    }
    return q;
  };
  const load = async (older) => {
    const q = query();
    if (older && cursor !== null) q.set("before", String(cursor));
    const page = await api(`/admin/requests?${q}`, { signal: ctx.signal });
    if (!older) clear(historyBox);
    const data = page.data || [];
    if (!older && !data.length) historyBox.append(h("p", { class: "empty" }, "No requests."));
    if (data.length) {
      historyBox.append(table([
        ["Time", (r) => dateTime(r.ts)],
        ["Request", (r) => link(r.request_id)],
        ["Front end", (r) => r.api],
        ["Model", (r) => r.served_model && r.served_model !== r.model
          ? `${r.model} → ${r.served_model}` : r.model],
        ["Provider", (r) => r.provider],
        ["Key", (r) => r.key_id],
        ["Status", (r) => statusBadge(r.status)],
        ["Tokens in", (r) => num(r.prompt_tokens), "n"],
        ["Tokens out", (r) => num(r.completion_tokens), "n"],
        ["Latency", (r) => ms(r.latency_ms), "n"],
        ["First token", (r) => ms(r.ttft_ms), "n"],
      ], data, { caption: older ? "Older" : "The ledger, newest first" }));
    }
    cursor = page.next ?? null;
    more.hidden = cursor === null;
  };
  const run = (older) => load(older).catch((err) => {
    if (err.name === "AbortError" || ctx.refused(err)) return;
    clear(historyBox);
    historyBox.append(ctx.errorBox(err));
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run(false);
  });
  form.addEventListener("reset", () => setTimeout(() => run(false)));
  more.addEventListener("click", () => run(true));
  await run(false);
}
