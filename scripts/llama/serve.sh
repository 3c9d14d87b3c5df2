#!/usr/bin/env bash
# Run llama-server on the tiny model, on 127.0.0.1:PORT, in the foreground.
#
#   bash scripts/llama/serve.sh PORT [more llama-server flags...]
#
# Uses $LLAMA_SERVER and $LLAMA_TINY_MODEL (see setup.sh), falling back to
# target/llama/{llama-server,tiny.gguf}. The flags are those the tests use:
#   --parallel 2 -c 4096 --metrics -t 1 --ignore-eos --no-webui
# (2 slots of 2048 tokens each). Flags given after PORT come later on the
# command line and so override these. While the model loads (about 0.1 s for
# the tiny model) every endpoint, /health included, answers 503
# {"error":{"message":"Loading model","type":"unavailable_error","code":503}};
# poll GET /health until it answers 200 {"status":"ok"}.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,13p' "${BASH_SOURCE[0]}" >&2; exit 2; }
PORT=$1; shift
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${LLAMA_SERVER:-$ROOT/target/llama/llama-server}
MODEL=${LLAMA_TINY_MODEL:-$ROOT/target/llama/tiny.gguf}
[ -x "$BIN" ] || { echo "serve.sh: no llama-server at $BIN (run scripts/llama/setup.sh)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "serve.sh: no model at $MODEL (run scripts/llama/setup.sh)" >&2; exit 1; }
exec "$BIN" -m "$MODEL" --parallel 2 -c 4096 --metrics -t 1 --ignore-eos --no-webui \
  --host 127.0.0.1 --port "$PORT" "$@"
