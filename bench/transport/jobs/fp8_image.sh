# The fp8 stack from its image on one GPU (bench/transport/image_run.sh bg fp8 THIS): the runtime probes, then
# learning through the stack's default path (Unsloth FP8 + vLLM rollouts) on the embedded SmolLM2 padded to
# 128-aligned widths (embedded:smollm2-135m-b128: Unsloth's FP8 blocks cannot split the original's 576/192-wide
# projections), converted by `image_run.sh models`. $RUN, $O and $STASH come from image_run.sh; each log lands in $O.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUNS=$STASH/vol/rlstack-runs
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
step start-fp8
if [ "${STEPS:-all}" = all ]; then
  $RUN -- probe --stack fp8 --gpu-arch sm_90 --layer runtime --json -o /opt/rlstack/runs/probe-fp8-image.json \
    > "$O/probe-fp8.log" 2>&1
  step "probe-fp8 rc $?"; cp "$RUNS/probe-fp8-image.json" "$O/" 2>/dev/null
fi
$RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name fp8 --fp8 --backend vllm \
  --set model.name=embedded:smollm2-135m-b128 --work /opt/rlstack/runs/learning-fp8 --out /opt/rlstack/runs/learning-out \
  > "$O/learning-fp8.log" 2>&1
step "learning-fp8 rc $?"; cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null
step end-fp8
