#!/usr/bin/env bash
# Claude Code for the agent tests (tests/anthropic/test_claude_code.py): npm's package, which ships
# its linux binary, installed once per version under $CACHE (default ~/.cache/svir).
set -euo pipefail
CACHE=${CACHE:-$HOME/.cache/svir}
VERSION=${CLAUDE_CODE_VERSION:?the version to install}
DIR="$CACHE/claude-code-$VERSION"
if [ -x "$DIR/node_modules/.bin/claude" ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is missing: install Node.js (20 or later) to run the Claude Code tests" >&2
  exit 1
fi
npm install --silent --no-fund --no-audit --prefix "$DIR" "@anthropic-ai/claude-code@$VERSION"
"$DIR/node_modules/.bin/claude" --version
