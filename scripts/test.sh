#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine, then runs linters and the tests.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  need_apt+=(postgresql)
fi
command -v node >/dev/null 2>&1 || need_apt+=(nodejs npm)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # the dashboard test renders the page headless
command -v strace >/dev/null 2>&1 || need_apt+=(strace)  # the fault harness injects EROFS into SQLite writes (tests/chaos)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages: ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing system packages (install them first): ${need_apt[*]}" >&2
    exit 1
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
if [ -f services/emulators/package.json ]; then
  npm ci --prefix services/emulators --no-audit --no-fund --loglevel=error >/dev/null
fi

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"
set +e
# Two processes by default (the suite mostly waits on intervals and emulators); a module's tests stay in one
# process (--dist loadfile) so module fixtures start once. SHARDHERD_TEST_PROCESSES=0 runs them in this process.
# The 25 slowest tests are listed at the end: CI has a 30-minute budget.
.venv/bin/python -m pytest -n "${SHARDHERD_TEST_PROCESSES:-2}" --dist loadfile --durations=25 "$@"
status=$?
set -e
if [ $status -eq 5 ]; then
  echo "pytest collected no tests"; exit 0
fi
exit $status
