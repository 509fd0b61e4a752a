#!/usr/bin/env bash
# The Continue CLI for the editor-agent tests (tests/ollama/test_continue_cli.py): npm's
# @continuedev/cli (`cn`), installed once per version under $CACHE (default ~/.cache/svir).
set -euo pipefail
CACHE=${CACHE:-$HOME/.cache/svir}
VERSION=${CONTINUE_CLI_VERSION:?the version to install}
DIR="$CACHE/continue-cli-$VERSION"
if [ -x "$DIR/node_modules/.bin/cn" ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is missing: install Node.js (20 or later) to run the Continue CLI tests" >&2
  exit 1
fi
npm install --silent --no-fund --no-audit --prefix "$DIR" "@continuedev/cli@$VERSION"
"$DIR/node_modules/.bin/cn" --version
