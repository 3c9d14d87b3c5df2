#!/usr/bin/env bash
# Run vLLM's OpenAI-compatible server (the CPU build) on the tiny model, on
# 127.0.0.1:PORT, in the foreground.
#
#   bash scripts/vllm/serve.sh PORT [more `vllm serve` flags...]
#
# Uses $VLLM_BIN and $VLLM_TINY_MODEL (see setup.sh), falling back to
# target/vllm/venv/bin/vllm and target/vllm/tiny-llama. The flags are those
# the tests use:
#   --max-num-seqs 4 --max-model-len 2048 --enforce-eager --dtype float32
#   --kv-cache-memory-bytes 16777216 --served-model-name tiny
# (16 MiB of KV cache: 8,192 tokens in 64 blocks of 128). Flags given after
# PORT come later on the command line and so override these. Startup takes
# 45-70 s (Python imports in three processes, ~3.3 GB); GET /health answers
# 200 once it is ready (before that the port refuses connections).
# `kill -TERM` (or -INT) stops it and its engine processes.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,17p' "${BASH_SOURCE[0]}" >&2; exit 2; }
PORT=$1; shift
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${VLLM_BIN:-$ROOT/target/vllm/venv/bin/vllm}
MODEL=${VLLM_TINY_MODEL:-$ROOT/target/vllm/tiny-llama}
[ -x "$BIN" ] || { echo "serve.sh: no vllm at $BIN (run scripts/vllm/setup.sh)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "serve.sh: no model at $MODEL (run scripts/vllm/setup.sh)" >&2; exit 1; }

# The CPU platform; one torch thread, unpinned (2 cores shared with the
# tests); nothing from a model hub; no usage reports; vLLM's internal sockets
# (data-parallel ranks) on loopback.
export VLLM_TARGET_DEVICE=cpu
export VLLM_CPU_OMP_THREADS_BIND=nobind
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_HOST_IP=127.0.0.1
exec "$BIN" serve "$MODEL" \
  --served-model-name tiny \
  --max-num-seqs 4 --max-model-len 2048 --enforce-eager --dtype float32 \
  --kv-cache-memory-bytes 16777216 \
  --host 127.0.0.1 --port "$PORT" "$@"
