#!/usr/bin/env bash
# Codex CLI for the agent tests (tests/responses/test_codex.py): npm's @openai/codex, whose linux
# binary comes in an optional platform package, installed once per version under $CACHE (default
# ~/.cache/svir). The check at the end runs the native binary, so a missing platform package
# fails here.
set -euo pipefail
CACHE=${CACHE:-$HOME/.cache/svir}
VERSION=${CODEX_VERSION:?the version to install}
DIR="$CACHE/codex-$VERSION"
if [ -x "$DIR/node_modules/.bin/codex" ] && "$DIR/node_modules/.bin/codex" --version >/dev/null 2>&1; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is missing: install Node.js (20 or later) to run the Codex tests" >&2
  exit 1
fi
npm install --silent --no-fund --no-audit --include=optional --prefix "$DIR" "@openai/codex@$VERSION"
if ! "$DIR/node_modules/.bin/codex" --version; then
  echo "Codex $VERSION installed in $DIR does not run: its platform package" \
    "(@openai/codex-linux-x64 on x86_64 Linux) is missing or not for this machine" >&2
  exit 1
fi
