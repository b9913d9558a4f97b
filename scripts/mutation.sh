#!/usr/bin/env bash
# Mutation run (cosmic-ray) over the guard's decision table and state machine, killed by tests/guard.
# Runs in a throw-away copy of the tree, never in the working tree (cosmic-ray edits files in place).
# Usage: bash scripts/mutation.sh [module.py ...]   (default: eventguard/decision.py eventguard/lifecycle.py)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
py=${PYTHON:-.venv-newest/bin/python}
cr="$(dirname "$py")/cosmic-ray"
[ -x "$cr" ] || "$py" -m pip install -q cosmic-ray
modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=(eventguard/decision.py eventguard/lifecycle.py)
work=$(mktemp -d /tmp/eventguard-mutation.XXXXXX)
cp -r "$src/eventguard" "$src/tests" "$src/pyproject.toml" "$work/"
cd "$work"
# The copy must be what the tests import (not the editable install).
"$py" -c 'import eventguard, sys; assert eventguard.__file__.startswith(sys.argv[1]), eventguard.__file__' "$work"
status=0
for module in "${modules[@]}"; do
  name=$(basename "$module" .py)
  cat > "cr-$name.toml" <<TOML
[cosmic-ray]
module-path = "$module"
timeout = 60.0
excluded-modules = []
test-command = "$py -m pytest -x -q -p no:cacheprovider -p no:randomly tests/guard"

[cosmic-ray.distributor]
name = "local"
TOML
  "$cr" init "cr-$name.toml" "cr-$name.sqlite" --force
  "$cr" baseline "cr-$name.toml" || { echo "baseline failed for $module"; status=1; continue; }
  started=$(date +%s)
  "$cr" exec "cr-$name.toml" "cr-$name.sqlite"
  echo "=== $module: $(( $(date +%s) - started ))s"
  "$(dirname "$py")/cr-report" "cr-$name.sqlite" --show-pending | tail -n 4
  "$(dirname "$py")/cr-report" "cr-$name.sqlite" > "$work/report-$name.txt" || true
  echo "survivors of $module (full report: $work/report-$name.txt):"
  "$(dirname "$py")/cr-report" "cr-$name.sqlite" | grep -B1 -A0 "SURVIVED" | grep -v '^--$' || true
done
echo "work dir: $work"
exit $status
