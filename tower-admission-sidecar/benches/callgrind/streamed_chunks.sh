#!/usr/bin/env bash
# User-space instructions per streamed chunk, counted by callgrind: the
# sidecar and nginx (a plain streaming reverse proxy, keep-alive to the
# engine, no buffering), each in front of the same engine (a Python server
# streaming OpenAI chat completion chunks, one every PACE_MS), in one run:
# the deterministic side of "CPU per 100,000 streamed chunks" (the timed
# figure moves with the machine's load; this one does not). The kernel's
# share (sockets) is not counted.
#
#   cargo build --release -p tower-admission-sidecar
#   bash tower-admission-sidecar/benches/callgrind/streamed_chunks.sh [SIDECAR_BINARY...]
#
# Needs valgrind, nginx (Debian: apt-get install valgrind nginx-light) and
# python3. STREAMS=20 streaming chat completions of CHUNKS=200 chunks each
# (after 3 to warm up), one after another on one keep-alive connection;
# paced so that each chunk is read and forwarded on its own, as a
# generating engine's are. Each binary given is measured (default:
# target/release/tower-admission), with SIDECAR_ARGS added to its flags.
# KEEP=DIR keeps the callgrind dumps. PACE_MS sets the engine's pace.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "$ROOT/tower-admission-sidecar/benches/callgrind/common.sh"
STREAMS=${STREAMS:-20}
CHUNKS=${CHUNKS:-200}
PACE_MS=${PACE_MS:-3}
[ $# -gt 0 ] || set -- "$ROOT/target/release/tower-admission"
ENGINE_PORT=$(free_port); PROXY_PORT=$(free_port); SIDECAR_PORT=$(free_port)
nginx_proxy_conf

# The engine: HTTP/1.1 keep-alive; every POST is answered with an event
# stream of `chunks` content chunks (the request's query), then [DONE].
cat > "$WORK/engine.py" <<'PY'
import asyncio, sys
port, pace = int(sys.argv[1]), float(sys.argv[2]) / 1000
CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'
DONE = b"data: [DONE]\n\n"
def chunked(data): return b"%x\r\n%s\r\n" % (len(data), data)
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(l.split(":", 1)[1]) for l in lines if l.lower().startswith("content-length:")), 0)
            await reader.readexactly(length)
            path = lines[0].split(" ")[1]
            chunks = int(path.split("chunks=")[1]) if "chunks=" in path else 1
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(chunks):
                writer.write(chunked(CHUNK))
                await writer.drain()
                await asyncio.sleep(pace)
            writer.write(chunked(DONE) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()
asyncio.run(main())
PY

# N streams of C chunks, one after another on one keep-alive connection.
cat > "$WORK/client.py" <<'PY'
import http.client, sys
port, n, chunks = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"stream":true}' % chunks
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for _ in range(n):
    c.request("POST", "/v1/chat/completions?chunks=%d" % chunks, body, {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200 or data.count(b"data: ") != chunks + 1:
        sys.exit(f"status {r.status}, {data.count(b'data: ')} events")
PY

python3 "$WORK/engine.py" "$ENGINE_PORT" "$PACE_MS" &
pids+=($!)
client() { echo "python3 $WORK/client.py $1 $2 $CHUNKS"; }
until_up python3 "$WORK/client.py" "$ENGINE_PORT" 1 1
total=$((STREAMS * CHUNKS))
echo "user-space instructions per streamed chunk (callgrind; $STREAMS streams of $CHUNKS chunks, one every $PACE_MS ms, sequential on one keep-alive connection, after 3 streams to warm up)"
echo
echo "| proxy | instructions | per chunk |"
echo "|---|---:|---:|"
measure nginx "$total" "$(client "$PROXY_PORT" 3)" "$(client "$PROXY_PORT" "$STREAMS")" -- \
  "$NGINX" -c "$WORK/proxy/nginx.conf" -p "$WORK/proxy"
for binary in "$@"; do
  measure "sidecar $binary ${SIDECAR_ARGS:-}" "$total" "$(client "$SIDECAR_PORT" 3)" "$(client "$SIDECAR_PORT" "$STREAMS")" -- \
    "$binary" --listen "127.0.0.1:$SIDECAR_PORT" --upstream "http://127.0.0.1:$ENGINE_PORT" --max-num-seqs 64 ${SIDECAR_ARGS:-}
done
