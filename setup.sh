#!/usr/bin/env bash
# Sets up a development environment in .venv: rlstack + its dev tools, plus the cpu stack's hash-locked
# libraries (torch, transformers, trl, peft, ...) so that training and evaluation run natively on the CPU.
# Idempotent: a second run only checks. Needs python3 (>= 3.11) and network access to PyPI.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
UV_VERSION=0.13.9
if [ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ]; then export SSL_CERT_FILE="$PIP_CERT"; fi

if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | awk '{print $2}')" != "$UV_VERSION" ]; then
  echo "+ installing uv $UV_VERSION"
  "$PY" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" \
    || "$PY" -m pip install --quiet --user --break-system-packages "uv==$UV_VERSION"
  export PATH="$HOME/.local/bin:$PATH"
fi
UV=$(command -v uv)
if [ ! -x .venv/bin/python ]; then
  echo "+ $UV venv --python $PY .venv"
  "$UV" venv --quiet --python "$PY" .venv
fi
export VIRTUAL_ENV="$PWD/.venv"
# The cpu stack's lock is the one source of the ML library versions, natively as in the image.
stamp=.venv/.rlstack-cpu-lock
want=$(sha256sum images/cpu/requirements.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "+ $UV pip install --require-hashes -r images/cpu/requirements.lock"
  "$UV" pip install --quiet --require-hashes --no-deps -r images/cpu/requirements.lock
  echo "$want" > "$stamp"
fi
# bitsandbytes, hash-pinned from the portable stack's lock (its version is written there once): its CPU backend
# quantizes NF4, so the tests of fastgen on the portable stack's 4-bit Unsloth path run here instead of skipping.
# Nothing in the cpu stack loads it (4-bit loading needs a GPU), which is why it is not in the cpu lock.
if ! .venv/bin/python -c "import importlib.metadata as m; m.version('bitsandbytes')" >/dev/null 2>&1; then
  bnb=$(mktemp)
  awk '/^bitsandbytes==/{on=1} on{print; if ($0 !~ /\\$/) exit}' images/portable/requirements.lock > "$bnb"
  echo "+ $UV pip install --require-hashes $(head -1 "$bnb" | cut -d' ' -f1) (from images/portable/requirements.lock)"
  "$UV" pip install --quiet --require-hashes --no-deps -r "$bnb"
  rm -f "$bnb"
fi
echo "+ $UV pip install -e .[dev]"
"$UV" pip install --quiet -e ".[dev]"
echo "ready: .venv (activate with 'source .venv/bin/activate')"
