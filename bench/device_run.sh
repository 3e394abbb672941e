#!/usr/bin/env bash
# Install carried wheels on the device machine (no network there) and run the given benchmark steps.
# Usage: bash bench/device_run.sh STEP... where STEP is gputest | rollout | grpo | eval | <any shell command>.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/nvidia_smi.txt"
for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case "$step" in
    gputest) timeout 240 python3 -m pytest -q -m gpu tests/payload/gpu -p no:cacheprovider 2>&1 | tail -15 ;;
    rollout*) timeout "${ROLLOUT_TIMEOUT:-420}" python3 bench/rollout_generation.py ${ROLLOUT_ARGS:-} \
                > "$OUT/rollout.log" 2>&1; tail -c 3000 "$OUT/rollout.log" ;;
    grpo*) timeout "${GRPO_TIMEOUT:-480}" python3 bench/grpo_step.py ${GRPO_ARGS:-} > "$OUT/grpo.log" 2>&1;
           tail -c 3000 "$OUT/grpo.log" ;;
    eval*) timeout "${EVAL_TIMEOUT:-240}" python3 bench/eval_throughput.py ${EVAL_ARGS:-} > "$OUT/eval.log" 2>&1;
           tail -c 2500 "$OUT/eval.log" ;;
    *) bash -c "$step" ;;
  esac
done
echo "=== done $(date -u +%T)"
