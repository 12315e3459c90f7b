#!/usr/bin/env bash
# The README's test command (its pytest part) with two CPU-bound processes beside it, so
# that a test which only passes on an idle machine fails here. On the 2-core machine
# this is the suite with the cores oversubscribed about 2.5 times.
#
#   tests/stress.sh [REPEATS] [-- PYTEST_ARGS...]
#
# REPEATS (default 1): run it that many times in a row, stopping at the first failure.
# PYTEST_ARGS replace the default test selection (e.g. tests/e2e/test_cli_tenants.py).
# Prints each run's wall time; exits with pytest's status.
set -uo pipefail
cd "$(dirname "$0")/.."

repeats=1
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  repeats=$1
  shift
fi
[[ ${1:-} == "--" ]] && shift

hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do
    kill "$pid" 2>/dev/null
  done
  wait "${hogs[@]}" 2>/dev/null
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do
  python3 -c 'while True: pass' &
  hogs+=($!)
done
echo "stress: two CPU-bound processes (${hogs[*]}) beside the suite, $repeats run(s)"

status=0
for run in $(seq 1 "$repeats"); do
  started_ms=$(($(date +%s%N) / 1000000))
  .venv/bin/pytest -q -n 6 "$@"  # as the README's test command
  status=$?
  ms=$(($(date +%s%N) / 1000000 - started_ms))
  printf 'stress: run %d of %d: exit %d, %d.%d s wall\n' \
    "$run" "$repeats" "$status" $((ms / 1000)) $((ms % 1000 / 100))
  [[ $status -eq 0 ]] || break
done
exit "$status"
