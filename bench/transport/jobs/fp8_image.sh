# The fp8 stack from its image on one GPU (bench/transport/image_run.sh bg fp8 THIS): FlashInfer's JIT cold start,
# learning through the stack's default path (Unsloth FP8 + vLLM, the embedded SmolLM2), the runtime probes.
# $RUN, $O and $STASH come from image_run.sh; every step's log lands in $O.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUNS=$STASH/vol/rlstack-runs
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
step start
$RUN --entrypoint python3 -- bench/jit_cold_start.py --out /opt/rlstack/runs/jit_cold_start.json > "$O/jit.log" 2>&1
step "jit rc $?"; cp "$RUNS/jit_cold_start.json" "$O/" 2>/dev/null
$RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name fp8 --fp8 --backend vllm \
  --work /opt/rlstack/runs/learning-fp8 --out /opt/rlstack/runs/learning-out > "$O/learning-fp8.log" 2>&1
step "learning-fp8 rc $?"; cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null
$RUN -- probe --stack fp8 --gpu-arch sm_90 --layer runtime --json -o /opt/rlstack/runs/probe-fp8-image.json \
  > "$O/probe.log" 2>&1
step "probe rc $?"; cp "$RUNS/probe-fp8-image.json" "$O/" 2>/dev/null
step end
