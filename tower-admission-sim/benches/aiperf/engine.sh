#!/usr/bin/env bash
# The sidecar in front of a real engine: NVIDIA's aiperf sends streaming chat
# completions to llama.cpp's llama-server (a tiny random model, scripts/llama/),
# or with ENGINE=vllm to vLLM's CPU build (a tiny random model, scripts/vllm/),
# directly, and through the tower-admission sidecar (tower-admission-sidecar) in front
# of the same server, in one run, with one goodput objective (aiperf
# --goodput on TTFT and inter-token latency), and prints one table.
#
#   pip install aiperf tokenizers        # this script installs nothing of it
#   tower-admission-sim/benches/aiperf/engine.sh             # direct sidecar ttft-objective, then the 0.5x pair
#   tower-admission-sim/benches/aiperf/engine.sh direct 'queue4=--request-queue-limit 4'
#   LOAD=2 LOW_LOAD=0 tower-admission-sim/benches/aiperf/engine.sh
#   ENGINE=vllm tower-admission-sim/benches/aiperf/engine.sh  # the same in front of vLLM
#
# Steps:
#   1. capacity: the engine alone, aiperf keeping PARALLEL requests in
#      flight (closed loop) for CAPACITY_DURATION s: requests/s it completes
#      (the table's first row; it also shows that the engine at capacity
#      meets the objective);
#   2. LOAD x capacity, Poisson arrivals, DURATION s, once per configuration
#      (arguments; default: direct sidecar ttft-objective):
#        direct           aiperf -> llama-server (its own unbounded queue)
#        sidecar          aiperf -> tower-admission, its defaults -> llama-server
#                         (capacity read from GET /props: total_slots;
#                         vLLM: --max-num-seqs $PARALLEL)
#        ttft-objective   the sidecar with --ttft-objective-ms $TTFT_MS
#        LABEL=FLAGS      the sidecar with any other flags, under a label
#   3. LOW_LOAD x capacity (0: skipped): direct and sidecar, LOW_PAIRS times
#      in turn (direct, sidecar, direct, sidecar, ...), for the sidecar's
#      overhead: p50 TTFT difference and throughput ratio per pair.
#   4. PROBE requests each (0: skipped), one at a time, alternating direct
#      and through the sidecar: the time to the first content chunk without
#      load, where a fraction of a millisecond is measurable (aiperf's
#      figures at 0.5x vary by a few ms between runs on this machine).
#   The table's "engine queue" is the largest llamacpp:requests_deferred
#   (requests waiting for a slot inside llama-server; with vLLM
#   vllm:num_requests_waiting) seen by polling the engine's /metrics every
#   0.5 s during the run.
#   For every run through a sidecar, a second table sets the sidecar's own
#   goodput counter (goodput_requests_total, from its /metrics at the end of
#   the run: requests that met its --ttft-objective-ms and
#   --inter-token-objective-ms) beside aiperf's good requests; give the
#   sidecar the objectives aiperf is given, e.g.
#     TTFT_MS=300 engine.sh 'slo=--ttft-objective-ms 300 --inter-token-objective-ms 200'
#   and a third judges aiperf's own per-request records by the sidecar's
#   rule: both judge a request's mean gap, aiperf over its output tokens
#   (by its tokenizer), the sidecar over its content chunks (BENCHMARKS.md,
#   "The sidecar's goodput counter against aiperf").
#   Every configuration gets a freshly started llama-server (a direct run at
#   3x leaves hundreds of requests queued in it) and its own sidecar. vLLM
#   takes a minute or more to start, so one vLLM serves the whole run: it
#   aborts the requests of a client that disconnects, and each configuration
#   starts once its /metrics shows no request running or waiting (after
#   aiperf has exited).
#
# ENGINE=vllm: scripts/vllm/serve.sh (vLLM's CPU build, --max-num-seqs 4,
# one torch thread); PARALLEL is then its --max-num-seqs, which vLLM does not
# report, so the sidecar gets --max-num-seqs $PARALLEL; aiperf sends
# ignore_eos: true (every request makes exactly OSL tokens). Its defaults
# differ (below: ISL, OSL, TTFT_MS, ITL_MS, OUT); VLLM_BIN and
# VLLM_TINY_MODEL come from scripts/vllm/setup.sh when unset.
#
# Settings (environment):
#   LOAD=3 LOW_LOAD=0.5   offered loads, multiples of the measured capacity
#   LOW_PAIRS=2           direct/sidecar pairs at LOW_LOAD
#   PROBE=150 PROBE_OSL=$OSL  step 4: requests of each, their max_tokens
#   CAPACITY=             requests/s; measured first (step 1) when unset
#   CAPACITY_DURATION=30  seconds of the capacity run
#   WARMUP=20 (vllm), 0 (llama)  seconds of a discarded closed-loop run
#                         before it (vLLM: also when CAPACITY is given,
#                         before the first configuration)
#   ENGINE=llama          llama (llama.cpp's llama-server) or vllm
#   PARALLEL=4 CTX=8192 THREADS=1
#                         llama-server --parallel (slots), -c (split across
#                         the slots: 2048 each) and -t; vLLM: --max-num-seqs
#   ISL=100 OSL=256       prompt tokens (aiperf's count; llama's tokenizer
#                         makes them ~135) and output tokens. llama-server
#                         runs with --ignore-eos, so every request makes
#                         exactly OSL tokens (max_completion_tokens). 256
#                         tokens: ~0.5 s per request with 4 in flight, so a
#                         request lasts long enough to queue behind and the
#                         engine streams ~2,000 tokens/s, which one core of
#                         aiperf parses without falling behind
#   TTFT_MS=2000 ITL_MS=20
#                         the goodput objective: TTFT and inter-token
#                         latency limits (aiperf --goodput); the engine at
#                         capacity makes ~25 ms p50 / ~150 ms p99 TTFT and
#                         ~2 ms ITL, so both hold with room; 2 s also fits
#                         the sidecar's default queue (2 x 4 slots, ~1 s
#                         of work) without tuning
#   ENGINE=vllm: ISL=100 OSL=32 TTFT_MS=2000 ITL_MS=200
#                         the tiny vLLM writes ~25-150 tokens/s per stream
#                         on these 2 shared cores (aiperf's 100 prompt
#                         tokens are ~210 of its tokenizer's): 4 in flight
#                         completed 2.7-7.4 req/s, as other jobs left it
#                         the cores, p99 TTFT 0.1-0.7 s, so the engine at
#                         capacity meets 2 s; the sidecar's default queue
#                         (2 x 4) is then 1.1-3 s of work, which
#                         --ttft-objective-ms bounds. ITL only catches a
#                         stalled stream (p99 ITL 40-115 ms at capacity)
#   DURATION=30 GRACE=10  seconds of load per configuration; seconds aiperf
#                         waits for open responses afterwards
#   WORKERS=1             aiperf --workers-max (and one record processor):
#                         on 2 cores more Python processes only take CPU
#                         from the engine (one thread) and the sidecar
#   AIPERF=aiperf PYTHON=python3
#   SIDECAR=target/release/tower-admission   built here unless SIDECAR is set
#   LLAMA_SERVER LLAMA_TINY_MODEL            from scripts/llama/setup.sh
#                                            when unset
#   VLLM_BIN VLLM_TINY_MODEL                 ENGINE=vllm: from
#                                            scripts/vllm/setup.sh when unset
#   OUT=target/aiperf-engine  tokenizer, logs and aiperf artifacts
#                         (ENGINE=vllm: target/aiperf-vllm)
#
# aiperf counts the sidecar's 529 overload answers as errors (they are the
# point: the client learns at once); the table splits errors by status.
# No model hub is needed: the tokenizer is trained offline
# (tower-admission-sim/benches/aiperf/aiperf_eval.py). Not part of `cargo test`: with the
# defaults it takes about 6.5 minutes (8 aiperf runs, ~20 s of aiperf
# start-up each); ENGINE=vllm about 7 (vLLM's start-up included).
#
# llama-server (0c1e570) closes the connection right after the last chunk of
# every streamed response while advertising keep-alive, so clients that pool
# connections (aiohttp in aiperf, hyper in the sidecar) sometimes send the
# next request on a dead connection: aiperf reports ClientOSError direct,
# the sidecar answers 502 (see BENCHMARKS.md).
set -euo pipefail

cd "$(dirname "$0")/../../.."  # the repository's root
ENGINE=${ENGINE:-llama}
case "$ENGINE" in
    llama) ENGINE_NAME=llama-server ISL=${ISL:-100} OSL=${OSL:-256} TTFT_MS=${TTFT_MS:-2000} ITL_MS=${ITL_MS:-20} OUT=${OUT:-target/aiperf-engine} ;;
    vllm) ENGINE_NAME=vLLM ISL=${ISL:-100} OSL=${OSL:-32} TTFT_MS=${TTFT_MS:-2000} ITL_MS=${ITL_MS:-200} OUT=${OUT:-target/aiperf-vllm} ;;
    *) echo "error: ENGINE is llama or vllm, not '$ENGINE'" >&2; exit 2 ;;
esac
LOAD=${LOAD:-3}
LOW_LOAD=${LOW_LOAD:-0.5}
LOW_PAIRS=${LOW_PAIRS:-2}
CAPACITY_DURATION=${CAPACITY_DURATION:-30}
PARALLEL=${PARALLEL:-4}
CTX=${CTX:-8192}
THREADS=${THREADS:-1}
DURATION=${DURATION:-30}
GRACE=${GRACE:-10}
WORKERS=${WORKERS:-1}
AIPERF=${AIPERF:-aiperf}
PYTHON=${PYTHON:-python3}
HELPER=tower-admission-sim/benches/aiperf/aiperf_eval.py
export TOKENIZERS_PARALLELISM=false

if [ $# -eq 0 ]; then
    set -- direct sidecar ttft-objective
fi
command -v "$AIPERF" >/dev/null || { echo "error: '$AIPERF' not found: pip install aiperf tokenizers" >&2; exit 1; }
"$PYTHON" -c 'import tokenizers' 2>/dev/null || { echo "error: $PYTHON cannot import tokenizers: pip install tokenizers" >&2; exit 1; }
if [ "$ENGINE" = llama ] && { [ -z "${LLAMA_SERVER:-}" ] || [ -z "${LLAMA_TINY_MODEL:-}" ]; }; then
    echo "setting up llama-server and the tiny model (scripts/llama/setup.sh)"
    eval "$(bash scripts/llama/setup.sh)"
fi
if [ "$ENGINE" = vllm ]; then
    if [ -z "${VLLM_BIN:-}" ] || [ -z "${VLLM_TINY_MODEL:-}" ]; then
        echo "setting up vLLM and the tiny model (scripts/vllm/setup.sh)"
        eval "$(bash scripts/vllm/setup.sh)"
    fi
    export VLLM_BIN VLLM_TINY_MODEL # for scripts/vllm/serve.sh
fi
# What differs by engine: the engine's queue gauge on /metrics, what the
# sidecar must be told (vLLM does not report its max_num_seqs), what aiperf
# adds to each request (vLLM stops at EOS unless told otherwise).
if [ "$ENGINE" = vllm ]; then
    QUEUE_GAUGE='vllm:num_requests_waiting'
    # vLLM runs for the whole benchmark and is slow for its first requests
    # (the CPU build warming up: ~25x its steady inter-token time): a
    # closed-loop warm-up, discarded, before capacity is measured.
    WARMUP=${WARMUP:-20}
    SIDECAR_ENGINE_FLAGS=(--max-num-seqs "$PARALLEL")
    AIPERF_ENGINE_FLAGS=(--extra-inputs '{"ignore_eos": true}')
else
    QUEUE_GAUGE='llamacpp:requests_deferred'
    WARMUP=${WARMUP:-0} # a fresh llama-server per configuration anyway
    SIDECAR_ENGINE_FLAGS=()
    AIPERF_ENGINE_FLAGS=()
fi
if [ -z "${SIDECAR:-}" ]; then
    echo "building the sidecar (release)"
    cargo build --quiet --release -p tower-admission-sidecar --bin tower-admission
    SIDECAR=target/release/tower-admission
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # aiperf's services resolve paths elsewhere
"$PYTHON" "$HELPER" tokenizer "$OUT/tokenizer"

ENGINE_PID=
SIDECAR_PID=
POLL_PID=
# stop PID: SIGTERM, then SIGKILL after 10 s.
stop() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
stop_all() {
    stop "$POLL_PID"
    POLL_PID=
    stop "$SIDECAR_PID"
    SIDECAR_PID=
    stop "$ENGINE_PID"
    ENGINE_PID=
}
trap stop_all EXIT
# end_run: after a configuration; llama-server is restarted for the next
# one, vLLM kept (see start_engine).
end_run() {
    if [ "$ENGINE" = vllm ]; then
        stop "$POLL_PID"
        POLL_PID=
        stop "$SIDECAR_PID"
        SIDECAR_PID=
    else
        stop_all
    fi
}

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_engine LABEL: a fresh llama-server on a free port; sets ENGINE_URL.
# vLLM: started once (into $OUT/vllm.engine.log), then only waited on until
# no request runs or waits in it (the previous configuration's client gone).
start_engine() {
    local log="$OUT/$1.engine.log" port
    if [ "$ENGINE" = vllm ] && [ -n "$ENGINE_PID" ]; then
        wait_idle
        return 0
    fi
    port=$(free_port)
    ENGINE_URL=http://127.0.0.1:$port
    if [ "$ENGINE" = vllm ]; then
        log=$OUT/vllm.engine.log
        bash scripts/vllm/serve.sh "$port" >"$log" 2>&1 &
    else
        "$LLAMA_SERVER" -m "$LLAMA_TINY_MODEL" --parallel "$PARALLEL" -c "$CTX" -t "$THREADS" \
            --ignore-eos --metrics --no-webui --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
    fi
    ENGINE_PID=$!
    # llama-server: 30 s; vLLM: 5 minutes (it takes 45 s to 2 minutes here)
    for _ in $(seq "$([ "$ENGINE" = vllm ] && echo 6000 || echo 600)"); do
        if [ "$(curl -s -o /dev/null -w '%{http_code}' "$ENGINE_URL/health")" = 200 ]; then
            return 0
        fi
        kill -0 "$ENGINE_PID" 2>/dev/null || break
        sleep 0.05
    done
    echo "error: $ENGINE_NAME did not become healthy; its log:" >&2
    tail -n 30 "$log" >&2
    exit 1
}

# wait_idle: until vLLM's /metrics shows no request running or waiting
# (at most 2 minutes).
wait_idle() {
    local busy
    for _ in $(seq 240); do
        busy=$(curl -s -m 2 "$ENGINE_URL/metrics" |
            sed -n 's/^vllm:num_requests_\(running\|waiting\){[^}]*} \([0-9]*\).*/\2/p' |
            awk '{ n += $1 } END { print NR ? n : "" }')
        [ "$busy" = 0 ] && return 0
        sleep 0.5
    done
    echo "error: vLLM still busy (running + waiting: ${busy:-unknown}) 2 minutes after a run" >&2
    exit 1
}

# start_sidecar LABEL FLAGS...: the sidecar in front of $ENGINE_URL; sets
# URL once it listens and has read the engine's capacity (until then its
# limits are the gate's defaults, not the engine's slots).
start_sidecar() {
    local label=$1 log="$OUT/$1.sidecar.log" url=
    shift
    "$SIDECAR" --listen 127.0.0.1:0 --upstream "$ENGINE_URL" "${SIDECAR_ENGINE_FLAGS[@]}" "$@" >"$log" 2>&1 &
    SIDECAR_PID=$!
    for _ in $(seq 600); do
        if [ -z "$url" ]; then
            url=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$log" | head -n1)
        fi
        if [ -n "$url" ] && curl -s "$url/metrics" |
            grep -q "^admission_engine_request_limit{dp_rank=\"0\"} $PARALLEL\$"; then
            URL=$url
            return 0
        fi
        kill -0 "$SIDECAR_PID" 2>/dev/null || break
        sleep 0.05
    done
    echo "error: the sidecar did not start or did not read the engine's capacity; its output:" >&2
    cat "$log" >&2
    exit 1
}

# profile LABEL ARGS...: one aiperf run against $URL into $OUT/LABEL.
profile() {
    local label=$1
    shift
    rm -rf "${OUT:?}/$label"
    "$AIPERF" profile \
        --model tiny --tokenizer "$OUT/tokenizer" --url "$URL" \
        --endpoint-type chat --streaming \
        --isl "$ISL" --isl-stddev 0 --osl "$OSL" --osl-stddev 0 \
        --goodput "time_to_first_token:$TTFT_MS inter_token_latency:$ITL_MS" \
        --use-server-token-count --random-seed 1 --ui-type none --no-server-metrics \
        --no-gpu-telemetry --workers-max "$WORKERS" --record-processors 1 \
        --artifact-dir "$OUT/$label" "${AIPERF_ENGINE_FLAGS[@]}" "$@" >"$OUT/$label.aiperf.log" 2>&1 || {
        echo "error: aiperf failed for $label; the end of its log:" >&2
        tail -n 30 "$OUT/$label.aiperf.log" >&2
        exit 1
    }
}

# run LABEL LOADX RATE direct|sidecar [FLAGS...]: one configuration at RATE.
RUNS=()
run() {
    local label=$1 loadx=$2 rate=$3 kind=$4
    shift 4
    echo "running $label: $kind ${*:-}, ${loadx}x = $rate req/s for $DURATION s"
    start_engine "$label"
    URL=$ENGINE_URL
    if [ "$kind" = sidecar ]; then
        start_sidecar "$label" "$@"
    fi
    # The engine's own queue ($QUEUE_GAUGE) every 0.5 s, as an integer
    # (vLLM writes labels and a float). vLLM's /metrics can take up to a
    # second to answer under load.
    while sleep 0.5; do
        curl -s -m 2 "$ENGINE_URL/metrics" | sed -n "s/^$QUEUE_GAUGE\({[^}]*}\)\{0,1\} \([0-9]*\).*/\2/p"
    done >"$OUT/$label.deferred" 2>/dev/null &
    POLL_PID=$!
    profile "$label" --request-rate "$rate" --arrival-pattern poisson \
        --benchmark-duration "$DURATION" --benchmark-grace-period "$GRACE"
    if [ -n "$SIDECAR_PID" ]; then
        curl -s "$URL/metrics" >"$OUT/$label.sidecar.metrics" || true
    fi
    curl -s "$ENGINE_URL/metrics" >"$OUT/$label.engine.metrics" || true
    end_run
    RUNS+=("$label|${loadx}x = $rate req/s|$OUT/$label")
}

rate_at() {
    "$PYTHON" -c "print(round($1 * $CAPACITY, 2))"
}

if [ -z "${CAPACITY:-}" ]; then
    echo "measuring capacity: $PARALLEL requests in flight for $CAPACITY_DURATION s on $ENGINE_NAME alone"
    start_engine capacity
    URL=$ENGINE_URL
    if [ "$WARMUP" != 0 ]; then
        echo "warming $ENGINE_NAME up: $PARALLEL requests in flight for $WARMUP s (discarded)"
        profile warmup --concurrency "$PARALLEL" --benchmark-duration "$WARMUP" \
            --benchmark-grace-period 30
    fi
    profile capacity --concurrency "$PARALLEL" --benchmark-duration "$CAPACITY_DURATION" \
        --benchmark-grace-period 30
    end_run
    RUNS+=("capacity|$PARALLEL in flight (closed loop)|$OUT/capacity")
    CAPACITY=$("$PYTHON" -c '
import json, pathlib, sys
data = json.loads(next(pathlib.Path(sys.argv[1]).rglob("profile_export_aiperf.json")).read_text())
print(round(data["request_throughput"]["avg"], 2))' "$OUT/capacity")
elif [ "$ENGINE" = vllm ] && [ "$WARMUP" != 0 ]; then
    # CAPACITY given: vLLM is still warmed up before the first configuration
    # (its first requests are ~25x slower, which would land in that run).
    start_engine warmup
    URL=$ENGINE_URL
    echo "warming $ENGINE_NAME up: $PARALLEL requests in flight for $WARMUP s (discarded)"
    profile warmup --concurrency "$PARALLEL" --benchmark-duration "$WARMUP" \
        --benchmark-grace-period 30
    end_run
fi
RATE=$(rate_at "$LOAD")
echo "capacity $CAPACITY req/s; offered load ${LOAD}x = $RATE req/s (Poisson) for $DURATION s per configuration"

for config in "$@"; do
    case "$config" in
        direct) run direct "$LOAD" "$RATE" direct ;;
        sidecar) run sidecar "$LOAD" "$RATE" sidecar ;;
        ttft-objective) run ttft-objective "$LOAD" "$RATE" sidecar --ttft-objective-ms "$TTFT_MS" ;;
        *=*)
            read -r -a flags <<<"${config#*=}"
            run "${config%%=*}" "$LOAD" "$RATE" sidecar "${flags[@]}"
            ;;
        *) echo "error: unknown configuration '$config'" >&2; exit 2 ;;
    esac
done

PAIRS=()
if [ "$LOW_LOAD" != 0 ] && [ "$LOW_PAIRS" -gt 0 ]; then
    LOW_RATE=$(rate_at "$LOW_LOAD")
    for i in $(seq "$LOW_PAIRS"); do
        run "direct-low$i" "$LOW_LOAD" "$LOW_RATE" direct
        run "sidecar-low$i" "$LOW_LOAD" "$LOW_RATE" sidecar
        PAIRS+=("$OUT/direct-low$i,$OUT/sidecar-low$i")
    done
fi

PROBE=${PROBE:-150}
PROBE_OSL=${PROBE_OSL:-$OSL}
if [ "$PROBE" -gt 0 ]; then
    echo "probing: $PROBE sequential requests each, direct and through the sidecar, alternating"
    start_engine probe
    start_sidecar probe
    "$PYTHON" "$HELPER" ttft-probe "$ENGINE_URL" "$URL" "$PROBE" "$PROBE_OSL" >"$OUT/probe.txt"
    end_run
fi

echo
if [ "$ENGINE" = vllm ]; then
    printf 'vLLM (scripts/vllm/serve.sh) --max-num-seqs %s, ignore_eos; ' "$PARALLEL"
else
    printf 'llama-server --parallel %s -c %s -t %s --ignore-eos; ' "$PARALLEL" "$CTX" "$THREADS"
fi
echo "$ISL prompt tokens (aiperf), $OSL output tokens;" \
    "capacity $CAPACITY req/s; $DURATION s of Poisson arrivals per configuration"
"$PYTHON" "$HELPER" engine-summary "$CAPACITY" "$TTFT_MS" "$ITL_MS" "${RUNS[@]}" -- "${PAIRS[@]}"
if [ -f "$OUT/probe.txt" ] && [ "$PROBE" -gt 0 ]; then
    echo
    cat "$OUT/probe.txt"
fi
