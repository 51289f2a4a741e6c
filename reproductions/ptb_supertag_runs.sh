#!/usr/bin/env bash
# Supertagger runs on the Penn Treebank sample (configs/experiment/ptb_supertagger_<encoder>.yaml),
# one after the other, each in $RUNS_DIR/<encoder>_seed<N>/ (log: train.log there):
#
#   RUNS_DIR=../runs/ptb reproductions/ptb_supertag_runs.sh bilstm:1 bilstm:2 bilstm:3 minilm:3
#   RUNS_DIR=../runs/ptb nohup reproductions/ptb_supertag_runs.sh minilm:1 minilm:2 > lane2.log 2>&1 &
#
# A run whose test split has been parsed (parse_test_report.json) is skipped; a run with a
# checkpoints/last.ckpt resumes from it; run the same command again to continue after a stop.
# THREADS (default 1) sets the CPU threads per run, PYTHON the interpreter (default python);
# further Hydra overrides can go in EXTRA (e.g. EXTRA="trainer=gpu").
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS_DIR=${RUNS_DIR:-runs/ptb}
mkdir -p "$RUNS_DIR"
RUNS_DIR=$(cd "$RUNS_DIR" && pwd)
PYTHON=${PYTHON:-python}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [ $# -eq 0 ]; then
    echo "usage: RUNS_DIR=<folder> $0 <encoder>:<seed> ... (encoder: bilstm or minilm)" >&2
    exit 2
fi
for item in "$@"; do
    encoder=${item%%:*}
    seed=${item#*:}
    if [ ! -f "$ROOT/configs/experiment/ptb_supertagger_$encoder.yaml" ] || [ -z "$seed" ] || [ "$seed" = "$item" ]; then
        echo "bad run $item: expected <encoder>:<seed> with configs/experiment/ptb_supertagger_<encoder>.yaml" >&2
        exit 2
    fi
    run="$RUNS_DIR/${encoder}_seed$seed"
    if [ -f "$run/parse_test_report.json" ]; then
        echo "$(date -u +%FT%TZ) $run: done, skipped"
        continue
    fi
    mkdir -p "$run"
    resume=()
    if [ -f "$run/checkpoints/last.ckpt" ]; then
        resume=("ckpt_path=$run/checkpoints/last.ckpt")
    fi
    echo "$(date -u +%FT%TZ) $run: start${resume:+ (resume)}"
    # shellcheck disable=SC2086  # EXTRA holds several overrides
    "$PYTHON" -m neurocrf.cli.supertag_train "experiment=ptb_supertagger_$encoder" "seed=$seed" \
        "hydra.run.dir=$run" "${resume[@]}" ${EXTRA:-} >> "$run/train.log" 2>&1
    echo "$(date -u +%FT%TZ) $run: finished"
done
