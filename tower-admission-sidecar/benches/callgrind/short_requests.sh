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
# target/release/tower-admission).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
N=${N:-1000}
NGINX=${NGINX:-/usr/sbin/nginx}
[ $# -gt 0 ] || set -- "$ROOT/target/release/tower-admission"
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "needs nginx at $NGINX" >&2; exit 1; }
WORK=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ENGINE_PORT=$(free_port); PROXY_PORT=$(free_port); SIDECAR_PORT=$(free_port)

nginx_conf() { # NAME BODY: a single-process nginx configuration
  mkdir -p "$WORK/$1"
  cat > "$WORK/$1/nginx.conf" <<CONF
worker_processes 1;
master_process off;
daemon off;
error_log $WORK/$1/error.log;
pid $WORK/$1/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $WORK/$1/body;
  proxy_temp_path $WORK/$1/proxy;
  fastcgi_temp_path $WORK/$1/fcgi;
  uwsgi_temp_path $WORK/$1/uwsgi;
  scgi_temp_path $WORK/$1/scgi;
  $2
}
CONF
}
nginx_conf engine "server { listen 127.0.0.1:$ENGINE_PORT; location / { default_type application/json; return 200 '{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}'; } }"
nginx_conf proxy "upstream engine { server 127.0.0.1:$ENGINE_PORT; keepalive 512; }
  server { listen 127.0.0.1:$PROXY_PORT; location / { proxy_pass http://engine; proxy_http_version 1.1;
    proxy_set_header Connection \"\"; proxy_buffering off; proxy_request_buffering off; } }"

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

until_up() { for _ in $(seq 1 120); do python3 "$WORK/client.py" "$1" 1 2>/dev/null && return 0; sleep 0.5; done; echo "port $1 never answered" >&2; exit 1; }

# LABEL PORT COMMAND...: the instructions of COMMAND's process while it
# serves N requests, after a warm-up, zeroed and dumped by callgrind_control.
measure() {
  local label=$1 port=$2 key=$((++measured)); shift 2
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$key.%p" "$@" >"$WORK/$key.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  until_up "$port"
  python3 "$WORK/client.py" "$port" 300
  callgrind_control -z "$pid" >/dev/null 2>&1
  python3 "$WORK/client.py" "$port" "$N"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local file total
  file=$(ls -t "$WORK"/cg."$key".*.1 | head -n 1)
  total=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '| %s | %d | %d |\n' "$label" "$total" "$((total / N))"
}

measured=0
until_up "$ENGINE_PORT"
echo "user-space instructions per short request (callgrind; $N sequential POSTs on one keep-alive connection, after 300 to warm up)"
echo
echo "| proxy | instructions | per request |"
echo "|---|---:|---:|"
measure nginx "$PROXY_PORT" "$NGINX" -c "$WORK/proxy/nginx.conf" -p "$WORK/proxy"
for binary in "$@"; do
  measure "sidecar $binary" "$SIDECAR_PORT" \
    "$binary" --listen "127.0.0.1:$SIDECAR_PORT" --upstream "http://127.0.0.1:$ENGINE_PORT" --max-num-seqs 64
done
