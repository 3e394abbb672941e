# The portable stack from its image on one GPU (bench/transport/image_run.sh bg portable THIS): learning through
# the stack's default path (Unsloth loader, 4-bit base, fastgen rollouts, the embedded SmolLM2), the runtime
# probes, then the same recipe with Unsloth's own generation. $RUN, $O and $STASH come from image_run.sh.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUNS=$STASH/vol/rlstack-runs
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
learn() {  # ENGINE
  $RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name portable --engine "$1" \
    --work "/opt/rlstack/runs/learning-portable-$1" --out /opt/rlstack/runs/learning-out > "$O/learning-portable-$1.log" 2>&1
  step "learning-portable-$1 rc $?"; cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null
}
step start-portable
learn fastgen
$RUN -- probe --stack portable --gpu-arch sm_90 --layer runtime --json -o /opt/rlstack/runs/probe-portable-image.json \
  > "$O/probe-portable.log" 2>&1
step "probe-portable rc $?"; cp "$RUNS/probe-portable-image.json" "$O/" 2>/dev/null
learn own
step end-portable
