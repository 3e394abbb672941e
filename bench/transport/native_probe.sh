#!/usr/bin/env bash
# The runtime probes of a stack, natively on a GPU host with no Docker and no network (the device machine),
# from wheels staged by `invoke native-stage` and carried in parts. Parts survive between calls in
# $STASH while the machine stays warm.
#   bash bench/transport/native_probe.sh stash STACK          copy the carried .stage/STACK/{part-*,parts.json} to $STASH/STACK
#   bash bench/transport/native_probe.sh run STACK            install the parts (once), run the runtime layer, report to $OUT
#                                                   (in one call: a cold fp8 machine needs longer, use probe)
#   bash bench/transport/native_probe.sh probe STACK [ARGS]   the same in the background (ARGS: e.g. --runtime-probes
#                                                   grpo-step), then `wait STACK` calls bring the report and logs:
#                                                   fp8's cold runtime layer took 845 s on 2026-12-04
#   bash bench/transport/native_probe.sh one STACK PROBE      one probe body alone (env passes through: controls, diagnosis)
#   bash bench/transport/native_probe.sh py STACK ARGS...     python3 ARGS with the stack's wheels first on the path
#                                                   (e.g. bench/gpu_stacks.py train --stack STACK)
#   bash bench/transport/native_probe.sh bg STACK ARGS...     the same, detached: for a run longer than one device call (a
#                                                   cold fp8 train took 567 s and more, the call limit is 600 s),
#                                                   from its own copy of the tree ($STASH/bg-STACK/tree)
#   bash bench/transport/native_probe.sh wait STACK [S]       wait up to S s (default 560) for it; when it has ended, its exit
#                                                   code, and what it wrote under its own $OUT copied to this $OUT
#   bash bench/transport/native_probe.sh cache STACK           the carried kernel cache alone: stashed and unpacked (for jobs
#                                                   that install their own wheels: fastgen_fidelity_device.sh)
#   bash bench/transport/native_probe.sh keep-cache STACK [N] [DIR...]
#                                                   the kernels this machine compiled ($RLSTACK_KERNEL_CACHE, or
#                                                   its DIRs), packed for the next lease: call N (0, 1, ...) brings
#                                                   the manifest and chunks 3N..3N+2 (15 MiB each) to $OUT. Here:
#                                                   put them in .stage/kernel-cache/STACK/; the next lease's stash
#                                                   (carry that folder) copies them, and install unpacks them once
#                                                   (checked against the manifest and the lock) after the wheels,
#                                                   which it dates back (see restore_cache)
# Full logs of every probe go into $OUT/logs-STACK.tgz (the report keeps their tails).
set -u
cmd=${1:?stash, run, one, py, probe, bg, wait, cache or keep-cache}; stack=${2:?stack}; shift 2
STASH=${STASH:-/root/stash}; OUT=${OUT:-/tmp/out}; SITE=${SITE:-/tmp/site-$stack}; LOGS=/tmp/probe-logs-$stack
mkdir -p "$STASH/$stack" "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RLSTACK_PROBE_LOGDIR=$LOGS
# compiled kernels (FlashInfer's nvcc JIT, Triton, torch.compile, Unsloth) kept beside the parts, which outlive a
# call while the machine stays warm; without it FlashInfer's ~200 s of JIT repeats in every call
export RLSTACK_KERNEL_CACHE=${RLSTACK_KERNEL_CACHE:-$STASH/kernel-cache-$stack}
install() { install_site; restore_cache; }
install_site() {
  [ -f "$SITE/.rlstack-native.json" ] && { echo "installed already: $SITE"; return 0; }
  # SITE_READY=1: the caller filled $SITE itself (fastgen_fidelity_device.sh: a few wheels, not a stack's parts)
  [ "${SITE_READY:-}" = 1 ] && [ -d "$SITE" ] && return 0
  local t0; t0=$(date +%s)
  PYTHONPATH=$PWD/src python3 -m rlstack.scripts.native_install install --parts "$STASH/$stack" --target "$SITE" || exit 1
  echo "install: $(( $(date +%s) - t0 )) s"
}
lock12() {  # the first 12 hex digits of the staged lock's hash (parts.json), "nolock" without one
  python3 -c "import json,sys
try: print(json.load(open(sys.argv[1]))['lock_hash'][:12])
except (OSError, KeyError, ValueError): print('nolock')" "$STASH/$stack/parts.json"
}
# Why carry compiled kernels between leases: every lease starts a bare machine, and a cold vLLM start of the fp8
# stack spent ~100 s of device time in FlashInfer's nvcc JIT and 65 s in torch.compile (8.8 s warm), every lease.
# Times matter to one of them: FlashInfer runs ninja on every load, and ninja rebuilds an output older than an
# input (sources and headers, many in the wheels just installed) or whose mtime in .ninja_log is. So the chunks
# keep their files' times to the nanosecond (pax), and the installed wheels are dated back to 2001 before
# unpacking: older than anything compiled from them. (torch.compile's, Triton's and vLLM's caches go by hashes.)
restore_cache() {
  local src=$STASH/kc-in-$stack man lock
  man=$(ls "$src"/kc-"$stack"-*.sha256 2>/dev/null | head -1)
  [ -n "$man" ] || return 0
  [ -f "$RLSTACK_KERNEL_CACHE/.rlstack-restored" ] && return 0
  lock=$(lock12)
  case "${man##*/}" in
    kc-"$stack"-"$lock".sha256) ;;
    *) echo "kernel cache not used: ${man##*/} is of another lock than this one ($lock)"; return 0 ;;
  esac
  (cd "$src" && sha256sum -c --quiet "${man##*/}") > /dev/null 2>&1 || {
    echo "kernel cache not used: chunks missing or damaged (carry .stage/kernel-cache/$stack again):" \
      "$(cd "$src" && sha256sum -c "${man##*/}" 2>&1 | grep -v ': OK$' | cut -d: -f1 | tr '\n' ' ')"
    return 0; }
  mkdir -p "$RLSTACK_KERNEL_CACHE"
  local unpack=gzip; case "$(head -1 "$man")" in *.xz.*) unpack=xz ;; esac
  local t0; t0=$(date +%s)
  [ -d "$SITE" ] && find "$SITE" -exec touch -h -d @978307200 {} +
  # the chunks in the manifest's order (cat of a glob would sort kc-...-10 before kc-...-2 past 1,000 chunks)
  (set -o pipefail; cd "$src" && cat $(awk '{print $2}' "${man##*/}") | "$unpack" -dc \
    | tar -C "$RLSTACK_KERNEL_CACHE" -xf -) || { echo "kernel cache not used: unpacking failed" >&2; return 0; }
  touch "$RLSTACK_KERNEL_CACHE/.rlstack-restored"
  echo "kernel cache restored from ${man##*/}: $(du -sh "$RLSTACK_KERNEL_CACHE" | cut -f1) in $(( $(date +%s) - t0 )) s"
}
copy_new() {  # copy_new DEST FILE...: the files DEST lacks, or holds at another size (a stale one of another lock)
  # why not all: the device keeps earlier calls' carried files in the tree, and copying them all again made each
  # call ~0.1 s longer per part stashed (3.3 s at part 44, 2026-12-04)
  local dest=$1 f; shift
  mkdir -p "$dest" || return 1
  for f in "$@"; do
    [ "$(stat -c %s "$f")" = "$(stat -c %s "$dest/${f##*/}" 2>/dev/null)" ] || cp "$f" "$dest/" || return 1
  done
}
stash_cache() {  # compiled kernels of an earlier lease (keep-cache), where they were carried too
  ls .stage/kernel-cache/"$stack"/kc-* > /dev/null 2>&1 || return 0
  copy_new "$STASH/kc-in-$stack" .stage/kernel-cache/"$stack"/kc-*
}
cache_state() {  # "; kernel cache NAME[, missing: CHUNKS]" where one was stashed, else nothing
  local man absent
  man=$(ls "$STASH/kc-in-$stack"/kc-"$stack"-*.sha256 2>/dev/null | head -1)
  [ -n "$man" ] || return 0
  absent=$(awk '{print $2}' "$man" | while read -r c; do [ -f "$STASH/kc-in-$stack/$c" ] || printf '%s ' "$c"; done)
  echo "; kernel cache ${man##*/}${absent:+, missing: ${absent% }}"
}
pack_logs() { tar -C "$LOGS" -czf "$OUT/logs-$stack.tgz" . ; }
case "$cmd" in
  stash)
    copy_new "$STASH/$stack" .stage/"$stack"/part-* || exit 1  # only the parts not stashed yet
    cp .stage/"$stack"/parts.json "$STASH/$stack/" || exit 1
    stash_cache || exit 1
    have=$(ls "$STASH/$stack" | grep -c '^part-')
    # the parts not here yet (or of another size: a stale part of another lock), by name: a machine released
    # between two calls (idle > 30 s) starts empty, and the parts carried before are gone; this says which to
    # carry again
    missing=$(python3 -c "import json,os,sys;d=sys.argv[1];f=lambda p:os.path.join(d,p['name'])
print(' '.join(p['name'] for p in json.load(open(os.path.join(d,'parts.json')))['parts'] if not os.path.exists(f(p))
      or os.path.getsize(f(p)) != p.get('size', os.path.getsize(f(p)))))" "$STASH/$stack")
    echo "stash $stack: $have parts here${missing:+; missing: $missing}$(cache_state)" ;;
  cache)
    # the kernel cache alone, for a job that installs its own wheels (fastgen_fidelity_device.sh)
    stash_cache || exit 1
    echo "kernel cache of $stack${RLSTACK_KERNEL_CACHE:+ at $RLSTACK_KERNEL_CACHE}$(cache_state)"
    restore_cache ;;
  keep-cache)
    group=${1:-0}; shift $(( $# > 0 ? 1 : 0 ))
    case "$group" in *[!0-9]*|'') echo "keep-cache $stack N [DIR...]: N is a call number (0, 1, ...)" >&2; exit 2 ;; esac
    [ -d "$RLSTACK_KERNEL_CACHE" ] || { echo "no kernel cache at $RLSTACK_KERNEL_CACHE: nothing compiled here yet" >&2; exit 2; }
    lock=$(lock12); PK=$STASH/kc-out-$stack; name=kc-$stack-$lock
    if [ "$group" = 0 ] || [ ! -f "$PK/$name.sha256" ]; then
      rm -rf "$PK"; mkdir -p "$PK"
      (cd "$RLSTACK_KERNEL_CACHE" && du -sh -- * */* 2>/dev/null | sort -h | tail -12)  # what is worth keeping
      if command -v xz > /dev/null; then ext=xz; pack="xz -T0 -3"; else ext=gz; pack="gzip -1"; fi
      # the unpack marker stays behind: a restored cache kept again is a new cache for the next machine
      # pipefail: a folder that is not there must fail the packing, not leave a cache cut short
      (set -o pipefail; tar -C "$RLSTACK_KERNEL_CACHE" --format=posix --exclude=./.rlstack-restored -cf - "${@:-.}" \
        | $pack | split -b "${KC_CHUNK:-15M}" -d -a 3 - "$PK/$name.tar.$ext.") \
        || { rm -rf "$PK"; echo "packing failed" >&2; exit 1; }
      (cd "$PK" && sha256sum "$name".tar.* > "$name.sha256.tmp" && mv "$name.sha256.tmp" "$name.sha256") || exit 1
    fi
    n=$(wc -l < "$PK/$name.sha256"); last=$(( (n + 2) / 3 - 1 ))
    [ "$group" -le "$last" ] || { echo "keep-cache $stack: $n chunks, calls 0..$last" >&2; exit 2; }
    cp "$PK/$name.sha256" "$OUT/"
    awk '{print $2}' "$PK/$name.sha256" | sed -n "$(( group * 3 + 1 )),$(( group * 3 + 3 ))p" \
      | while read -r c; do cp "$PK/$c" "$OUT/" || exit 1; done || exit 1
    to=$(( group * 3 + 2 < n - 1 ? group * 3 + 2 : n - 1 ))
    echo "kernel cache $name: $n chunks ($(du -ch "$PK"/"$name".tar.* | tail -1 | cut -f1)); this call brought" \
      "chunks $(( group * 3 ))-$to and the manifest$( [ "$group" -lt "$last" ] \
      && echo "; next: keep-cache $stack $(( group + 1 ))" || echo "; that was the last call")" ;;
  run)
    install
    export PYTHONPATH=$SITE:$PWD/src
    t0=$(date +%s)
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
    python3 -m rlstack.cli probe --stack "$stack" --layer runtime -o "$OUT/probe-$stack-native.json" \
      > "$LOGS/probe-cli.log" 2>&1
    echo "probe exit $? after $(( $(date +%s) - t0 )) s"
    cat "$LOGS/probe-cli.log"   # the report's table: environment, deviations, one line per probe
    pack_logs ;;
  one)
    probe=${1:?probe name}
    install
    export PYTHONPATH=$SITE:$PWD/src
    t0=$(date +%s)
    timeout "${PROBE_TIMEOUT:-400}" python3 -m rlstack.probes.runtime "$probe" > "$LOGS/one-$probe.log" 2>&1
    echo "one $probe exit $? after $(( $(date +%s) - t0 )) s"
    grep -a RLSTACK-PROBE-RESULT "$LOGS/one-$probe.log" | tail -1 | cut -c1-700
    grep -aE "Error|error:|Traceback" "$LOGS/one-$probe.log" "$LOGS"/*train*.log 2>/dev/null | tail -8 | cut -c1-400
    pack_logs ;;
  py)
    install
    export PYTHONPATH=$SITE:$PWD/src
    python3 "$@" ;;
  probe)
    # the runtime layer as a background job: the report and the packed probe logs land in its $OUT
    exec bash "$0" bg "$stack" -m rlstack.cli probe --stack "$stack" --layer runtime "$@" \
      -o "$STASH/bg-$stack/out/probe-$stack-native.json" ;;
  bg)
    # the machine stays warm only while calls keep coming: follow with `wait` calls back to back
    install
    BG=$STASH/bg-$stack
    [ -f "$BG/pid" ] && [ ! -f "$BG/rc" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null \
      && { echo "a background job of $stack is still running: bash bench/transport/native_probe.sh wait $stack" >&2; exit 3; }
    [ -f "$BG/rc" ] && [ ! -f "$BG/fetched" ] && ls "$BG/out" | grep -q . \
      && echo "note: the last background job's files were never fetched with wait; they are replaced now" >&2
    rm -rf "$BG"; mkdir -p "$BG/out" "$BG/tree"
    # the job runs from its own copy of the tree: the device tool refreshes the working tree at every call,
    # removing files for a moment, and a job that opened one then failed ("can't open file", 2026-12-04)
    tar -C "$PWD" --exclude=./.stage --exclude=./.venv --exclude=./.git --exclude=./.mypy_cache --exclude=./.ruff_cache \
      --exclude=./.hypothesis --exclude=./unsloth_compiled_cache -cf - . \
      | tar -C "$BG/tree" -xf - || exit 1
    # the probe logs of this job (RLSTACK_PROBE_LOGDIR) are packed into its $OUT before the exit code is written
    rm -rf "$LOGS"; mkdir -p "$LOGS"
    cd "$BG/tree" || exit 1
    PYTHONPATH=$SITE:$BG/tree/src OUT=$BG/out BG_DIR=$BG setsid nohup bash -c 'python3 "$@"; rc=$?
      [ -n "$(ls -A "$RLSTACK_PROBE_LOGDIR")" ] && tar -C "$RLSTACK_PROBE_LOGDIR" -czf "$OUT/logs.tgz" .
      echo $rc > "$BG_DIR/rc.tmp" && mv "$BG_DIR/rc.tmp" "$BG_DIR/rc"' _ "$@" \
      > "$BG/log" 2>&1 < /dev/null &
    echo $! > "$BG/pid"
    echo "started in the background (pid $(cat "$BG/pid")): python3 $*; log $BG/log" ;;
  wait)
    BG=$STASH/bg-$stack; limit=${1:-560}; t0=$(date +%s)
    [ -f "$BG/pid" ] || { echo "no background job of $stack: start one with bg" >&2; exit 2; }
    while [ ! -f "$BG/rc" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      sleep 5
    done
    tail -n "${TAIL:-25}" "$BG/log" | cut -c1-400
    if [ -f "$BG/rc" ]; then
      cp -r "$BG/out/." "$OUT/"; cp "$BG/log" "$OUT/job-$stack.log"; touch "$BG/fetched"
      echo "background job exit $(cat "$BG/rc") after waiting $(( $(date +%s) - t0 )) s; its files are in this \$OUT"
      exit "$(cat "$BG/rc")"
    elif kill -0 "$(cat "$BG/pid")" 2>/dev/null; then
      echo "still running after $limit s: call wait again"
    else
      echo "the background job died without an exit code (killed?); log above" >&2; exit 1
    fi ;;
  *) echo "unknown: $cmd" >&2; exit 2 ;;
esac
