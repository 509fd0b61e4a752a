#!/usr/bin/env bash
# The Continue CLI for the editor-agent tests (tests/ollama/test_continue_cli.py): npm's
# @continuedev/cli (`cn`), installed once per version under $CACHE (default ~/.cache/svir).
set -euo pipefail
exec bash "$(dirname "$0")/npm-tool.sh" @continuedev/cli "${CONTINUE_CLI_VERSION:?the version to install}" continue-cli cn
