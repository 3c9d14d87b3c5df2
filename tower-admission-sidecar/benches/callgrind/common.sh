# Shared by the callgrind scripts beside it (sourced, not run): a work
# directory cleaned up on exit, free ports, single-process nginx
# configurations, and `measure`, which counts a proxy's user-space
# instructions while a client drives it.
set -euo pipefail
NGINX=${NGINX:-/usr/sbin/nginx}
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "needs nginx at $NGINX" >&2; exit 1; }
WORK=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

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

# nginx as a plain streaming reverse proxy on PROXY_PORT to ENGINE_PORT
# (keep-alive to the engine, no buffering either way): `proxy` in $WORK.
nginx_proxy_conf() {
  nginx_conf proxy "upstream engine { server 127.0.0.1:$ENGINE_PORT; keepalive 512; }
  server { listen 127.0.0.1:$PROXY_PORT; location / { proxy_pass http://engine; proxy_http_version 1.1;
    proxy_set_header Connection \"\"; proxy_buffering off; proxy_request_buffering off; } }"
}

# CLIENT... must exit 0 once the port answers; tried for up to a minute.
until_up() { for _ in $(seq 1 120); do "$@" 2>/dev/null && return 0; sleep 0.5; done; echo "never answered: $*" >&2; exit 1; }

# LABEL UNITS WARMUP_CMD MEASURED_CMD -- COMMAND...: the user-space
# instructions of COMMAND's process (under callgrind) while MEASURED_CMD
# runs, after WARMUP_CMD (each a shell string; it is also how the proxy is
# known to be up), zeroed and dumped by callgrind_control; printed as a
# table row with the count per one of UNITS. KEEP=DIR keeps each dump
# there, for `callgrind_annotate --inclusive=yes`.
measured=0
measure() {
  local label=$1 units=$2 warmup=$3 run=$4 key=$((++measured))
  shift 5
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$key.%p" "$@" >"$WORK/$key.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  until_up bash -c "$warmup"
  callgrind_control -z "$pid" >/dev/null 2>&1
  bash -c "$run"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local file total
  file=$(ls -t "$WORK"/cg."$key".*.1 | head -n 1)
  total=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '| %s | %d | %d |\n' "$label" "$total" "$((total / units))"
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$file" "$KEEP/callgrind.$key.out"; fi
}
