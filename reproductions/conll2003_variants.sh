#!/usr/bin/env bash
# Screening runs of BiLSTM-CRF variants on CoNLL-2003 English, scored on dev F1 only (test=false):
# a queue of "variant seed overrides..." lines, the overrides applied to experiment=$EXPERIMENT
# (default conll2003_bilstm_crf_cased, the recipe the search started from), run JOBS at a time,
# each at nice 19 with one torch thread, in $RUNS/<variant>_seed<seed>/ (Hydra run directory:
# Hydra's own log train.log, the console output in console.log, checkpoints/last.ckpt).
# Rerunning the same command resumes: finished runs (summary.json) are skipped, cut-off runs continue
# from their checkpoints/last.ckpt (train.py's resume=true), and a run that another copy of this
# script is training (its .lock is held) is left alone.
#
#   NEUROCRF_DATA=<corpora> RUNS=<runs dir> bash reproductions/conll2003_variants.sh [queue file]
#   (default queue: reproductions/conll2003_variants.txt, the runs of the search in docs/results.md)
#   RUNS=<runs dir> bash reproductions/conll2003_variants.sh --status     # Markdown table: epochs, dev F1
#
# At most JOBS runs train at once, counting those started by another copy of the script: to put a
# new queue first, stop the script and the runs to pause (they resume later), then start it again.
# Queue lines: `<variant> <seed> [hydra overrides...]`, `#` comments.
# Every run caps training at MAX_EPOCHS (default 30; the lr schedule lr / (1 + decay * epoch) does not
# depend on the cap, so a capped run is the start of a longer one and can be continued with
# `ckpt_path=<run>/checkpoints/last.ckpt trainer.max_epochs=40`).
# Everything is inside main(), which bash reads whole before running it: editing this file while
# it runs (for hours) cannot change what the running copy does.
main() {
set -u
cd "$(dirname "$0")/.."
RUNS=${RUNS:-logs/conll2003_variants}
JOBS=${JOBS:-2}
MAX_EPOCHS=${MAX_EPOCHS:-30}
PYTHON=${PYTHON:-python}
POLL=${POLL:-30}  # whole seconds between looks for a free slot
EXPERIMENT=${EXPERIMENT:-conll2003_bilstm_crf_cased}  # what the queue's overrides change

if [[ ${1:-} == --status ]]; then  # a Markdown table of the runs, read from their train.log
  exec "$PYTHON" - "$RUNS" <<'EOF'
import re, sys
from pathlib import Path

EPOCH = re.compile(r"epoch (\d+): ([\d.]+) s\b[^\n]*, val/f1 ([\d.]+)")  # epochs counted from 1
HIDDEN = {"experiment", "seed", "hydra.run.dir", "resume", "test", "trainer.max_epochs",
          "callbacks.progress_bar.refresh_rate"}
print("| run | overrides | epochs done | best dev F1 (epoch) | last dev F1 | s/epoch (last) | last.ckpt | finished |")
print("|---|---|--:|---|--:|--:|---|---|")
for run in sorted(p for p in Path(sys.argv[1]).iterdir() if (p / "train.log").is_file()):
    epochs = {int(m[1]): (float(m[2]), float(m[3])) for m in EPOCH.finditer((run / "train.log").read_text())}
    listed = run / ".hydra" / "overrides.yaml"
    overrides = [line[2:].strip() for line in listed.read_text().splitlines()] if listed.exists() else []
    shown = " ".join(o for o in overrides if o.split("=")[0] not in HIDDEN) or "(the experiment as it is)"
    if epochs:
        best = max(epochs, key=lambda e: (epochs[e][1], -e))
        last = max(epochs)
        scores = f"{100 * epochs[best][1]:.2f} ({best}) | {100 * epochs[last][1]:.2f} | {epochs[last][0]:.0f}"
    else:
        scores = "- | - | -"
    checkpoint = "yes" if (run / "checkpoints" / "last.ckpt").is_file() else "no"
    finished = "yes" if (run / "summary.json").is_file() else "no"
    print(f"| {run.name} | `{shown}` | {len(epochs)} | {scores} | {checkpoint} | {finished} |")
EOF
fi

queue=$(cat "${1:-reproductions/conll2003_variants.txt}" | sed -e 's/#.*//' -e '/^[[:space:]]*$/d')

run_one() {
  local variant=$1 seed=$2
  shift 2
  local dir="$RUNS/${variant}_seed${seed}"
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  if ! flock -n 9; then
    echo "$(date +%T) $variant seed $seed: running elsewhere, skipped"
    return
  fi
  if [[ -f $dir/summary.json ]]; then
    echo "$(date +%T) $variant seed $seed: finished"
    return
  fi
  echo "$(date +%T) $variant seed $seed: start ($dir)"
  nice -n 19 env OMP_NUM_THREADS=1 "$PYTHON" -m neurocrf.cli.train experiment="$EXPERIMENT" \
    seed="$seed" hydra.run.dir="$dir" resume=true test=false trainer.max_epochs="$MAX_EPOCHS" \
    callbacks.progress_bar.refresh_rate=0 "$@" >>"$dir/console.log" 2>&1
  echo "$(date +%T) $variant seed $seed: exit $?"
}

# runs in training now, by this copy of the script or another one (their .lock is held)
busy() {
  local count=0 lock
  for lock in "$RUNS"/*/.lock; do
    [[ -e $lock ]] || continue
    flock -n "$lock" true || count=$((count + 1))
  done
  echo "$count"
}

while read -r line; do
  while (($(busy) >= JOBS)); do
    sleep "$POLL"
  done
  set -f  # the overrides are words, with brackets ([a,b] lists) but never file patterns
  # shellcheck disable=SC2086
  run_one $line &
  set +f
  sleep "$(((POLL + 5) / 6))"  # the run takes its lock
done <<<"$queue"
wait
}

main "$@"
exit
