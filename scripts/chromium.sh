#!/usr/bin/env bash
# The browser the console's tests drive (tests/console/test_browser.py): Debian's Chromium, run
# headless by Playwright (which downloads no browser of its own). `make test` runs this first: a
# Chromium that runs is kept; a missing one is installed with apt-get when this is root on a
# machine with apt; otherwise what to install is named and the script exits 1, so that `make test`
# stops here rather than in failed browser tests.
#
# The version: CHROMIUM_VERSION (the Makefile's: the Debian package the suite was last green with,
# beside the Playwright of uv.lock) is the one installed. Debian's security archive keeps only its
# newest build, so when apt no longer has that one, the newest is installed and that is said; a
# Chromium already installed at another version is replaced by the pinned one where apt has it
# (as root), else kept, and said (`make upgrade` moves the pin).
#
# SVIR_CHROMIUM names the binary (default /usr/bin/chromium, as the tests use); the tests of this
# script (tests/test_setup_scripts.py) point it and PATH elsewhere.
set -u
CHROMIUM=${SVIR_CHROMIUM:-/usr/bin/chromium}
PINNED=${CHROMIUM_VERSION:-}

say() { printf 'chromium: %s\n' "$*" >&2; }

runs() { "$CHROMIUM" --headless --no-sandbox --version >/dev/null 2>&1; }

apt() { DEBIAN_FRONTEND=noninteractive apt-get "$@" >&2; }

can_apt() { [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; }

if [ -x "$CHROMIUM" ] && runs; then
  if [ -n "$PINNED" ] && command -v dpkg-query >/dev/null 2>&1; then
    have=$(dpkg-query -W -f '${Version}' chromium 2>/dev/null || true)
    if [ -n "$have" ] && [ "$have" != "$PINNED" ]; then
      if can_apt && apt install -y -q "chromium=$PINNED" "chromium-common=$PINNED" && runs; then
        say "installed Debian's chromium $PINNED in place of $have"
      else
        say "Debian's chromium $have is installed; the suite was last green with $PINNED (kept as it is)"
      fi
    fi
  fi
  exit 0
fi
if can_apt; then
  pinned=(chromium)
  [ -n "$PINNED" ] && pinned=("chromium=$PINNED" "chromium-common=$PINNED")
  say "installing Debian's chromium for the console's browser tests (apt-get install ${pinned[*]})"
  if ! apt install -y -q "${pinned[@]}"; then
    # A machine whose package lists are stale or empty: refresh them once and try again.
    apt update -q
    if ! apt install -y -q "${pinned[@]}" && [ -n "$PINNED" ]; then
      say "apt-get has no chromium $PINNED any more: installing its newest (apt-get install chromium)"
      apt install -y -q chromium
    fi
  fi
  if [ -x "$CHROMIUM" ] && runs; then
    exit 0
  fi
  say "apt-get installed chromium, but $CHROMIUM does not run (see apt-get's output above)."
  exit 1
fi
say "$CHROMIUM is not there or does not run. The console's browser tests need Chromium there:\
 install it (Debian/Ubuntu: apt-get install chromium, as root; this script does that itself\
 when run as root), or set SVIR_CHROMIUM to a Chromium binary. Not running the tests."
exit 1
