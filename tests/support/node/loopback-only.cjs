// Preloaded (NODE_OPTIONS=--require) into the npm agents under test: every TCP connection to a
// host other than loopback is refused before it is made, and written to $SVIR_BLOCKED_LOG, so a
// test can assert that nothing left the machine (Node's fetch ignores HTTPS_PROXY).
"use strict";
const fs = require("fs");
const net = require("net");
const LOOPBACK = new Set(["127.0.0.1", "::1", "localhost", "0.0.0.0"]);
const logPath = process.env.SVIR_BLOCKED_LOG;
const original = net.Socket.prototype.connect;
net.Socket.prototype.connect = function (...args) {
  let options = args[0];
  if (Array.isArray(options)) options = options[0];
  let host = "localhost";
  if (options && typeof options === "object") {
    if (options.path) return original.apply(this, args);
    host = options.host || "localhost";
  } else if (typeof args[1] === "string") {
    host = args[1];
  }
  if (!LOOPBACK.has(host)) {
    if (logPath) fs.appendFileSync(logPath, host + "\n");
    const socket = this;
    process.nextTick(() => socket.destroy(new Error(`svir tests: no connection to ${host}`)));
    return socket;
  }
  return original.apply(this, args);
};
