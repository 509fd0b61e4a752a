// Config: the config svir runs with, secrets redacted (GET /admin/config), where each provider's
// key comes from and whether it is set, the state of the last reload, and a reload of the file
// (POST /admin/reload).

import { api } from "./api.js";
import { append, clear, h, pretty, scopeNote, section, table } from "./dom.js";

export async function render(main, ctx) {
  const config = await api("/admin/config", { signal: ctx.signal });
  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Config")),
    scopeNote("The config of the worker that answered; every worker reads the same file. Keys " +
      "never live in the file: each comes from the environment variable named below."),
    section("Source", h("p", null, config.source
      ? h("code", null, config.source) : "No config file: svir serves its defaults.")),
    section("Secrets", (config.secrets || []).length ? table([
      ["Where", (s) => h("code", null, s.where)],
      ["Environment variable", (s) => h("code", null, s.env)],
      ["Set", (s) => h("span", { class: `state ${s.set ? "ready" : "stopped"}` },
        s.set ? "set" : "not set")],
    ], config.secrets) : h("p", { class: "empty" }, "The config names no secret.")),
    section("Reload", config.reload ? h("pre", { tabindex: "0" }, pretty(config.reload)) : null,
      reloadButton(ctx, config.source)),
    section("Running config (secrets redacted)",
      h("pre", { class: "config", tabindex: "0", "aria-label": "The running config" },
        pretty(config.config))),
  );
}

function reloadButton(ctx, source) {
  const result = h("div", { role: "status" });
  const button = h("button", { type: "button", disabled: !source }, "Reload the config file");
  button.addEventListener("click", async () => {
    button.disabled = true;
    clear(result);
    try {
      const done = await api("/admin/reload", { method: "POST" });
      const later = done.restart_needed || [];
      append(result, [done.ok
        ? h("p", null, `Reloaded: ${(done.changed || []).join(", ") || "nothing changed"}.`)
        : h("p", { class: "error-box" }, `Not reloaded: ${done.error}`),
      later.length ? h("p", { class: "warn" },
        `These apply only after a restart: ${later.join(", ")}.`) : null]);
    } catch (err) {
      if (!ctx.refused(err)) result.append(ctx.errorBox(err));
    } finally {
      button.disabled = false;
    }
  });
  return h("div", null, h("div", { class: "actions" }, button), result);
}
