# The portable stack from its image on one GPU (bench/transport/image_run.sh bg portable THIS), after the fp8 job
# has let the GPU go: learning through the stack's default path (Unsloth loader, 4-bit base, fastgen rollouts, the
# embedded SmolLM2), the runtime probes, the hand-off of its adapter (evaluated on the bf16 base in portable with
# transformers and in the fp8 image with vLLM, paired), then the same recipe with Unsloth's own generation.
# $RUN, $O and $STASH come from image_run.sh; the fp8 image's tree was assembled by `image_run.sh assemble fp8`.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUN_FP8="${RUN//root-portable/root-fp8}"; RUN_FP8="${RUN_FP8//spec-portable/spec-fp8}"
RUNS=$STASH/vol/rlstack-runs ADAPTER=/opt/rlstack/runs/learning-portable-fastgen/adapters/tuned
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
keep() { cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null; }
learn() {  # ENGINE
  $RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name portable --engine "$1" \
    --work "/opt/rlstack/runs/learning-portable-$1" --out /opt/rlstack/runs/learning-out > "$O/learning-portable-$1.log" 2>&1
  step "learning-portable-$1 rc $?"; keep
}
while [ ! -f "$O/job-fp8.rc" ]; do sleep 5; done  # vLLM runs alone on the GPU
step start-portable
learn fastgen
$RUN -- probe --stack portable --gpu-arch sm_90 --layer runtime --json -o /opt/rlstack/runs/probe-portable-image.json \
  > "$O/probe-portable.log" 2>&1
step "probe-portable rc $?"; cp "$RUNS/probe-portable-image.json" "$O/" 2>/dev/null
$RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name portable --adapter-from "$ADAPTER" \
  --backend hf --unquantized --work /opt/rlstack/runs/handoff --out /opt/rlstack/runs/learning-out \
  > "$O/handoff-portable.log" 2>&1
step "handoff-portable rc $?"; keep
HF=$(cd "$RUNS/learning-out" && ls -d learning-portable-handoff-hf-*/eval/results.json | tail -1)
$RUN_FP8 "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name fp8 --adapter-from "$ADAPTER" \
  --backend vllm --unquantized --pair-with "/opt/rlstack/runs/learning-out/$HF" --work /opt/rlstack/runs/handoff \
  --out /opt/rlstack/runs/learning-out > "$O/handoff-fp8.log" 2>&1
step "handoff-fp8 rc $?"; keep
learn own
step end-portable
