#!/usr/bin/env bash
# Reliability figures for the README.
#   bash scripts/reliability.sh          the CI part (sampled fault matrix, 4 kills, 200-load, fuzz, state machine)
#   bash scripts/reliability.sh slow     full matrix (31 positions), SIGTERM every 3rd position, 50 SIGKILLs, 1,000-load
#   bash scripts/reliability.sh mutation cosmic-ray over guard.py, decision.py, lifecycle.py (scripts/mutation.sh)
# PYTHON picks the interpreter (default .venv-newest/bin/python, built by tests/run.sh; else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv-newest/bin/python}
[ -x "$py" ] || py=python3
mode=${1:-ci}
report=$(mktemp /tmp/eventguard-reliability.XXXXXX.jsonl)
case "$mode" in
  mutation) shift; exec bash scripts/mutation.sh "$@" ;;
  slow) export EVENTGUARD_SLOW=1; selection=(tests/reliability/test_fault_matrix.py tests/reliability/test_sigterm.py tests/reliability/test_crash_recovery.py tests/reliability/test_load.py) ;;
  ci) selection=(tests/reliability) ;;
  *) echo "usage: $0 [ci|slow|mutation]"; exit 2 ;;
esac
started=$(date +%s)
rc=0
EVENTGUARD_RELIABILITY_REPORT=$report "$py" -m pytest -q -p no:cacheprovider "${selection[@]}" || rc=$?
echo "=== $mode: $(( $(date +%s) - started ))s, pytest exit $rc"
"$py" - "$report" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
m = [l for l in lines if l["part"] == "fault_matrix"]
if m:
    print(f"fault matrix: {sum(l['cases'] for l in m)} cases, {sum(l['violations'] for l in m)} violations, "
          f"{sum(l['known_bug_hits'] for l in m)} known-bug hits, {sum(l['host_divergences'] for l in m)} host divergences")
for l in lines:
    if l["part"] != "fault_matrix":
        print(" ".join(f"{k}={v}" for k, v in l.items()))
PY
exit $rc
