#!/usr/bin/env bash
# A real benchmark client against the example server: NVIDIA's aiperf sends
# streaming chat completions over HTTP to tower-admission-sim/examples/openai_server.rs (the
# simulated engine behind the gate) well above its capacity, once per server
# configuration, with its goodput option set to the latency objectives, and
# prints one summary table.
#
#   pip install aiperf tokenizers        # this script installs nothing
#   tower-admission-sim/benches/aiperf/run.sh          # defaults, ttft-objective (once it exists), no-admission
#   tower-admission-sim/benches/aiperf/run.sh defaults ttft-objective no-admission
#   tower-admission-sim/benches/aiperf/run.sh defaults 'queue16=--request-queue-limit 16'
#
# Configurations (arguments; default: defaults ttft-objective no-admission):
#   defaults         the gate with its defaults
#   ttft-objective   the gate with --ttft-objective-ms $TTFT_MS (skipped,
#                    with a note in the table, while the server lacks it)
#   no-admission     --no-admission: no gate, the engine's own queue
#   LABEL=FLAGS      any other server flags under a label of your own
#
# Settings (environment):
#   LOAD=3            offered load as a multiple of the measured capacity
#   CAPACITY=         requests/s; measured first when unset: aiperf keeps
#                     MAX_NUM_SEQS requests in flight on the default server
#   MAX_NUM_SEQS=16   the simulated engine's max_num_seqs
#   TIME_SCALE=4      wall seconds per simulated GPU second (4: four times
#                     slower than the modelled H100, so that a 2-core
#                     machine keeps up with the stream of tokens)
#   ISL=100 OSL=64    prompt tokens and output tokens of every request
#   TTFT_MS=1000      time-to-first-token objective (aiperf --goodput)
#   TPOT_MS=100       inter-token latency objective (aiperf --goodput)
#   DURATION=60       seconds of load per configuration
#   GRACE=10          seconds aiperf waits for open responses afterwards
#   AIPERF=aiperf     the aiperf command; PYTHON=python3 for the helper
#   OUT=target/aiperf where the tokenizer, logs and aiperf artifacts go
#
# No model hub is needed: the tokenizer is trained here with the
# `tokenizers` package (tower-admission-sim/benches/aiperf/aiperf_eval.py) and passed to aiperf
# as a local path. Not part of `cargo test`: it takes minutes.
set -euo pipefail

cd "$(dirname "$0")/../../.."  # the repository's root
LOAD=${LOAD:-3}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-16}
TIME_SCALE=${TIME_SCALE:-4}
ISL=${ISL:-100}
OSL=${OSL:-64}
TTFT_MS=${TTFT_MS:-1000}
TPOT_MS=${TPOT_MS:-100}
DURATION=${DURATION:-60}
GRACE=${GRACE:-10}
AIPERF=${AIPERF:-aiperf}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-target/aiperf}
HELPER=tower-admission-sim/benches/aiperf/aiperf_eval.py
# Not HF_HUB_OFFLINE: in that mode aiperf (0.13) looks its tokenizer up in
# the hub's cache only and refuses a local directory. A local path is never
# looked up online.
export TOKENIZERS_PARALLELISM=false

if [ $# -eq 0 ]; then
    set -- defaults ttft-objective no-admission
fi
command -v "$AIPERF" >/dev/null || { echo "error: '$AIPERF' not found: pip install aiperf tokenizers" >&2; exit 1; }
"$PYTHON" -c 'import tokenizers' 2>/dev/null || { echo "error: $PYTHON cannot import tokenizers: pip install tokenizers" >&2; exit 1; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # aiperf's services resolve paths elsewhere
echo "building the example server (release)"
cargo build --quiet --release -p tower-admission-sim --example openai_server
SERVER=target/release/examples/openai_server
"$PYTHON" "$HELPER" tokenizer "$OUT/tokenizer"

PID=
stop_server() {
    if [ -n "$PID" ]; then
        kill -TERM "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
        PID=
    fi
}
trap stop_server EXIT

# start_server LABEL FLAGS...: starts the server on a free port; sets URL.
start_server() {
    local label=$1
    shift
    local log="$OUT/$label.server.log"
    "$SERVER" --listen 127.0.0.1:0 --max-num-seqs "$MAX_NUM_SEQS" --time-scale "$TIME_SCALE" "$@" >"$log" 2>&1 &
    PID=$!
    for _ in $(seq 100); do
        if URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$log" | head -n1) && [ -n "$URL" ]; then
            return 0
        fi
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "error: the server did not start; its output:" >&2
    cat "$log" >&2
    exit 1
}

# profile LABEL ARGS...: one aiperf run against $URL into $OUT/LABEL.
profile() {
    local label=$1
    shift
    rm -rf "${OUT:?}/$label"
    "$AIPERF" profile \
        --model sim --tokenizer "$OUT/tokenizer" --url "$URL" \
        --endpoint-type chat --streaming \
        --isl "$ISL" --isl-stddev 0 --osl "$OSL" --osl-stddev 0 \
        --goodput "time_to_first_token:$TTFT_MS inter_token_latency:$TPOT_MS" \
        --use-server-token-count --random-seed 1 --ui-type none --no-server-metrics \
        --artifact-dir "$OUT/$label" "$@" >"$OUT/$label.aiperf.log" 2>&1 || {
        echo "error: aiperf failed for $label; the end of its log:" >&2
        tail -n 30 "$OUT/$label.aiperf.log" >&2
        exit 1
    }
}

if [ -z "${CAPACITY:-}" ]; then
    echo "measuring capacity: $MAX_NUM_SEQS requests in flight for 30 s on the default server"
    start_server capacity
    profile capacity --concurrency "$MAX_NUM_SEQS" --benchmark-duration 30 --benchmark-grace-period 30
    stop_server
    CAPACITY=$("$PYTHON" -c '
import json, pathlib, sys
data = json.loads(next(pathlib.Path(sys.argv[1]).rglob("profile_export_aiperf.json")).read_text())
print(round(data["request_throughput"]["avg"], 2))' "$OUT/capacity")
fi
RATE=$("$PYTHON" -c "print(round($LOAD * $CAPACITY, 2))")
echo "capacity $CAPACITY req/s; offered load ${LOAD}x = $RATE req/s (Poisson) for $DURATION s per configuration"

RUNS=()
NOTES=()
for config in "$@"; do
    case "$config" in
        defaults) label=defaults; flags=() ;;
        ttft-objective) label=ttft-objective; flags=(--ttft-objective-ms "$TTFT_MS") ;;
        no-admission) label=no-admission; flags=(--no-admission) ;;
        *=*) label=${config%%=*}; read -r -a flags <<<"${config#*=}" ;;
        *) echo "error: unknown configuration '$config'" >&2; exit 2 ;;
    esac
    # A flag the server does not know (yet) skips the configuration.
    missing=
    for flag in "${flags[@]}"; do
        if [[ $flag == --* ]] && ! "$SERVER" --help | grep -q -- "$flag"; then
            missing=$flag
        fi
    done
    if [ -n "$missing" ]; then
        echo "skipping $label: the server has no $missing"
        NOTES+=("$label: skipped, tower-admission-sim/examples/openai_server.rs has no $missing")
        continue
    fi
    echo "running $label (server flags: ${flags[*]:-none})"
    start_server "$label" "${flags[@]}"
    profile "$label" --request-rate "$RATE" --arrival-pattern poisson \
        --benchmark-duration "$DURATION" --benchmark-grace-period "$GRACE"
    stop_server
    RUNS+=("$label=$OUT/$label")
done

echo
echo "max_num_seqs $MAX_NUM_SEQS, time scale $TIME_SCALE, $ISL prompt tokens, $OSL output tokens;" \
    "capacity $CAPACITY req/s, offered $RATE req/s (${LOAD}x) for $DURATION s"
if [ ${#RUNS[@]} -gt 0 ]; then
    "$PYTHON" "$HELPER" summary "$TTFT_MS" "$TPOT_MS" "${RUNS[@]}"
fi
for note in "${NOTES[@]}"; do
    echo "$note"
done
