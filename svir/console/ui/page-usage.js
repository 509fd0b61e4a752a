// Usage: tokens and cost per key, model and day from the ledger (GET /admin/usage), and each key's
// limits and budgets as bars against their limit (GET /admin/keys?usage=1).

import { api } from "./api.js";
import { barChart, budgetBar } from "./charts.js";
import { clear, field, h, num, scopeNote, section, select, table, usd } from "./dom.js";

const SPANS = [["24h", "last 24 hours"], ["7d", "last 7 days"], ["30d", "last 30 days"]];
const BUDGETS = [
  ["tokens_per_day", "tokens today"], ["tokens_per_month", "tokens this month"],
  ["cost_per_day", "cost today"], ["cost_per_month", "cost this month"],
  ["rpm", "requests in the last minute"], ["tpm", "tokens in the last minute"],
  ["concurrent", "requests running"],
];

function money(v) {
  return v >= 1 ? `$${v.toFixed(2)}` : `$${+v.toPrecision(2)}`;
}

export async function render(main, ctx) {
  const since = select(SPANS, "7d", { name: "since" });
  const body = h("div");
  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Usage"),
      h("div", { class: "field inline" }, ...field("Period", since).childNodes)),
    scopeNote("From the ledger in the shared store: every worker's requests. Budgets are " +
      "counted where the limits live ([limits] backend: per worker with memory, shared with " +
      "redis)."),
    body,
  );
  const draw = async () => {
    const span = since.value;
    const [byDay, byKey, byModel, keys] = await Promise.all([
      api(`/admin/usage?by=day&since=${span}`, { signal: ctx.signal }),
      api(`/admin/usage?by=key&since=${span}`, { signal: ctx.signal }),
      api(`/admin/usage?by=model&since=${span}`, { signal: ctx.signal }),
      api("/admin/keys?usage=1", { signal: ctx.signal }),
    ]);
    clear(body);
    const names = new Map((keys.data || []).map((k) => [k.id, k.name]));
    const keyLabel = (id) => (id ? names.get(id) || id : "no key");
    const tokens = (rows, label) => barChart(`Tokens by ${label}`, rows.map((r) => r.label), [
      { name: "in (prompt)", values: rows.map((r) => r.prompt_tokens), color: 0 },
      { name: "out (completion)", values: rows.map((r) => r.completion_tokens), color: 1 },
    ]);
    const cost = (rows, label) => barChart(`Cost by ${label} (USD)`, rows.map((r) => r.label),
      [{ name: "cost", values: rows.map((r) => r.cost_usd), color: 2 }], { format: money });
    const days = (byDay.data || []).map((r) => ({ ...r, label: r.day.slice(5) }));
    const perKey = (byKey.data || []).map((r) => ({ ...r, label: keyLabel(r.key) }));
    const perModel = (byModel.data || []).map((r) => ({ ...r, label: r.model }));
    body.append(
      section("By day", h("div", { class: "charts" }, tokens(days, "day"), cost(days, "day"))),
      section("By key", h("div", { class: "charts" }, tokens(perKey, "key"), cost(perKey, "key")),
        summary(perKey, "Key")),
      section("By model", h("div", { class: "charts" }, tokens(perModel, "model"),
        cost(perModel, "model")), summary(perModel, "Model")),
    );
    const budgets = section("Budgets");
    const active = (keys.data || []).filter((k) => Object.keys(k.usage || {}).length);
    if (!active.length) {
      budgets.append(h("p", { class: "empty" }, "No key has limits or budgets (Keys page)."));
    }
    for (const key of active) {
      const box = h("div", { class: "key-budgets" }, h("h3", null, key.name, " ",
        h("code", { class: "muted" }, key.id)));
      for (const [name, label] of BUDGETS) {
        const entry = key.usage?.[name];
        if (!entry) continue;
        const isCost = name.startsWith("cost_");
        const used = isCost ? entry.used_usd : entry.used;
        const limit = isCost ? entry.limit_usd : entry.limit;
        box.append(budgetBar(label, used, limit, isCost ? money : (v) => num(v)));
      }
      budgets.append(box);
    }
    body.append(budgets);
  };
  since.addEventListener("change", () => draw().catch((err) => {
    if (err.name !== "AbortError" && !ctx.refused(err)) body.append(ctx.errorBox(err));
  }));
  await draw();
}

function summary(rows, label) {
  if (!rows.length) return h("p", { class: "empty" }, "No requests in this period.");
  return table([
    [label, (r) => r.label],
    ["Requests", (r) => num(r.requests), "n"],
    ["Errors", (r) => num(r.errors), "n"],
    ["Tokens in", (r) => num(r.prompt_tokens), "n"],
    ["Tokens out", (r) => num(r.completion_tokens), "n"],
    ["Cost", (r) => usd(r.cost_usd), "n"],
    ["Tokens/s", (r) => num(r.tokens_per_second, 1), "n"],
  ], rows);
}
