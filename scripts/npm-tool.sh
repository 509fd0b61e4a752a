#!/usr/bin/env bash
# An npm tool the agent tests drive, installed once per version under $CACHE (default
# ~/.cache/svir): `npm-tool.sh PACKAGE VERSION DIR BIN` installs PACKAGE@VERSION into
# $CACHE/DIR-VERSION unless its node_modules/.bin/BIN is there and runs, and prints BIN's version.
# Optional dependencies are included: some tools (Codex) ship their native binary as one.
set -euo pipefail
PACKAGE=${1:?the npm package}
VERSION=${2:?the version to install}
NAME=${3:?the folder name under the cache}
BIN=${4:?the command it installs}
CACHE=${CACHE:-$HOME/.cache/svir}
DIR="$CACHE/$NAME-$VERSION"
if [ -x "$DIR/node_modules/.bin/$BIN" ] && "$DIR/node_modules/.bin/$BIN" --version >/dev/null 2>&1; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "npm is missing: install Node.js (20 or later) to run the tests that drive $PACKAGE" >&2
  exit 1
fi
npm install --silent --no-fund --no-audit --include=optional --prefix "$DIR" "$PACKAGE@$VERSION"
if ! "$DIR/node_modules/.bin/$BIN" --version; then
  echo "$PACKAGE@$VERSION installed in $DIR does not run: its native binary (an optional" \
    "platform package) is missing or not for this machine" >&2
  exit 1
fi
