#!/usr/bin/env bash
# Mutation run (cosmic-ray) over the guard, its decision table and its state machine, killed by tests/guard.
# Runs in throw-away copies of the tree, never in the working tree (cosmic-ray edits files in place): one
# copy per worker (WORKERS, default: twice the number of cores, since the guard's tests spend much of their
# time waiting on timers), fed by cosmic-ray's http distributor. DISTRIBUTOR=local runs the mutants one after
# the other in a single copy with cosmic-ray's local distributor instead (WORKERS is then ignored): slower,
# but it has no HTTP request that can time out under load, so every mutant gets a verdict.
# Mutants inside annotations that Python never evaluates are marked skipped first
# (scripts/cr_skip_annotations.py); docs/mutation.md counts them as equivalent.
# Usage: bash scripts/mutation.sh [module.py ...]
#   (default: eventguard/decision.py eventguard/lifecycle.py and the modules of eventguard/guard/)
# PYTHON: the interpreter that runs the tests (default .venv-newest's); CR_BIN: the bin directory that
# holds cosmic-ray (default: PYTHON's own, where it is installed if missing). A separate CR_BIN keeps
# cosmic-ray's own dependencies out of the project's environment. TIMEOUT: seconds per mutant (default
# 30); cosmic-ray counts a timeout as a kill, so keep it well above the baseline's time, which is printed.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
py=${PYTHON:-$src/.venv-newest/bin/python}
bin=${CR_BIN:-$(dirname "$py")}
[ -x "$bin/cosmic-ray" ] || "$bin/python" -m pip install -q cosmic-ray
workers=${WORKERS:-$(( 2 * $(nproc) ))}
distributor=${DISTRIBUTOR:-http}
case "$distributor" in
  http) ;;
  local) workers=1 ;;  # copy 1 only runs the baseline: the local distributor mutates copy 0, where it runs.
  *) echo "DISTRIBUTOR must be http or local, not $distributor" >&2; exit 2 ;;
esac
modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=(eventguard/decision.py eventguard/lifecycle.py eventguard/guard/core.py
  eventguard/guard/referee.py eventguard/guard/watchdog.py eventguard/guard/inner.py eventguard/guard/host.py
  eventguard/guard/options.py eventguard/guard/flush.py eventguard/guard/loop.py)
work=$(mktemp -d /tmp/eventguard-mutation.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

urls=()
for i in $(seq 0 "$workers"); do
  # Copy 0 is where the session is planned; copies 1..N are the workers' trees.
  mkdir -p "$work/w$i"
  cp -r "$src/eventguard" "$src/tests" "$src/pyproject.toml" "$work/w$i/"
  # The copy must be what the tests import (not the editable install).
  (cd "$work/w$i" && "$py" -c 'import eventguard, sys; assert eventguard.__file__.startswith(sys.argv[1]), eventguard.__file__' "$work/w$i")
  [ "$i" -eq 0 ] || [ "$distributor" = local ] && continue
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  (cd "$work/w$i" && exec "$bin/cosmic-ray" http-worker --port "$port" > "$work/worker-$i.log" 2>&1) &
  pids+=($!)
  urls+=("'http://127.0.0.1:$port'")
done
cd "$work/w0"
status=0
for module in "${modules[@]}"; do
  name=$(basename "$module" .py)
  # The killers, in two stages, each run with pytest -x: first the tests that import neither the openai
  # SDK nor hypothesis (the module's own tests first), then those two files. A mutant's run stops at its
  # first failure, and most mutants die in the first stage without paying for the heavy imports.
  own=tests/guard/test_$name.py
  case "$module" in eventguard/guard/*)
    own="tests/guard/test_every_fault_at_every_position.py tests/guard/test_properties.py tests/guard/test_closing.py \
tests/guard/test_watchdog.py tests/guard/test_endings.py tests/guard/test_bad_input.py" ;;
  esac
  fast="$own $(cd "$work/w0" && ls tests/guard/test_*.py | grep -v -e openai -e lifecycle_properties | grep -vxF -f <(tr ' ' '\n' <<< "$own") | tr '\n' ' ')"
  slow="tests/guard/test_openai_stream.py tests/guard/test_lifecycle_properties.py"
  killers="$py -m pytest -x -q -p no:cacheprovider -p no:hypothesispytest $fast && $py -m pytest -x -q -p no:cacheprovider $slow"
  cat > "cr-$name.toml" <<TOML
[cosmic-ray]
module-path = "$module"
timeout = ${TIMEOUT:-30}.0
excluded-modules = []
test-command = "bash -c '$killers'"

[cosmic-ray.distributor]
name = "$distributor"
TOML
  [ "$distributor" = local ] || cat >> "cr-$name.toml" <<TOML

[cosmic-ray.distributor.http]
worker-urls = [$(IFS=,; echo "${urls[*]}")]
TOML
  "$bin/cosmic-ray" init "cr-$name.toml" "cr-$name.sqlite" --force
  "$bin/python" "$src/scripts/cr_skip_annotations.py" "cr-$name.sqlite"
  # The unmutated tree must pass, or every mutant would count as killed.
  started=$(date +%s)
  (cd "$work/w1" && bash -c "$killers" > /dev/null) \
    || { echo "baseline failed for $module"; status=1; continue; }
  echo "=== $module: baseline (every killer, unmutated) $(( $(date +%s) - started ))s; timeout ${TIMEOUT:-30}s"
  started=$(date +%s)
  "$bin/cosmic-ray" exec "cr-$name.toml" "cr-$name.sqlite"
  echo "=== $module: $(( $(date +%s) - started ))s with the $distributor distributor ($workers workers)"
  "$bin/cr-report" "cr-$name.sqlite" --show-pending | tail -n 4
  "$bin/cr-report" "cr-$name.sqlite" > "$work/report-$name.txt" || true
  echo "survivors of $module (full report: $work/report-$name.txt):"
  "$bin/cr-report" "cr-$name.sqlite" | grep -B1 -A0 "SURVIVED" | grep -v '^--$' || true
done
echo "work dir: $work"
exit $status
