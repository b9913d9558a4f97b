#!/usr/bin/env bash
# Runs the whole test suite against both ends of the supported upstream range, each in its own
# virtual environment (.venv-oldest, .venv-newest), installing everything from this project's files.
# Usage: bash tests/run.sh [oldest|newest]... [-- extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
ends=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do ends+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#ends[@]} -gt 0 ] || ends=(oldest newest)

status=0
for end in "${ends[@]}"; do
  venv=".venv-$end"
  echo "=== upstream: $end ($(grep -v '^#' "constraints/$end.txt" | tr '\n' ' '))"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -U pip
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "constraints/$end.txt" -e ".[test]"
  "$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(agent-framework-(core|foundry-hosting)|azure-ai-agentserver-responses) ' || true
  if [ "$end" = newest ]; then
    "$venv/bin/ruff" check .
    "$venv/bin/mypy" eventguard
  fi
  rc=0
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" || rc=$?
  # pytest's 5 means no test ran: that is a failure here, not a pass.
  if [ $rc -ne 0 ]; then status=$rc; echo "=== $end: pytest exited $rc"; fi
done
exit $status
