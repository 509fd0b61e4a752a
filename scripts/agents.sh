#!/usr/bin/env bash
# The coding agents the tests drive headless: Claude Code (tests/anthropic/test_claude_code.py),
# the Codex CLI (tests/responses/test_codex.py) and the Continue CLI (tests/ollama/
# test_continue_cli.py), exactly as scripts/agents/package-lock.json pins them (every package,
# with its integrity hash), installed with `npm ci` into $CACHE/agents-<the lock's digest>
# (default ~/.cache/svir): a new lock installs anew, an installed one is kept. The Codex CLI ships
# its native binary as an optional platform package, so optional dependencies are included.
# Moving an agent forward: change its version in scripts/agents/package.json, then `make upgrade`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/svir}
LOCK="$HERE/agents/package-lock.json"
BINS=(claude codex cn)

if command -v sha256sum >/dev/null; then
  digest=$(sha256sum "$LOCK" | cut -c1-16)
else
  digest=$(shasum -a 256 "$LOCK" | cut -c1-16)
fi
DIR="$CACHE/agents-$digest"

runs_all() {
  for bin in "${BINS[@]}"; do
    "$DIR/node_modules/.bin/$bin" --version >/dev/null 2>&1 || return 1
  done
}

if [ -d "$DIR/node_modules" ] && runs_all; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "agents: npm is missing: install Node.js (20 or later) to run the tests that drive" \
    "Claude Code, the Codex CLI and the Continue CLI" >&2
  exit 1
fi
mkdir -p "$DIR"
cp "$HERE/agents/package.json" "$LOCK" "$DIR/"
if ! (cd "$DIR" && npm ci --silent --no-fund --no-audit --include=optional); then
  echo "agents: npm ci failed in $DIR; if it says package.json and package-lock.json are not in" \
    "sync, run 'make upgrade' and commit scripts/agents/package-lock.json" >&2
  exit 1
fi
for bin in "${BINS[@]}"; do
  if ! "$DIR/node_modules/.bin/$bin" --version >/dev/null 2>&1; then
    echo "agents: $bin, installed in $DIR, does not run: its native binary (an optional" \
      "platform package) is missing or not for this machine" >&2
    exit 1
  fi
done
echo "agents: installed in $DIR" >&2
