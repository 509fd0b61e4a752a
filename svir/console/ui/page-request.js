// One request (GET /admin/requests/{id}): its timings, usage, cost, every attempt and why it was
// retried or fell back, its error; with capture on, the four texts side by side (what the client
// sent, what svir sent upstream, the upstream's raw stream, the stream svir sent the client) and
// the download of a conformance case made from them.

import { api, download } from "./api.js";
import { dateTime, h, ms, num, pretty, scopeNote, section, statusBadge, table, usd } from "./dom.js";

function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.flatMap(([k, v]) => [
    h("dt", null, k), h("dd", null, v ?? "–"),
  ]));
}

function headersText(headers) {
  if (!headers) return "";
  const list = Array.isArray(headers) ? headers : Object.entries(headers);
  return list.map(([k, v]) => `${k}: ${v}`).join("\n");
}

function bodyText(body) {
  if (body === null || body === undefined) return "";
  return typeof body === "string" ? pretty(body) : pretty(body);
}

function pane(title, id, ...parts) {
  const text = parts.filter((p) => p).join("\n\n");
  return h("section", { class: "pane", "aria-labelledby": `${id}-h` },
    h("h3", { id: `${id}-h` }, title),
    h("pre", { id, tabindex: "0", "aria-labelledby": `${id}-h` }, text || "(nothing)"));
}

export async function render(main, ctx) {
  const id = ctx.params[0];
  const detail = await api(`/admin/requests/${encodeURIComponent(id)}`, { signal: ctx.signal });
  const rows = detail.rows || [];
  const row = rows[rows.length - 1] || null;
  const live = detail.live;
  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Request ", h("code", null, id)),
      h("a", { href: "#/requests", class: "quiet" }, "All requests")),
    scopeNote("The ledger rows and the capture come from the shared store; the timings and " +
      "attempts are kept in memory by the worker that served the request, for a while: another " +
      "worker, or a restarted svir, has only the ledger and the capture."),
  );

  const timings = live?.timings || {};
  const usage = live?.usage || (row ? {
    prompt_tokens: row.prompt_tokens, completion_tokens: row.completion_tokens,
    reasoning_tokens: row.reasoning_tokens, cached_tokens: row.cached_tokens,
  } : {});
  const cost = live?.cost_usd ?? (row && row.cost_micros != null ? row.cost_micros / 1e6 : null);
  main.append(h("div", { class: "columns" },
    section("Timings", facts([
      ["queue", ms(timings.queue_ms)],
      ["first byte", ms(timings.first_byte_ms)],
      ["first token", ms(timings.first_token_ms ?? row?.ttft_ms)],
      ["total", ms(timings.total_ms ?? row?.latency_ms)],
      ["tokens/s", num(row?.tokens_per_second, 1)],
    ])),
    section("Usage and cost", facts([
      ["prompt tokens", num(usage.prompt_tokens)],
      ["completion tokens", num(usage.completion_tokens)],
      ["reasoning tokens", num(usage.reasoning_tokens)],
      ["cached tokens", num(usage.cached_tokens)],
      ["cost", usd(cost)],
    ])),
    section("Outcome", facts([
      ["status", row ? statusBadge(row.status) : (live ? statusBadge(live.error ? "error" : "ok")
        : "–")],
      ["time", row ? dateTime(row.ts) : "–"],
      ["front end", row?.api],
      ["model", row?.model],
      ["served by", row?.served_model ? `${row.provider}: ${row.served_model}` : row?.provider],
      ["key", row?.key_id ?? "none"],
      ["upstream request id", row?.upstream_request_id],
    ])),
  ));

  const error = live?.error;
  if (error) {
    main.append(section("Error", h("pre", { class: "error-box", tabindex: "0" },
      typeof error === "string" ? error : pretty(error))));
  }
  if (live?.attempts?.length) {
    main.append(section("Attempts", table([
      ["#", (a) => String(live.attempts.indexOf(a) + 1), "n"],
      ["Provider", (a) => a.provider],
      ["Model", (a) => a.model],
      ["Outcome", (a) => statusBadge(a.outcome)],
      ["Why", (a) => a.why || "–"],
      ["Error", (a) => (a.error ? (typeof a.error === "string" ? a.error : pretty(a.error))
        : "–")],
    ], live.attempts, { caption: "Every upstream attempt, in order" })));
  } else if (!live) {
    main.append(section("Attempts", h("p", { class: "empty" },
      "This worker no longer holds the request's attempts: the ledger row above is what is " +
      "kept.")));
  }
  if (rows.length) {
    main.append(section("Ledger", table([
      ["Time", (r) => dateTime(r.ts)],
      ["Status", (r) => statusBadge(r.status)],
      ["Model", (r) => r.model],
      ["Provider", (r) => r.provider],
      ["In", (r) => num(r.prompt_tokens), "n"],
      ["Out", (r) => num(r.completion_tokens), "n"],
      ["Source", (r) => r.usage_source],
      ["Latency", (r) => ms(r.latency_ms), "n"],
    ], rows)));
  }

  const capture = detail.capture;
  if (!capture) {
    main.append(section("Capture", h("p", { class: "empty" },
      ctx.session.capture ? "Nothing was captured for this request (it may be too old, or " +
        "served by another worker)." :
        "Capture is off: turn it on in the config to keep each request's bytes " +
        "(docs/console.md).")));
    return;
  }
  const cr = capture.client_request || {};
  const ur = capture.upstream_request || {};
  const dl = h("button", { type: "button", id: "download-case" }, "Download as a conformance case");
  const saved = h("span", { class: "muted", role: "status" });
  dl.addEventListener("click", async () => {
    try {
      const name = await download(`/admin/requests/${encodeURIComponent(id)}/conformance`,
        `${id}.sse`);
      saved.textContent = `saved ${name}`;
    } catch (err) {
      if (!ctx.refused(err)) ctx.toast(`Download failed: ${err.message}`, "error");
    }
  });
  main.append(section("Capture",
    capture.truncated ? h("p", { class: "warn" }, "Truncated: the capture keeps at most its " +
      "configured size per text.") : null,
    h("div", { class: "panes" },
      pane("Client's request", "pane-client-request", headersText(cr.headers), bodyText(cr.body)),
      pane("Sent upstream", "pane-upstream-request",
        ur.url ? `POST ${ur.url}` : "", headersText(ur.headers), bodyText(ur.body)),
      pane("Upstream's stream", "pane-upstream-stream", capture.upstream_stream || ""),
      pane("Sent to the client", "pane-client-stream", capture.client_stream || "")),
    h("div", { class: "actions" }, dl, saved)));
}
