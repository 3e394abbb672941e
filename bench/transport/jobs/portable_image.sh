# The portable stack from its image on one GPU (bench/transport/image_run.sh bg portable THIS), beside the fp8 job:
# learning through the stack's default path (Unsloth loader, fastgen rollouts, the embedded SmolLM2)
# and, at the same time, the same recipe with Unsloth's own generation and the runtime probes (the GPU is shared, so
# step times compare within this job, not with a run alone); once the fastgen run ends, the hand-off of its adapter,
# evaluated on the bf16 base in portable with transformers and in the fp8 image with vLLM, paired, while the slower
# own-generation run goes on. STEPS=learn: no probes; LEARN_STEPS=N: N GRPO steps instead of the recipe's.
# HARDER=1: once the fastgen run ends, the fastgen run again at the harder level (two-step problems, the held-out
# ones of the same level), beside the hand-off. SEED4BIT=N: then also the fastgen run in 4-bit (QLoRA) with
# grpo.seed=N: whether 4-bit runs with fastgen and with the own generation part by engine or by trajectory (the 4-bit
# base is right rarely, so its signal is sparse). SEEDS="1 2": from the start, also the bf16 own-generation and
# fastgen runs with each of these grpo.seed values: whether the two engines' tuned accuracies part by more than one
# engine's seeds part from each other. Runs beside each other share the GPU: their step times say so.
# $RUN, run_in, $O and $STASH come from image_run.sh; the fp8 image's tree was assembled by `image_run.sh assemble fp8`.
MODELS=(--bind "$STASH/fidelity/models:/models" --env RLSTACK_MODEL_CACHE=/models --env HF_HUB_OFFLINE=1
        --env TRANSFORMERS_OFFLINE=1)
RUNS=$STASH/vol/rlstack-runs
step() { echo "$(date +%s) $*" >> "$O/timeline"; }
keep() { cp "$RUNS"/learning-out/*.json "$RUNS"/learning-out/*.png "$O/" 2>/dev/null; }
learn() {  # ENGINE [NAME [--set K=V...]]; each run its own kernel cache (Unsloth writes its generated trainer code
  # there on the first run)
  local engine=$1 name=${2:-$1}; shift; shift || true
  $RUN "${MODELS[@]}" --env "RLSTACK_KERNEL_CACHE=/opt/rlstack/runs/kernel-cache-$name" --entrypoint python3 -- bench/learning.py --stack-name portable --engine "$engine" ${LEARN_STEPS:+--steps "$LEARN_STEPS"} \
    "$@" --work "/opt/rlstack/runs/learning-portable-$name" --out /opt/rlstack/runs/learning-out > "$O/learning-portable-$name.log" 2>&1
  step "learning-portable-$name rc $?"; keep
}
# the harder level of recipes/smollm2-gpu.toml (its header points here): two-step problems, held out at that level
TWO_STEP=(--set data.train=generated-two-step:4000 --set eval.data=generated-two-step:256)
step start-portable
probe() {  # beside the learning runs: the probes check what runs, not how fast (no vLLM in portable)
  $RUN -- probe --stack portable --gpu-arch sm_90 --layer runtime --json -o /opt/rlstack/runs/probe-portable-image.json \
    > "$O/probe-portable.log" 2>&1
  step "probe-portable rc $?"; cp "$RUNS/probe-portable-image.json" "$O/" 2>/dev/null
}
STAGGER=${STAGGER:-20}  # seconds between the starts: each process loads and compiles before the next one does
learn own & sleep "$STAGGER"
for seed in ${SEEDS:-}; do
  for engine in own fastgen; do learn "$engine" "$engine-seed$seed" --set "grpo.seed=$seed" & sleep "$STAGGER"; done
done
if [ "${STEPS:-all}" = all ]; then probe & sleep "$STAGGER"; fi
learn fastgen
handoff() {  # the fastgen run's adapter in portable (transformers) and in the fp8 image (vLLM), paired
  TUNED=$(cd "$RUNS" && ls -d learning-portable-fastgen/*/adapters/tuned 2>/dev/null | tail -1)
  if [ ! -f "$RUNS/$TUNED/manifest.json" ]; then step "handoff skipped: the fastgen run left no adapter"; return; fi
  ADAPTER=/opt/rlstack/runs/$TUNED
  $RUN "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name portable --adapter-from "$ADAPTER" \
    --backend hf --unquantized --work /opt/rlstack/runs/handoff --out /opt/rlstack/runs/learning-out \
    > "$O/handoff-portable.log" 2>&1
  step "handoff-portable rc $?"; keep
  HF=$(cd "$RUNS/learning-out" && ls -d learning-portable-handoff-hf-*/eval/results.json | tail -1)
  # the fp8 image may still be travelling or assembling when this job started first (`image_run.sh start fp8`
  # writes its spec once the tree is whole): wait for it, FP8_WAIT tens of seconds at most
  for _ in $(seq 1 "${FP8_WAIT:-90}"); do [ -f "$STASH/spec-fp8.json" ] && break; sleep 10; done
  if [ ! -f "$STASH/spec-fp8.json" ]; then step "handoff-fp8 skipped: the fp8 image was not assembled"; return; fi
  run_in fp8 "${MODELS[@]}" --entrypoint python3 -- bench/learning.py --stack-name fp8 --adapter-from "$ADAPTER" \
    --backend vllm --unquantized --pair-with "/opt/rlstack/runs/learning-out/$HF" --work /opt/rlstack/runs/handoff \
    --out /opt/rlstack/runs/learning-out > "$O/handoff-fp8.log" 2>&1
  step "handoff-fp8 rc $?"; keep
}
if [ -n "${HARDER:-}" ]; then learn fastgen fastgen-two-step "${TWO_STEP[@]}" & sleep "$STAGGER"; fi
if [ -n "${SEED4BIT:-}" ]; then
  learn fastgen "fastgen-4bit-seed$SEED4BIT" --set model.load_in_4bit=true --set "grpo.seed=$SEED4BIT" &
  sleep "$STAGGER"
fi
handoff
wait
step end-portable
