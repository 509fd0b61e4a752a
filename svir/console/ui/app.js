// The console's shell: who the page is talking to (GET /admin/console/session), the admin key
// asked for when svir wants one, and the router that loads each page's module when it is opened
// (a cold load fetches only the shell and the page shown).

import { ApiError, adminKey, api, setAdminKey } from "./api.js";
import { append, clear, field, h } from "./dom.js";

const PAGES = {
  overview: "Overview",
  models: "Models",
  requests: "Requests",
  request: "Request",
  usage: "Usage",
  keys: "Keys",
  playground: "Playground",
  config: "Config",
};

const main = document.getElementById("main");
const who = document.getElementById("who");
const forget = document.getElementById("forget");
let session = null;
let running = null;
let firstView = true;

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const item = h("div", { class: `toast ${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 10000 : 5000);
}

function parseHash() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean)
    .map(decodeURIComponent);
  let [page, ...params] = parts;
  if (!page || !(page in PAGES)) page = "overview";
  if (page === "requests" && params.length) page = "request";
  return { page, params };
}

function highlight(page) {
  const active = page === "request" ? "requests" : page;
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function showWho() {
  clear(who);
  if (!session) return;
  const how = session.auth === "admin_key" ? "admin key" : "this machine (no keys)";
  const workers = session.workers > 1
    ? `worker pid ${session.pid} of ${session.workers}` : `pid ${session.pid}`;
  append(who, [
    h("span", { class: "badge" }, `svir ${session.version}`), " ",
    h("span", null, `${how} · ${workers}`),
    session.capture ? h("span", { class: "badge warn" }, "capture on") : null,
  ]);
  forget.hidden = !adminKey();
}

function problemText(err) {
  if (err.code === "admin_disabled") {
    return [
      "svir's admin API is off: svir has API keys but no admin key.",
      "Set one in svir's environment (the variable [auth] admin_key_env names, by default " +
        "SVIR_ADMIN_KEY: for example SVIR_ADMIN_KEY=$(openssl rand -hex 24) svir serve), " +
        "restart svir, and enter the same key here.",
    ];
  }
  if (err.code === "loopback_only") {
    return [
      "svir has no admin key and no API keys, so it answers only this machine.",
      "Open the console from the machine svir runs on, or set an admin key in svir's " +
        "environment (SVIR_ADMIN_KEY, or the variable [auth] admin_key_env names), restart " +
        "svir and enter it here.",
    ];
  }
  return [
    adminKey() ? "svir refused that key: it is not svir's admin key." :
      "svir wants its admin key.",
    "It is the value of the environment variable [auth] admin_key_env names (SVIR_ADMIN_KEY " +
      "by default) in svir's environment. The page keeps it for this tab only and sends it " +
      "as an Authorization header.",
  ];
}

function loginView(err) {
  clear(main);
  document.title = "Sign in · svir console";
  const input = h("input", {
    type: "password", name: "admin-key", autocomplete: "off", spellcheck: "false", required: true,
  });
  const [first, second] = problemText(err);
  const form = h("form", {
    class: "login card",
    onsubmit: async (event) => {
      event.preventDefault();
      setAdminKey(input.value.trim());
      await start();
    },
  },
  h("h1", null, "svir console"),
  h("p", null, first),
  h("p", { class: "muted" }, second),
  field("Admin key", input),
  h("div", { class: "actions" }, h("button", { type: "submit" }, "Enter")));
  main.append(form);
  input.focus();
}

function failureView(err) {
  clear(main);
  main.append(h("div", { class: "card error-box", role: "alert" },
    h("h1", null, "svir did not answer the console"),
    h("p", null, err.message),
    err.status === 404 ? h("p", null,
      "This svir has no console API (GET /admin/console/session): it may be older than " +
      "the console.") : null,
    h("button", { type: "button", onclick: () => start() }, "Try again")));
}

async function connect() {
  try {
    session = await api("/admin/console/session");
    showWho();
    return true;
  } catch (err) {
    session = null;
    showWho();
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) loginView(err);
    else failureView(err);
    return false;
  }
}

export function errorBox(err) {
  return h("div", { class: "error-box", role: "alert" },
    h("strong", null, err.status ? `${err.status} ${err.code || ""}` : "Error"), " ",
    err.message);
}

async function show() {
  if (running) running.abort();
  const controller = new AbortController();
  running = controller;
  const { page, params } = parseHash();
  highlight(page);
  if (!session && !(await connect())) return;
  if (controller.signal.aborted) return;
  clear(main);
  main.append(h("p", { class: "loading" }, "Loading…"));
  document.title = `${PAGES[page]} · svir console`;
  let module;
  try {
    module = await import(`./page-${page}.js`);
  } catch (err) {
    clear(main);
    main.append(errorBox(err));
    return;
  }
  if (controller.signal.aborted) return;
  clear(main);
  const ctx = {
    signal: controller.signal,
    params,
    session,
    toast,
    errorBox,
    refused: (err) => refused(err),
  };
  try {
    await module.render(main, ctx);
  } catch (err) {
    if (controller.signal.aborted || err.name === "AbortError") return;
    if (!refused(err)) {
      clear(main);
      main.append(h("div", { class: "page-head" }, h("h1", null, PAGES[page])), errorBox(err));
    }
  }
  if (!firstView) main.focus({ preventScroll: true });
  firstView = false;
}

// A 401 on any call means the key was taken away (svir restarted with another): ask again.
function refused(err) {
  if (err instanceof ApiError && err.status === 401 && err.path?.startsWith("/admin/")) {
    session = null;
    loginView(err);
    return true;
  }
  return false;
}

async function start() {
  session = null;
  await show();
}

forget.addEventListener("click", () => {
  setAdminKey(null);
  start();
});
window.addEventListener("hashchange", show);
// The page's own failures go to the screen, not only to the console.
window.addEventListener("unhandledrejection", (event) => {
  if (event.reason && event.reason.name === "AbortError") {
    event.preventDefault();
    return;
  }
  toast(`The page failed: ${event.reason && event.reason.message}`, "error");
});
start();
