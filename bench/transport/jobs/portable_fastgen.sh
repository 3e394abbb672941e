# Portable's default path alone on the GPU (Unsloth loader, 4-bit base, fastgen rollouts, the embedded SmolLM2) from
# its image: the learning run without its side-by-side peers. $RUN, $O, $STASH come from image_run.sh.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUNS=$STASH/vol/rlstack-runs
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
step start-portable-fastgen
$RUN "${MODELS[@]}" --env RLSTACK_KERNEL_CACHE=/opt/rlstack/runs/kernel-cache-fastgen2 --entrypoint python3 -- \
  bench/learning.py --stack-name portable --engine fastgen --work /opt/rlstack/runs/learning-portable-fastgen2 \
  --out /opt/rlstack/runs/learning-out > "$O/learning-portable-fastgen2.log" 2>&1
step "learning-portable-fastgen2 rc $?"; cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null
step end-portable-fastgen
