#!/usr/bin/env bash
# The Codex CLI for the agent tests (tests/responses/test_codex.py): npm's @openai/codex, whose
# linux binary comes in an optional platform package (@openai/codex-linux-x64 on x86_64), installed
# once per version under $CACHE (default ~/.cache/svir).
set -euo pipefail
exec bash "$(dirname "$0")/npm-tool.sh" @openai/codex "${CODEX_VERSION:?the version to install}" codex codex
