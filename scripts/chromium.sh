#!/usr/bin/env bash
# The browser the console's tests drive (tests/console/test_browser.py): Debian's Chromium, run
# headless by Playwright (which downloads no browser of its own). `make test` runs this first: a
# Chromium that runs is kept; a missing one is installed with apt-get when this is root on a
# machine with apt; otherwise what to install is named and the script exits 1, so that `make test`
# stops here rather than in failed browser tests.
#
# SVIR_CHROMIUM names the binary (default /usr/bin/chromium, as the tests use); the tests of this
# script (tests/test_setup_scripts.py) point it and PATH elsewhere.
set -u
CHROMIUM=${SVIR_CHROMIUM:-/usr/bin/chromium}

say() { printf 'chromium: %s\n' "$*" >&2; }

runs() { "$CHROMIUM" --headless --no-sandbox --version >/dev/null 2>&1; }

if [ -x "$CHROMIUM" ] && runs; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  say "installing Debian's chromium for the console's browser tests (apt-get install chromium)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2; then
    # A machine whose package lists are stale or empty: refresh them once and try again.
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2
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
