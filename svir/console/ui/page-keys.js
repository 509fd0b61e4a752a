// Keys: the virtual keys (GET /admin/keys?all=1), one created with its limits and budgets (POST
// /admin/keys: its secret shown once), and revoked (POST /admin/keys/{id}/revoke).

import { api } from "./api.js";
import { clear, dateTime, field, h, scopeNote, section, table } from "./dom.js";

const LIMITS = [
  ["rpm", "Requests per minute", "int"],
  ["tpm", "Tokens per minute", "int"],
  ["concurrent", "Requests at once", "int"],
  ["tokens_per_day", "Tokens per day", "int"],
  ["tokens_per_month", "Tokens per month", "int"],
  ["cost_per_day", "Cost per day (USD)", "usd"],
  ["cost_per_month", "Cost per month (USD)", "usd"],
];

function limitsText(limits) {
  const parts = [];
  for (const [name, value] of Object.entries(limits || {})) {
    if (value === null || value === undefined) continue;
    parts.push(`${name.replace(/_usd$/, "")} ${name.endsWith("_usd") ? `$${value}` : value}`);
  }
  return parts.join(", ") || "none";
}

export async function render(main, ctx) {
  const listBox = h("div", { id: "key-list" });
  const created = h("div", { "aria-live": "polite" });
  const inputs = {
    name: h("input", { name: "name", required: true, autocomplete: "off" }),
    models: h("input", { name: "models", placeholder: "local/, openai/gpt-4o-mini" }),
    expires: h("input", { name: "expires", placeholder: "90d or 2027-06-30" }),
  };
  for (const [name, , kind] of LIMITS) {
    inputs[name] = h("input", {
      name, type: "number", min: kind === "usd" ? "0.000001" : "1",
      step: kind === "usd" ? "any" : "1", inputmode: kind === "usd" ? "decimal" : "numeric",
    });
  }
  const form = h("form", { class: "key-form", "aria-label": "Create a key" },
    h("div", { class: "form-grid" },
      field("Name", inputs.name),
      field("Models", inputs.models, "Comma-separated models or prefixes; empty: every model"),
      field("Expires", inputs.expires, "A duration or a date; empty: never"),
      LIMITS.map(([name, label]) => field(label, inputs[name]))),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Create key")));

  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Keys")),
    scopeNote("Keys live in the shared store: every worker sees a new or revoked key within " +
      "[auth] cache_seconds."),
    section("Create a key", form, created),
    section("Keys", listBox),
  );

  const load = async () => {
    const keys = await api("/admin/keys?all=1", { signal: ctx.signal });
    clear(listBox);
    const data = keys.data || [];
    if (!data.length) {
      listBox.append(h("p", { class: "empty" },
        "No keys: svir runs open, for this machine only. The first key turns auth on."));
      return;
    }
    listBox.append(table([
      ["Name", (k) => k.name],
      ["Id", (k) => h("code", null, k.id)],
      ["Hint", (k) => h("code", null, k.hint)],
      ["State", (k) => h("span", { class: `state ${k.state}` }, k.state)],
      ["Models", (k) => (k.models ? k.models.join(", ") : "all")],
      ["Limits and budgets", (k) => limitsText(k.limits)],
      ["Created", (k) => dateTime(k.created_at)],
      ["Expires", (k) => (k.expires_at ? dateTime(k.expires_at) : "never")],
      ["", (k) => (k.state === "revoked" ? "" : revokeButton(k))],
    ], data, { rowAttrs: (k) => ({ dataset: { key: k.id } }) }));
  };

  const revokeButton = (key) => {
    const cell = h("span", { class: "revoke" });
    const ask = h("button", { type: "button", class: "small danger",
      "aria-label": `Revoke ${key.name}` }, "Revoke");
    ask.addEventListener("click", () => {
      clear(cell);
      const yes = h("button", { type: "button", class: "small danger",
        "aria-label": `Confirm revoking ${key.name}` }, "Revoke now");
      const no = h("button", { type: "button", class: "small quiet" }, "Cancel");
      yes.addEventListener("click", async () => {
        yes.disabled = true;
        try {
          await api(`/admin/keys/${encodeURIComponent(key.id)}/revoke`, { method: "POST" });
          ctx.toast(`Revoked ${key.name}`);
        } catch (err) {
          if (!ctx.refused(err)) ctx.toast(`Revoke failed: ${err.message}`, "error");
        }
        await load();
      });
      no.addEventListener("click", () => { clear(cell).append(ask); ask.focus(); });
      cell.append(h("span", null, "Sure? "), yes, " ", no);
      yes.focus();
    });
    cell.append(ask);
    return cell;
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { name: inputs.name.value.trim() };
    const models = inputs.models.value.split(",").map((m) => m.trim()).filter(Boolean);
    if (models.length) body.models = models;
    if (inputs.expires.value.trim()) body.expires = inputs.expires.value.trim();
    for (const [name, , kind] of LIMITS) {
      const raw = inputs[name].value.trim();
      if (raw) body[name] = kind === "usd" ? Number(raw) : Number.parseInt(raw, 10);
    }
    clear(created);
    try {
      const key = await api("/admin/keys", { method: "POST", body });
      const secret = h("input", { readonly: true, value: key.key, id: "new-key-secret",
        class: "secret", spellcheck: "false" });
      const copy = h("button", { type: "button", class: "small" }, "Copy");
      copy.addEventListener("click", async () => {
        secret.select();
        try {
          await navigator.clipboard.writeText(key.key);
          copy.textContent = "Copied";
        } catch {
          copy.textContent = "Select and copy it";
        }
      });
      created.append(h("div", { class: "created-key", role: "alert" },
        h("p", null, h("strong", null, `Key ${key.name} created.`),
          " Its secret is shown this once: svir keeps only its hash."),
        field("Secret", secret), copy));
      form.reset();
      await load();
      secret.focus();
      secret.select();
    } catch (err) {
      if (!ctx.refused(err)) created.append(ctx.errorBox(err));
    }
  });

  await load();
}
