#!/usr/bin/env bash
# Claude Code for the agent tests (tests/anthropic/test_claude_code.py): npm's package, which ships
# its linux binary, installed once per version under $CACHE (default ~/.cache/svir).
set -euo pipefail
exec bash "$(dirname "$0")/npm-tool.sh" @anthropic-ai/claude-code "${CLAUDE_CODE_VERSION:?the version to install}" claude-code claude
