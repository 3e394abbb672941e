#!/usr/bin/env bash
# Prepare Docker on a bare Debian/Ubuntu machine for the image tests; safe to run again (every step checks
# first). Installs docker.io, debootstrap and docker-compose when missing, starts dockerd in the background when no engine
# answers and waits for it, and makes the test base image (debootstrap bookworm minbase, docker import)
# unless it is already there, so a CI machine that keeps /var/lib/docker pays for it once.
set -euo pipefail

DOCKER=${RLSTACK_DOCKER:-/usr/bin/docker}
BASE=${RLSTACK_TEST_BASE:-rlstack-test/bookworm-minbase}
MIRROR=${RLSTACK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

log() { echo "docker-setup: $*" >&2; }

# An apt-get stopped mid-install leaves packages unpacked but not configured (dpkg "iU"): the docker binary is
# there, so the checks below pass, yet dockerd cannot start. dpkg --audit lists such packages; finish them first.
if command -v dpkg >/dev/null 2>&1 && [ -n "$(dpkg --audit 2>/dev/null)" ]; then
  log "packages left half-installed by an interrupted apt-get; running dpkg --configure -a"
  DEBIAN_FRONTEND=noninteractive $SUDO dpkg --configure -a
fi

need_pkgs=()
[ -x "$DOCKER" ] || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
# docker compose validates the file invoke train --vllm-server generates (tests/host/test_compose.py); Debian's docker.io
# has no compose plugin, so the standalone docker-compose stands in.
if ! command -v docker-compose >/dev/null 2>&1 && ! "$DOCKER" compose version >/dev/null 2>&1; then
  need_pkgs+=(docker-compose)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
fi

if ! "$DOCKER" info >/dev/null 2>&1; then
  # BuildKit's cache GC keeps ~10% of the disk by default; one CUDA-stack build caches ~25 GB (its venv in
  # the build stage, the runtime copy, the uv cache), so a smaller limit evicts the build stage mid-session
  # and the next build reinstalls everything. Only when we start dockerd and no config exists.
  if [ ! -e /etc/docker/daemon.json ]; then
    $SUDO mkdir -p /etc/docker
    echo '{"builder": {"gc": {"enabled": true, "defaultKeepStorage": "60GB"}}}' | $SUDO tee /etc/docker/daemon.json >/dev/null
    log "wrote /etc/docker/daemon.json (builder cache kept up to 60 GB)"
  fi
  log "no engine answers; starting dockerd (log: /tmp/dockerd.log)"
  # shellcheck disable=SC2024
  nohup $SUDO dockerd >/tmp/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! "$DOCKER" info >/dev/null 2>&1; then
    log "dockerd did not answer within 60 s; last lines of /tmp/dockerd.log:"
    tail -20 /tmp/dockerd.log >&2 || true
    exit 1
  fi
fi
log "engine: $("$DOCKER" version --format '{{.Server.Version}}')"

if "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  log "base image $BASE already present"
else
  dir=$(mktemp -d /tmp/rlstack-minbase.XXXXXX)
  trap '$SUDO rm -rf "$dir"' EXIT
  log "debootstrap bookworm minbase into $dir (a few minutes)"
  $SUDO debootstrap --variant=minbase bookworm "$dir" "$MIRROR" >/tmp/debootstrap.log 2>&1 \
    || { tail -20 /tmp/debootstrap.log >&2; exit 1; }
  $SUDO rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  $SUDO tar -C "$dir" -c . | "$DOCKER" import - "$BASE" >/dev/null
  log "made $BASE"
fi
