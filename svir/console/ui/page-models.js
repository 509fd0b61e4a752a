// Models: every provider and model svir serves (GET /admin/models), the managed llama-server
// models with their process, log tail and load / unload, and `svir probe` run on a provider.

import { api } from "./api.js";
import { ago, bytes, clear, h, num, scopeNote, section, table } from "./dom.js";

export async function render(main, ctx) {
  const head = h("div", { class: "page-head" }, h("h1", null, "Models"));
  const providersBox = h("div");
  const managedBox = h("div", { class: "managed" });
  const modelsBox = h("div");
  const probeBox = h("div", { class: "probe", "aria-live": "polite" });
  const filter = h("input", { type: "search", id: "model-filter", placeholder: "gemma" });
  main.append(
    head,
    scopeNote("Breakers, requests in flight and managed models are those of the worker that " +
      "answered; the providers and models come from the config and the servers' model lists."),
    section("Providers", providersBox, probeBox),
    section("Managed models (llama-server run by svir)", managedBox),
    section("Models", h("div", { class: "field inline" },
      h("label", { for: "model-filter" }, "Filter"), filter), modelsBox),
  );
  const logs = new Map(); // model id -> the <pre> of its open log tail
  let data = null;
  let seen = "";

  const drawProviders = () => {
    clear(providersBox);
    providersBox.append(table([
      ["Provider", (p) => p.name],
      ["Kind", (p) => p.kind],
      ["Base URL", (p) => p.base_url || "–"],
      ["Key from", (p) => p.api_key_env
        ? h("span", null, h("code", null, p.api_key_env), p.key_set ? " (set)" : " (not set)")
        : "none"],
      ["Models", (p) => num(p.models), "n"],
      ["", (p) => h("button", {
        type: "button", class: "small", "aria-label": `Probe ${p.name}`,
        onclick: (event) => probe(p.name, event.currentTarget),
      }, "Probe")],
    ], data.providers || [], { caption: "Providers in the config" }));
  };

  const drawModels = () => {
    clear(modelsBox);
    const needle = filter.value.trim().toLowerCase();
    const rows = (data.data || []).filter((m) => !needle || m.id.toLowerCase().includes(needle));
    modelsBox.append(table([
      ["Model", (m) => h("code", null, m.id)],
      ["Kind", (m) => m.kind],
      ["Source", (m) => m.source],
      ["Context", (m) => (m.context_length ? num(m.context_length) : "–"), "n"],
      ["Capabilities", (m) => (m.capabilities || []).join(", ") || "–"],
      ["Breaker", (m) => (m.breaker ? h("span", { class: `breaker ${m.breaker.state}` },
        m.breaker.state.replace("_", " ")) : "–")],
      ["In flight", (m) => num(m.in_flight), "n"],
    ], rows, { caption: `${rows.length} models` }));
  };

  const drawManaged = () => {
    clear(managedBox);
    const managed = (data.data || []).filter((m) => m.managed);
    if (!managed.length) {
      managedBox.append(h("p", { class: "empty" },
        "No managed models: a provider of kind llamacpp-managed runs llama-server for its " +
        "models (docs/providers.md)."));
      return;
    }
    for (const m of managed) {
      const s = m.managed;
      const busy = s.state === "loading" || s.state === "draining";
      const card = h("article", {
        class: "model-card", "aria-label": `Managed model ${m.id}`, dataset: { model: m.id },
      },
      h("header", null, h("h3", null, h("code", null, m.id)),
        h("span", { class: `state ${s.state}`, "data-state": s.state }, s.state)),
      h("dl", { class: "facts" },
        h("dt", null, "pid"), h("dd", null, s.pid ?? "–"),
        h("dt", null, "port"), h("dd", null, s.port ?? "–"),
        h("dt", null, "memory"), h("dd", null, bytes(s.rss_bytes)),
        h("dt", null, "last use"), h("dd", null, s.last_used ? ago(s.last_used) : "never"),
        h("dt", null, "in flight"), h("dd", null, num(s.in_flight)),
        h("dt", null, "log"), h("dd", null, s.log_file ? h("code", null, s.log_file) : "–")),
      h("div", { class: "actions" },
        h("button", {
          type: "button", disabled: busy || s.state === "ready",
          "aria-label": `Load ${m.id}`,
          onclick: (event) => act("load", m.id, event.currentTarget),
        }, "Load"),
        h("button", {
          type: "button", disabled: busy || s.state === "stopped",
          "aria-label": `Unload ${m.id}`,
          onclick: (event) => act("unload", m.id, event.currentTarget),
        }, "Unload"),
        h("button", {
          type: "button", class: "quiet", "aria-expanded": logs.has(m.id) ? "true" : "false",
          "aria-label": `Log tail of ${m.id}`,
          onclick: () => toggleLog(m.id),
        }, logs.has(m.id) ? "Hide log" : "Log tail")));
      if (logs.has(m.id)) card.append(logs.get(m.id));
      managedBox.append(card);
    }
  };

  const draw = () => {
    drawProviders();
    drawManaged();
    drawModels();
  };

  // Redrawn only when something changed, so that the keyboard's focus stays where it is.
  const refresh = async (force = false) => {
    const fresh = await api("/admin/models", { signal: ctx.signal });
    const text = JSON.stringify(fresh);
    if (force || text !== seen) {
      seen = text;
      data = fresh;
      draw();
    }
    for (const id of logs.keys()) loadLog(id);
  };

  const act = async (what, model, button) => {
    button.disabled = true;
    button.textContent = what === "load" ? "Loading…" : "Unloading…";
    try {
      const entry = await api(`/admin/models/${what}`, { method: "POST", body: { model } });
      ctx.toast(`${model}: ${entry.managed ? entry.managed.state : "done"}`);
    } catch (err) {
      if (!ctx.refused(err)) ctx.toast(`${what} ${model} failed: ${err.message}`, "error");
    }
    await refresh(true).catch(() => {});
  };

  const loadLog = async (id) => {
    const pre = logs.get(id);
    if (!pre) return;
    try {
      const tail = await api(`/admin/models/log?model=${encodeURIComponent(id)}&lines=200`,
        { signal: ctx.signal });
      pre.textContent = (tail.lines || []).join("\n") || "(the log is empty)";
      pre.scrollTop = pre.scrollHeight;
    } catch (err) {
      if (err.name !== "AbortError") pre.textContent = `No log: ${err.message}`;
    }
  };

  const toggleLog = (id) => {
    if (logs.has(id)) logs.delete(id);
    else {
      logs.set(id, h("pre", { class: "log", tabindex: "0", "aria-label": `Log of ${id}` },
        "loading…"));
      loadLog(id);
    }
    drawManaged();
  };

  const probe = async (provider, button) => {
    button.disabled = true;
    clear(probeBox);
    probeBox.append(h("p", { class: "loading" }, `Probing ${provider}…`));
    try {
      const result = await api("/admin/probe", { method: "POST", body: { provider } });
      clear(probeBox);
      probeBox.append(h("h3", null, `svir probe ${result.provider}`),
        h("pre", { class: "probe-table", tabindex: "0" }, result.text || ""));
    } catch (err) {
      clear(probeBox);
      if (!ctx.refused(err)) probeBox.append(ctx.errorBox(err));
    } finally {
      button.disabled = false;
    }
  };

  filter.addEventListener("input", drawModels);
  await refresh();
  // Managed states change by themselves (idle unload, a crash): look again now and then.
  const timer = setInterval(() => refresh().catch((err) => {
    if (err.name !== "AbortError") ctx.refused(err);
  }), 4000);
  ctx.signal.addEventListener("abort", () => clearInterval(timer));
}
