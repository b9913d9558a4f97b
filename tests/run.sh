#!/usr/bin/env bash
# Runs the test suite in virtual environments it builds itself (.venv-<mode>), installing everything
# from this project's files.
# Usage: bash tests/run.sh [MODE]... [-- extra pytest args]      (no MODE: oldest newest)
#   oldest, newest  the whole suite on that end of the supported upstream range (constraints/<end>.txt);
#                   newest also lints, type-checks and builds the API reference (.[test,docs]).
#   lowest          the whole suite with the lowest allowed version of every direct dependency, on the
#                   oldest upstream (constraints/lowest.txt): proves pyproject.toml's lower bounds.
#   releases        tests/upstream and tests/guard on every supported upstream release, each with the
#                   agent-framework-core and azure-ai-agentserver-responses of its date
#                   (constraints/releases/*.txt), one after the other in .venv-releases. Scheduled-style:
#                   not part of .ci/run. Ends with a table: release, passed, failed, skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
modes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do modes+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#modes[@]} -gt 0 ] || modes=(oldest newest)

pip_install() {  # venv constraints-file [extras]
  "$1/bin/python" -m pip install -q --disable-pip-version-check -c "$2" -e ".[${3:-test}]"
}

show_upstream() {
  "$1/bin/python" -m pip list 2>/dev/null | grep -iE '^(agent-framework-(core|foundry-hosting)|azure-ai-agentserver-responses) ' || true
}

new_venv() {
  [ -x "$1/bin/python" ] || "$python" -m venv "$1"
  "$1/bin/python" -m pip install -q --disable-pip-version-check -U pip
}

status=0
summary=()
for mode in "${modes[@]}"; do
  case "$mode" in
    oldest | newest | lowest)
      venv=".venv-$mode"
      echo "=== $mode ($(grep -v '^#' "constraints/$mode.txt" | tr '\n' ' '))"
      new_venv "$venv"
      if [ "$mode" = newest ]; then extras=test,docs; else extras=test; fi
      pip_install "$venv" "constraints/$mode.txt" "$extras"
      show_upstream "$venv"
      if [ "$mode" = newest ]; then
        "$venv/bin/ruff" check .
        "$venv/bin/mypy" eventguard
        # The API reference, warnings as errors (a docstring griffe cannot read, a name that does
        # not resolve); a few seconds.
        "$venv/bin/mkdocs" build --strict --quiet
      fi
      rc=0
      "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" || rc=$?
      # pytest's 5 means no test ran: that is a failure here, not a pass.
      if [ $rc -ne 0 ]; then status=$rc; echo "=== $mode: pytest exited $rc"; fi
      ;;
    releases)
      venv=".venv-releases"
      new_venv "$venv"
      for file in constraints/releases/*.txt; do
        release=$(basename "$file" .txt)
        echo "=== release $release ($(grep -v '^#' "$file" | tr '\n' ' '))"
        pip_install "$venv" "$file"
        show_upstream "$venv"
        rc=0
        log=$(mktemp)
        "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/upstream tests/guard "$@" 2>&1 | tee "$log" || rc=$?
        line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -n1 | tr -d '=' || true)
        rm -f "$log"
        summary+=("$release: ${line:-no summary} (exit $rc)")
        if [ "$rc" -ne 0 ]; then status=$rc; fi
      done
      echo "=== releases"
      printf '%s\n' "${summary[@]}"
      ;;
    *)
      echo "tests/run.sh: unknown mode $mode (oldest, newest, lowest, releases)" >&2
      exit 2
      ;;
  esac
done
exit $status
