#!/usr/bin/env bash
# Fuzzes tower-admission's hostile-input surfaces (first-token detectors, the
# rank header) with cargo-fuzz, each target for a bounded time.
#
#   .ci/fuzz.sh                 # every target, FUZZ_SECONDS (default 20) each
#   FUZZ_SECONDS=300 .ci/fuzz.sh detect_openai_sse
#
# cargo-fuzz needs nightly compiler flags (-Z sanitizer); RUSTC_BOOTSTRAP=1
# lets the stable toolchain accept them. The fuzz crate (fuzz/) is its own
# workspace with its own target directory. A crash fails the script and
# leaves its input in fuzz/artifacts/<target>/ (replay it with
# `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> <file>`).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-20}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in "${targets[@]}"; do
    printf '\n==> fuzz %s for %ss\n' "$target" "$seconds"
    options=(-max_total_time="$seconds" -print_final_stats=1)
    # Tokens of the format (SSE fields, gRPC headers) help the fuzzer past
    # the framing into the JSON.
    if [ -f "fuzz/dictionaries/$target.dict" ]; then
        options+=(-dict="fuzz/dictionaries/$target.dict")
    fi
    status=0
    cargo fuzz run "$target" -- "${options[@]}" >"$log" 2>&1 || status=$?
    # libFuzzer's progress lines are many; keep the summary, or all on failure.
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log"
        echo "fuzz target $target failed (exit $status); input in fuzz/artifacts/$target/"
        exit "$status"
    fi
    grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
done
