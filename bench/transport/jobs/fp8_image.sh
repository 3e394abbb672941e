# The fp8 stack from its image on one GPU (bench/transport/image_run.sh bg fp8 THIS): learning through the stack's
# default path (Unsloth FP8 + vLLM rollouts) on the embedded SmolLM2 padded to 128-aligned widths
# (embedded:smollm2-135m-b128: Unsloth's FP8 blocks cannot split the original's 576/192-wide projections), converted
# by `image_run.sh models`; then which compiler FlashInfer's JIT ran (its build.ninja files in the kernel-cache
# volume); then the runtime probes unless STEPS=learn. LEARN_STEPS=N: N GRPO steps instead of the recipe's. The
# portable job may share the GPU meanwhile (its records say so). $RUN, $O and $STASH come from image_run.sh; each log lands in $O.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUNS=$STASH/vol/rlstack-runs
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
step start-fp8
$RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name fp8 --fp8 --backend vllm ${LEARN_STEPS:+--steps "$LEARN_STEPS"} \
  --set model.name=embedded:smollm2-135m-b128 --work /opt/rlstack/runs/learning-fp8 --out /opt/rlstack/runs/learning-out \
  > "$O/learning-fp8.log" 2>&1
step "learning-fp8 rc $?"; cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null
# FlashInfer writes one build.ninja per JIT module; its nvcc line names the compiler that ran
find "$STASH/vol/rlstack-kernel-cache" -name build.ninja -exec grep -H -m1 -E "^nvcc|nvcc =" {} + \
  > "$O/flashinfer-nvcc.txt" 2>&1
step "flashinfer modules $(wc -l < "$O/flashinfer-nvcc.txt")"
if [ "${STEPS:-all}" = all ]; then
  $RUN -- probe --stack fp8 --gpu-arch sm_90 --layer runtime --json -o /opt/rlstack/runs/probe-fp8-image.json \
    > "$O/probe-fp8.log" 2>&1
  step "probe-fp8 rc $?"; cp "$RUNS/probe-fp8-image.json" "$O/" 2>/dev/null
fi
step end-fp8
