// Overview: this worker's traffic over the last minutes (GET /admin/stats), kept live by the
// `stats` events of GET /admin/events, and each model's latency, time to first token and speed.

import { api, subscribe } from "./api.js";
import { lineChart } from "./charts.js";
import { clear, h, ms, num, scopeNote, section, table } from "./dom.js";

const MINUTES = 15;

export async function render(main, ctx) {
  const stats = await api(`/admin/stats?minutes=${MINUTES}`, { signal: ctx.signal });
  const interval = stats.interval_seconds || 1;
  // Rates per second, whatever the width of the interval a point covers.
  const series = { t: [], requests: [], errors: {}, tokensIn: [], tokensOut: [], streams: [] };
  const add = (point, width) => {
    const t = point.t;
    series.t.push(t);
    series.requests.push([t, (point.requests || 0) / width]);
    series.tokensIn.push([t, (point.tokens_in || 0) / width]);
    series.tokensOut.push([t, (point.tokens_out || 0) / width]);
    series.streams.push([t, point.streams_open || 0]);
    for (const [cls, n] of Object.entries(point.errors || {})) {
      (series.errors[cls] ||= []).push([t, n / width]);
    }
    const cutoff = t - MINUTES * 60;
    for (const list of [series.requests, series.tokensIn, series.tokensOut, series.streams,
      ...Object.values(series.errors)]) {
      while (list.length && list[0][0] < cutoff) list.shift();
    }
  };
  for (const point of stats.points || []) add(point, interval);

  const tiles = h("div", { class: "tiles", "aria-live": "off" });
  const charts = h("div", { class: "charts" });
  const models = h("div");
  const live = h("span", { class: "live-state", role: "status" }, "connecting…");

  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Overview"), live),
    scopeNote(`The figures of the worker that answered (pid ${stats.pid}): with several ` +
      "workers each counts its own requests; the Requests page's history and the Usage page " +
      "read the shared store."),
    tiles, charts, section(`Per model, last ${MINUTES} minutes`, models),
  );

  const draw = () => {
    clear(tiles);
    const lastMinute = (list) => {
      const recent = list.filter(([t]) => t > (series.t.at(-1) || 0) - 60);
      return recent.length ? recent.reduce((a, [, v]) => a + v, 0) / recent.length : 0;
    };
    const errorsRate = Object.values(series.errors).reduce((a, l) => a + lastMinute(l), 0);
    const tile = (label, value) => h("div", { class: "tile" },
      h("div", { class: "tile-value" }, value), h("div", { class: "tile-label" }, label));
    tiles.append(
      tile("requests/s (last minute)", num(lastMinute(series.requests), 2)),
      tile("errors/s (last minute)", num(errorsRate, 2)),
      tile("tokens in/s", num(lastMinute(series.tokensIn), 1)),
      tile("tokens out/s", num(lastMinute(series.tokensOut), 1)),
      tile("streams open", num(series.streams.at(-1)?.[1] ?? 0)),
    );
    clear(charts);
    const span = MINUTES * 60;
    const errorSeries = Object.entries(series.errors).map(([name, points], i) => ({
      name, points, color: (i + 2) % 6,
    }));
    charts.append(
      lineChart("Requests per second", [{ name: "requests/s", points: series.requests }],
        { span }),
      lineChart("Errors per second, by class",
        errorSeries.length ? errorSeries : [{ name: "errors/s", points: [], color: 3 }],
        { span }),
      lineChart("Tokens per second", [
        { name: "in (prompt)", points: series.tokensIn, color: 0 },
        { name: "out (completion)", points: series.tokensOut, color: 1 },
      ], { span }),
      lineChart("Streams open", [{ name: "streams", points: series.streams, color: 4 }],
        { span }),
    );
  };

  const drawModels = (byModel) => {
    clear(models);
    const rows = Object.entries(byModel || {}).map(([model, m]) => ({ model, ...m }));
    rows.sort((a, b) => (b.requests || 0) - (a.requests || 0));
    if (!rows.length) {
      models.append(h("p", { class: "empty" }, "No requests in these minutes."));
      return;
    }
    models.append(table([
      ["Model", (r) => r.model],
      ["Requests", (r) => num(r.requests), "n"],
      ["Latency p50", (r) => ms(r.latency_ms_p50), "n"],
      ["Latency p95", (r) => ms(r.latency_ms_p95), "n"],
      ["First token p50", (r) => ms(r.ttft_ms_p50), "n"],
      ["Tokens/s p50", (r) => num(r.tokens_per_second_p50, 1), "n"],
    ], rows, { caption: "Latency, time to first token and speed per model" }));
  };

  draw();
  drawModels(stats.models);

  let lastLive = null;
  subscribe("/admin/events", (event, data) => {
    if (event !== "stats" || !data || typeof data !== "object") return;
    const width = lastLive ? Math.max(1, data.t - lastLive) : 1;
    lastLive = data.t;
    add(data, width);
    draw();
  }, {
    signal: ctx.signal,
    onState: (state, why) => {
      live.textContent = state === "live" ? "live" : state === "retrying"
        ? `reconnecting (${why})` : "stopped";
      live.className = `live-state ${state}`;
    },
  });

  // The per-model figures are not in the events: ask again now and then.
  const timer = setInterval(async () => {
    try {
      const fresh = await api(`/admin/stats?minutes=${MINUTES}`, { signal: ctx.signal });
      drawModels(fresh.models);
    } catch (err) {
      if (err.name !== "AbortError") ctx.refused(err);
    }
  }, 10000);
  ctx.signal.addEventListener("abort", () => clearInterval(timer));
}
