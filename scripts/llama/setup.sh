#!/usr/bin/env bash
# Install the real-engine kit for the tests: llama.cpp's llama-server and a
# tiny random-weight model.
#
#   eval "$(bash scripts/llama/setup.sh)"
#
# stdout carries only these two lines (absolute paths):
#   export LLAMA_SERVER=<repo>/target/llama/llama-server
#   export LLAMA_TINY_MODEL=<repo>/target/llama/tiny.gguf
# everything else goes to stderr. Idempotent: a second run only checks.
#
# Steps: pip install 'gguf==0.19.*' numpy (when missing); the binary through
# build-llama-server.sh (a copy of the checksummed prebuilt when one is at
# $LLAMA_SERVER_PREBUILT or ../shared/engines/, else a build from source of
# about 26 CPU minutes that needs root for apt-get install cmake); the model
# through tiny_gguf.py, with the tokenizer of
# ../shared/engines/ggml-vocab-llama-spm.gguf (or $LLAMA_VOCAB) when present,
# else its own small fallback vocabulary.
set -euo pipefail
exec 3>&1 1>&2  # fd 3: the export lines; all the rest to stderr

log() { echo "llama/setup: $*" >&2; }
die() { log "error: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT_DIR=$ROOT/target/llama
BIN=$OUT_DIR/llama-server
MODEL=$OUT_DIR/tiny.gguf
VOCAB_SHA256=16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"

# 1. Python packages for tiny_gguf.py.
if ! "$PY" -c 'import numpy, gguf, importlib.metadata as m, sys; sys.exit(0 if m.version("gguf").startswith("0.19.") else 1)' 2>/dev/null; then
  log "pip install 'gguf==0.19.*' numpy"
  PIP_NO_INPUT=1 "$PY" -m pip install --quiet --disable-pip-version-check \
    'gguf==0.19.*' numpy </dev/null
fi

# 2. The binary.
bash "$HERE/build-llama-server.sh" "$BIN" </dev/null

# 3. The model: regenerated only when the script, the vocabulary or gguf changed.
VOCAB=${LLAMA_VOCAB:-}
if [ -z "$VOCAB" ]; then
  cand=$ROOT/../shared/engines/ggml-vocab-llama-spm.gguf
  if [ -f "$cand" ]; then
    if [ "$(sha256sum "$cand" | cut -d' ' -f1)" = "$VOCAB_SHA256" ]; then
      VOCAB=$cand
    else
      log "ignoring $cand: unexpected sha256; using the fallback vocabulary"
    fi
  fi
fi
stamp() {
  {
    sha256sum "$HERE/tiny_gguf.py" | cut -d' ' -f1
    if [ -n "$VOCAB" ]; then sha256sum "$VOCAB" | cut -d' ' -f1; else echo fallback-vocab; fi
    "$PY" -c 'import importlib.metadata as m; print("gguf", m.version("gguf"))'
  } | sha256sum | cut -d' ' -f1
}
want=$(stamp)
if [ -f "$MODEL" ] && [ "$(cat "$MODEL.stamp" 2>/dev/null || true)" = "$want" ]; then
  log "$MODEL is up to date"
else
  "$PY" "$HERE/tiny_gguf.py" --out "$MODEL" ${VOCAB:+--vocab "$VOCAB"} </dev/null
  echo "$want" > "$MODEL.stamp"
fi

[ -x "$BIN" ] || die "no $BIN"
[ -s "$MODEL" ] || die "no $MODEL"
printf 'export LLAMA_SERVER=%q\n' "$BIN" >&3
printf 'export LLAMA_TINY_MODEL=%q\n' "$MODEL" >&3
