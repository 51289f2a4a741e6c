#!/usr/bin/env bash
# Soak check of the multi-process paths (training, evaluation, sharded prediction on one or several nodes): runs every DDP
# test of the suite N times (default 50), each time in a fresh pytest process, and prints
# "N passed, M failed".
#
#   bash tools/soak_ddp.sh 50                  # the DDP tests, 50 times
#   SOAK_LOG=soak.log bash tools/soak_ddp.sh 5  # keep each failing run's output in soak.log
#
# A run fails on any test failure, including a worker that aborts at exit (SIGABRT): no test of
# the project retries. The slow multi-process tests are included (-m "not gpu").
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-50}"
log="${SOAK_LOG:-/dev/null}"
tests=(tests/models/test_ddp.py tests/cli/test_train.py tests/inference/test_sharded.py tests/inference/test_nodes.py
       tests/cli/test_signals.py)
selection="ddp or process_group or two_processes or nodes or stopped_resumable"
passed=0
failed=0
for ((i = 1; i <= runs; i++)); do
  if output="$(OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider -m "not gpu" -k "$selection" "${tests[@]}" 2>&1)"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    printf 'run %d failed:\n%s\n\n' "$i" "$output" >> "$log"
  fi
  printf 'run %d of %d: %d passed, %d failed\n' "$i" "$runs" "$passed" "$failed" >&2
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
