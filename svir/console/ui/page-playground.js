// Playground: chat with any model through any front end svir serves, streamed: the reasoning shown
// apart from the answer, tool calls rendered, tokens per second, and the raw stream on request.
// Each front end is one dialect: how a conversation becomes its request, and how its stream's
// pieces become {reasoning, content, tool, usage, error} here.

import { api, authHeaders, errorOf, ndjson, sse } from "./api.js";
import { append, clear, field, h, num, pretty, scopeNote, select } from "./dom.js";

const WEATHER = {
  name: "get_weather",
  description: "Get the current weather for a city.",
  parameters: {
    type: "object", properties: { city: { type: "string" } }, required: ["city"],
  },
};

function textOf(messages) {
  return messages.map((m) => `${m.role}: ${m.content}`).join("\n") + "\nassistant:";
}

// Each front end: its label, how to ask, and how to read one parsed stream item.
const FRONT_ENDS = {
  openai: {
    label: "OpenAI chat (/v1/chat/completions)",
    path: "/v1/chat/completions",
    body: (o) => ({
      model: o.model, stream: true, stream_options: { include_usage: true },
      max_tokens: o.maxTokens, temperature: o.temperature,
      messages: [...(o.system ? [{ role: "system", content: o.system }] : []), ...o.messages],
      ...(o.tools ? { tools: [{ type: "function", function: WEATHER }] } : {}),
    }),
    read: (item, out) => {
      if (item.data === "[DONE]") return;
      const chunk = JSON.parse(item.data);
      if (chunk.error) out.error(chunk.error.message || JSON.stringify(chunk.error));
      if (chunk.usage) out.usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens);
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (d.reasoning_content) out.reasoning(d.reasoning_content);
        if (d.content) out.content(d.content);
        for (const call of d.tool_calls || []) {
          out.tool(call.index ?? 0, call.function?.name, call.function?.arguments);
        }
      }
    },
  },
  anthropic: {
    label: "Anthropic messages (/v1/messages)",
    path: "/v1/messages",
    headers: { "anthropic-version": "2023-06-01" },
    body: (o) => ({
      model: o.model, stream: true, max_tokens: o.maxTokens, temperature: o.temperature,
      ...(o.system ? { system: o.system } : {}), messages: o.messages,
      ...(o.tools ? { tools: [{ name: WEATHER.name, description: WEATHER.description,
        input_schema: WEATHER.parameters }] } : {}),
    }),
    read: (item, out, state) => {
      const e = JSON.parse(item.data);
      if (e.type === "error") out.error(e.error?.message || JSON.stringify(e.error));
      if (e.type === "message_start") state.input = e.message?.usage?.input_tokens;
      if (e.type === "content_block_start" && e.content_block?.type === "tool_use") {
        out.tool(e.index, e.content_block.name, "");
      }
      if (e.type === "content_block_delta") {
        const d = e.delta || {};
        if (d.type === "text_delta") out.content(d.text);
        if (d.type === "thinking_delta") out.reasoning(d.thinking);
        if (d.type === "input_json_delta") out.tool(e.index, null, d.partial_json);
      }
      if (e.type === "message_delta" && e.usage) {
        out.usage(e.usage.input_tokens ?? state.input, e.usage.output_tokens);
      }
    },
  },
  responses: {
    label: "OpenAI Responses (/v1/responses)",
    path: "/v1/responses",
    body: (o) => ({
      model: o.model, stream: true, store: false, max_output_tokens: o.maxTokens,
      temperature: o.temperature, ...(o.system ? { instructions: o.system } : {}),
      input: o.messages.map((m) => ({ role: m.role, content: m.content })),
      ...(o.tools ? { tools: [{ type: "function", ...WEATHER }] } : {}),
    }),
    read: (item, out) => {
      const e = JSON.parse(item.data);
      const type = e.type || item.event;
      if (type === "response.output_text.delta") out.content(e.delta);
      else if (type === "response.reasoning_text.delta" ||
        type === "response.reasoning_summary_text.delta") out.reasoning(e.delta);
      else if (type === "response.output_item.added" && e.item?.type === "function_call") {
        out.tool(e.output_index, e.item.name, "");
      } else if (type === "response.function_call_arguments.delta") {
        out.tool(e.output_index, null, e.delta);
      } else if (type === "response.completed" || type === "response.incomplete") {
        const u = e.response?.usage;
        if (u) out.usage(u.input_tokens, u.output_tokens);
      } else if (type === "response.failed") {
        out.error(e.response?.error?.message || "the response failed");
      } else if (type === "error") {
        out.error(e.message || e.error?.message || JSON.stringify(e));
      }
    },
  },
  ollama: {
    label: "Ollama chat (/api/chat)",
    path: "/api/chat",
    ndjson: true,
    body: (o) => ({
      model: o.model, stream: true,
      options: { num_predict: o.maxTokens, temperature: o.temperature },
      messages: [...(o.system ? [{ role: "system", content: o.system }] : []), ...o.messages],
      ...(o.tools ? { tools: [{ type: "function", function: WEATHER }] } : {}),
    }),
    read: (item, out) => {
      if (item.error) out.error(item.error);
      const m = item.message || {};
      if (m.thinking) out.reasoning(m.thinking);
      if (m.content) out.content(m.content);
      (m.tool_calls || []).forEach((call, i) => {
        out.tool(i, call.function?.name, JSON.stringify(call.function?.arguments ?? {}));
      });
      if (item.done) out.usage(item.prompt_eval_count, item.eval_count);
    },
  },
  completions: {
    label: "Text completions (/v1/completions)",
    path: "/v1/completions",
    body: (o) => ({
      model: o.model, stream: true, stream_options: { include_usage: true },
      max_tokens: o.maxTokens, temperature: o.temperature,
      prompt: (o.system ? `${o.system}\n` : "") + textOf(o.messages),
    }),
    read: (item, out) => {
      if (item.data === "[DONE]") return;
      const chunk = JSON.parse(item.data);
      if (chunk.error) out.error(chunk.error.message || JSON.stringify(chunk.error));
      if (chunk.usage) out.usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens);
      for (const choice of chunk.choices || []) if (choice.text) out.content(choice.text);
    },
  },
};

export async function render(main, ctx) {
  const models = await api("/v1/models", { signal: ctx.signal }).catch((err) => {
    if (err.name === "AbortError") throw err;
    ctx.toast(`No model list: ${err.message}`, "error");
    return { data: [] };
  });
  const ids = (models.data || []).map((m) => m.id);
  const controls = {
    model: select(ids, ids[0], { name: "model", id: "pg-model" }),
    frontEnd: select(Object.entries(FRONT_ENDS).map(([k, f]) => [k, f.label]), "openai",
      { name: "front-end", id: "pg-front-end" }),
    system: h("input", { name: "system", id: "pg-system", placeholder: "You are terse." }),
    maxTokens: h("input", { name: "max-tokens", id: "pg-max-tokens", type: "number", min: "1",
      value: "64" }),
    temperature: h("input", { name: "temperature", id: "pg-temperature", type: "number",
      min: "0", max: "2", step: "0.1", value: "0.7" }),
    tools: h("input", { type: "checkbox", id: "pg-tools", name: "tools" }),
    raw: h("input", { type: "checkbox", id: "pg-raw", name: "raw" }),
    prompt: h("textarea", { id: "pg-prompt", name: "prompt", rows: "3", required: true,
      placeholder: "Say hello." }),
  };
  const transcript = h("div", { class: "transcript", id: "transcript", "aria-live": "polite" });
  const meter = h("p", { class: "speed", id: "pg-speed", role: "status" });
  const rawPane = h("pre", { class: "raw", id: "pg-raw-stream", tabindex: "0", hidden: true,
    "aria-label": "The raw stream" });
  const send = h("button", { type: "submit", id: "pg-send" }, "Send");
  const stop = h("button", { type: "button", class: "quiet", disabled: true }, "Stop");
  const reset = h("button", { type: "button", class: "quiet" }, "New chat");
  const form = h("form", { class: "playground-form", "aria-label": "Chat" },
    h("div", { class: "form-grid" },
      field("Model", controls.model),
      field("Front end", controls.frontEnd),
      field("System prompt", controls.system),
      field("Max tokens", controls.maxTokens),
      field("Temperature", controls.temperature)),
    h("div", { class: "checks" },
      h("label", null, controls.tools, " Offer a tool (get_weather)"),
      h("label", null, controls.raw, " Show the raw stream")),
    field("Message", controls.prompt),
    h("div", { class: "actions" }, send, stop, reset));

  main.append(
    h("div", { class: "page-head" }, h("h1", null, "Playground")),
    scopeNote(ctx.session.auth === "admin_key"
      ? "Requests go through svir's API with the admin key (no limits; the ledger notes no key)."
      : "Requests go through svir's API as any client on this machine."),
    form, meter, transcript, rawPane,
  );
  if (!ids.length) {
    transcript.append(h("p", { class: "empty" }, "svir lists no model: nothing to chat with."));
  }

  let history = [];
  let running = null;
  controls.raw.addEventListener("change", () => { rawPane.hidden = !controls.raw.checked; });
  reset.addEventListener("click", () => {
    history = [];
    clear(transcript);
    clear(meter);
    clear(rawPane);
  });
  stop.addEventListener("click", () => running && running.abort());
  controls.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  ctx.signal.addEventListener("abort", () => running && running.abort());

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = controls.prompt.value.trim();
    if (!text || running) return;
    const dialect = FRONT_ENDS[controls.frontEnd.value];
    history.push({ role: "user", content: text });
    controls.prompt.value = "";
    transcript.append(h("div", { class: "msg user" }, h("div", { class: "who" }, "you"),
      h("div", { class: "body" }, text)));
    const reasoningBody = h("div", { class: "body" });
    const reasoning = h("details", { class: "reasoning", hidden: true, open: true },
      h("summary", null, "Reasoning"), reasoningBody);
    const content = h("div", { class: "body content" });
    const tools = h("div", { class: "tools" });
    const errorLine = h("p", { class: "error-box", hidden: true, role: "alert" });
    transcript.append(h("div", { class: "msg assistant" },
      h("div", { class: "who" }, `${controls.model.value} via ${controls.frontEnd.value}`),
      reasoning, content, tools, errorLine));
    clear(rawPane);
    clear(meter);

    const controller = new AbortController();
    running = controller;
    send.disabled = true;
    stop.disabled = false;
    const started = performance.now();
    let firstAt = null;
    let pieces = 0;
    let usage = null;
    let answer = "";
    const calls = new Map();
    const firstToken = () => {
      pieces += 1;
      if (firstAt === null) firstAt = performance.now();
    };
    const showSpeed = (final) => {
      const now = performance.now();
      const tokens = usage && usage.out != null ? usage.out : pieces;
      const secs = firstAt !== null ? (now - firstAt) / 1000 : 0;
      const rate = secs > 0 && tokens > 1 ? (tokens - 1) / secs : null;
      append(clear(meter), [
        h("span", { class: "stat" }, h("strong", { id: "pg-tps" },
          rate === null ? "–" : num(rate, 1)), " tokens/s"),
        h("span", { class: "stat" }, h("strong", null, num(tokens)), final && usage
          ? " tokens out" : " tokens out (counted)"),
        usage && usage.in != null ? h("span", { class: "stat" },
          h("strong", null, num(usage.in)), " tokens in") : null,
        firstAt !== null ? h("span", { class: "stat" }, "first token ",
          h("strong", null, `${num(firstAt - started)} ms`)) : null,
        final ? h("span", { class: "stat done" }, "done") : null,
      ]);
    };
    const out = {
      content: (t) => { firstToken(); answer += t; content.textContent = answer; },
      reasoning: (t) => {
        firstToken();
        reasoning.hidden = false;
        reasoningBody.textContent += t;
      },
      tool: (index, name, args) => {
        firstToken();
        let call = calls.get(index);
        if (!call) {
          const argsEl = h("pre", { class: "args" });
          const nameEl = h("code", null, "");
          call = { name: "", args: "", argsEl, nameEl };
          calls.set(index, call);
          tools.append(h("div", { class: "tool-call" }, h("span", { class: "badge" }, "tool call"),
            " ", nameEl, argsEl));
        }
        if (name) { call.name = name; call.nameEl.textContent = name; }
        if (args) { call.args += args; call.argsEl.textContent = pretty(call.args); }
      },
      usage: (i, o) => { usage = { in: i, out: o }; },
      error: (message) => { errorLine.hidden = false; errorLine.textContent = message; },
    };
    const onRaw = (line) => { rawPane.append(`${line}\n`); };
    let timer = setInterval(() => showSpeed(false), 250);
    try {
      const options = {
        model: controls.model.value, system: controls.system.value.trim(),
        maxTokens: Number.parseInt(controls.maxTokens.value, 10) || 64,
        temperature: Number(controls.temperature.value),
        messages: history.slice(), tools: controls.tools.checked,
      };
      const response = await fetch(dialect.path, {
        method: "POST", signal: controller.signal, cache: "no-store",
        headers: authHeaders({ "Content-Type": "application/json", ...(dialect.headers || {}) }),
        body: JSON.stringify(dialect.body(options)),
      });
      if (!response.ok) throw await errorOf(response, dialect.path);
      const state = {};
      const items = dialect.ndjson ? ndjson(response, controller.signal, onRaw)
        : sse(response, controller.signal, onRaw);
      for await (const item of items) {
        try {
          dialect.read(item, out, state);
        } catch (err) {
          out.error(`Could not read a piece of the stream: ${err.message}`);
        }
      }
      history.push({ role: "assistant", content: answer });
    } catch (err) {
      if (err.name === "AbortError") out.error("Stopped.");
      else out.error(err.message);
      if (!answer) history.pop();
      else history.push({ role: "assistant", content: answer });
    } finally {
      clearInterval(timer);
      timer = null;
      showSpeed(true);
      running = null;
      send.disabled = false;
      stop.disabled = true;
      if (!content.textContent && !calls.size) content.textContent = answer ? answer : "";
    }
  });
}
