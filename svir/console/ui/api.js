// svir's admin API from the page: the admin key held for this tab (sessionStorage), sent as a
// bearer header on every call (no cookie: nothing another site could make the browser send), and
// the readers of streamed answers (SSE and NDJSON) over fetch, since EventSource cannot send a
// header.

const KEY_NAME = "svir.adminKey";

export function adminKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setAdminKey(key) {
  if (key) sessionStorage.setItem(KEY_NAME, key);
  else sessionStorage.removeItem(KEY_NAME);
}

export class ApiError extends Error {
  constructor(status, error, path) {
    const message = (error && error.message) || `HTTP ${status}`;
    super(message);
    this.status = status;
    this.code = error && error.code;
    this.type = error && error.type;
    this.path = path;
  }
}

export function authHeaders(extra = {}) {
  const headers = { ...extra };
  const key = adminKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

// One call: JSON in and out; an answer that is not 2xx is an ApiError with the server's words.
export async function api(path, { method = "GET", body, signal, raw = false, headers } = {}) {
  const init = { method, signal, cache: "no-store", headers: authHeaders(headers) };
  // Every write says JSON, with a body or without: svir refuses an admin write that a form
  // could have sent (README, "Security").
  if (method !== "GET" && method !== "HEAD") init.headers["Content-Type"] = "application/json";
  if (body !== undefined) init.body = JSON.stringify(body);
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { message: `svir cannot be reached (${err.message})` }, path);
  }
  if (!response.ok) throw await errorOf(response, path);
  if (raw) return response;
  if (response.status === 204) return null;
  return response.json();
}

export async function errorOf(response, path) {
  let error = null;
  try {
    const body = await response.json();
    error = body && (body.error || body);
    if (typeof error === "string") error = { message: error };
  } catch {
    error = { message: `${response.status} ${response.statusText}` };
  }
  return new ApiError(response.status, error, path);
}

// The lines of a streamed body, as they come.
export async function* lines(response, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    while (true) {
      if (signal && signal.aborted) return;
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let at;
      while ((at = buffer.search(/\r\n|\n|\r/)) >= 0) {
        const sep = buffer[at] === "\r" && buffer[at + 1] === "\n" ? 2 : 1;
        yield buffer.slice(0, at);
        buffer = buffer.slice(at + sep);
      }
    }
    buffer += decoder.decode();
    if (buffer) yield buffer;
  } finally {
    reader.cancel().catch(() => {});
  }
}

// Server-sent events (the WHATWG framing): {event, data} per blank-line-ended block; comments
// (`: ping`) are skipped. `onRaw` gets each line as it came (the playground's raw view).
export async function* sse(response, signal, onRaw) {
  let event = "";
  let data = [];
  for await (const line of lines(response, signal)) {
    if (onRaw) onRaw(line);
    if (line === "") {
      if (data.length) yield { event: event || "message", data: data.join("\n") };
      event = "";
      data = [];
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
  }
  if (data.length) yield { event: event || "message", data: data.join("\n") };
}

export async function* ndjson(response, signal, onRaw) {
  for await (const line of lines(response, signal)) {
    if (onRaw) onRaw(line);
    if (line.trim()) yield JSON.parse(line);
  }
}

// A live subscription to one of svir's event streams (GET path): each event's data parsed as
// JSON and given to `onEvent(name, data)`; reconnects after a pause when the stream ends or
// fails, until `signal` aborts. `onState` hears "live", "retrying" (with the reason) and
// "closed".
export function subscribe(path, onEvent, { signal, onState = () => {} } = {}) {
  let pause = 1000;
  const run = async () => {
    while (!signal.aborted) {
      try {
        const response = await fetch(path, {
          headers: authHeaders({ Accept: "text/event-stream" }), signal, cache: "no-store",
        });
        if (!response.ok) throw await errorOf(response, path);
        onState("live");
        pause = 1000;
        for await (const { event, data } of sse(response, signal)) {
          let parsed = null;
          try { parsed = JSON.parse(data); } catch { parsed = data; }
          onEvent(event, parsed);
        }
        if (signal.aborted) break;
        onState("retrying", "the stream ended");
      } catch (err) {
        if (signal.aborted || err.name === "AbortError") break;
        onState("retrying", err.message);
        // A refusal will not mend by itself soon: wait longer.
        if (err instanceof ApiError && err.status >= 400 && err.status < 500) pause = 15000;
      }
      await sleep(pause, signal);
      pause = Math.min(pause * 2, 15000);
    }
    onState("closed");
  };
  run();
}

export function sleep(millis, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, millis);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); },
      { once: true });
  });
}

// Save a fetched file (the browser's download), for answers only a header can fetch.
export async function download(path, fallbackName) {
  const response = await api(path, { raw: true });
  const disposition = response.headers.get("content-disposition") || "";
  const found = /filename\*?=(?:UTF-8'')?"?([^";]+)"?/i.exec(disposition);
  const name = found ? decodeURIComponent(found[1]) : fallbackName;
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
  return name;
}
