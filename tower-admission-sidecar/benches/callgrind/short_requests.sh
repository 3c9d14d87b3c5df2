#!/usr/bin/env bash
# User-space instructions per short request, counted by callgrind: the
# sidecar and nginx (a plain reverse proxy, keep-alive to the engine), each
# in front of the same engine (nginx answering a fixed chat completion), in
# one run. Instruction counts do not move with the machine's load, so a
# change of the sidecar's per-request work shows here when a timed
# benchmark on shared cores cannot see it (BENCHMARKS.md, "The sidecar
# against nginx"). The kernel's share (sockets) is not counted.
#
#   cargo build --release -p tower-admission-sidecar
#   bash tower-admission-sidecar/benches/callgrind/short_requests.sh [SIDECAR_BINARY...]
#
# Needs valgrind and nginx (Debian: apt-get install valgrind nginx-light)
# and python3. N=1000 requests (after 300 to warm up) on one keep-alive
# connection, sequentially; each binary given is measured (default:
# target/release/tower-admission), with SIDECAR_ARGS added to its flags.
# KEEP=DIR keeps each callgrind dump there, for `callgrind_annotate
# --inclusive=yes`.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "$ROOT/tower-admission-sidecar/benches/callgrind/common.sh"
N=${N:-1000}
[ $# -gt 0 ] || set -- "$ROOT/target/release/tower-admission"
ENGINE_PORT=$(free_port); PROXY_PORT=$(free_port); SIDECAR_PORT=$(free_port)

nginx_conf engine "server { listen 127.0.0.1:$ENGINE_PORT; location / { default_type application/json; return 200 '{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}'; } }"
nginx_proxy_conf

"$NGINX" -c "$WORK/engine/nginx.conf" -p "$WORK/engine" >/dev/null 2>&1 &
pids+=($!)

# N POSTs of a small chat completion on one keep-alive connection.
cat > "$WORK/client.py" <<'PY'
import http.client, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for _ in range(n):
    for attempt in range(2):
        try:
            c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            r = c.getresponse(); r.read()
            break
        except (http.client.RemoteDisconnected, ConnectionError):
            # A keep-alive connection the proxy closed: a new one, once.
            c.close()
            if attempt:
                raise
    if r.status != 200:
        sys.exit(f"status {r.status}")
PY

client() { echo "python3 $WORK/client.py $1 $2"; }
until_up python3 "$WORK/client.py" "$ENGINE_PORT" 1
echo "user-space instructions per short request (callgrind; $N sequential POSTs on one keep-alive connection, after 300 to warm up)"
echo
echo "| proxy | instructions | per request |"
echo "|---|---:|---:|"
measure nginx "$N" "$(client "$PROXY_PORT" 300)" "$(client "$PROXY_PORT" "$N")" -- \
  "$NGINX" -c "$WORK/proxy/nginx.conf" -p "$WORK/proxy"
for binary in "$@"; do
  measure "sidecar $binary ${SIDECAR_ARGS:-}" "$N" "$(client "$SIDECAR_PORT" 300)" "$(client "$SIDECAR_PORT" "$N")" -- \
    "$binary" --listen "127.0.0.1:$SIDECAR_PORT" --upstream "http://127.0.0.1:$ENGINE_PORT" --max-num-seqs 64 ${SIDECAR_ARGS:-}
done
