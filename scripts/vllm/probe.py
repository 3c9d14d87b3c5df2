#!/usr/bin/env python3
"""Re-check what README.md says of vLLM against a running server (stdlib only).

    python3 scripts/vllm/probe.py PORT [speed|burst|disconnect|cap|all] [--n 16] [--tokens 100]

PORT is a `vllm serve` started by serve.sh (or any vLLM on 127.0.0.1).
  speed       one streamed chat of --tokens tokens: tokens/s, chunks
  burst       --n concurrent streams of --tokens tokens; polls /metrics
              every 50 ms: (running, waiting) seen, scrape times, statuses
  disconnect  a stream closed after 5 events, then a non-streaming request
              whose socket closes: time until num_requests_running is 0
  cap         --n streams sent together (for a server started with
              --max-num-queued-reqs): statuses, in-stream errors, bodies
Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


def metrics(port: int) -> dict[str, float]:
    """GET /metrics: {'name{labels}': value} for vllm: and http_ series."""
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        try:
            out[series] = float(value)
        except ValueError:
            pass
    return out


def gauge(m: dict[str, float], name: str, engine: str | None = None) -> float:
    total = 0.0
    for series, value in m.items():
        if series.split("{")[0] == name and (engine is None or f'engine="{engine}"' in series):
            total += value
    return total


def chat(max_tokens: int, stream: bool, headers: dict | None = None) -> bytes:
    return json.dumps({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about admission control."}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
    }).encode()


def post(port: int, body: bytes, headers: dict | None = None):
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def events_of(text: str) -> list[str]:
    return [e[len("data: "):] for e in (x.strip() for x in text.split("\n\n")) if e.startswith("data: ")]


def speed(port: int, tokens: int) -> None:
    t0 = time.monotonic()
    conn, resp = post(port, chat(tokens, True))
    first = None
    text = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        if first is None and b'"content":"' in chunk and b'"content":""' not in chunk:
            first = time.monotonic() - t0
        text += chunk
    wall = time.monotonic() - t0
    evs = events_of(text.decode())
    content = [e for e in evs if '"content":"' in e]
    print(f"speed: {tokens} tokens, {len(evs)} events ({len(content)} with content), "
          f"ttft {first:.3f} s, wall {wall:.2f} s, {tokens / wall:.0f} tokens/s")


def burst(port: int, n: int, tokens: int) -> None:
    results = [None] * n
    t0 = time.monotonic()

    def one(i: int) -> None:
        try:
            conn, resp = post(port, chat(tokens, True))
            head = time.monotonic() - t0
            text = resp.read().decode()
            results[i] = (resp.status, head, time.monotonic() - t0, len(events_of(text)))
        except Exception as e:  # noqa: BLE001
            results[i] = ("error", repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    seen, scrapes = [], []
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        s = time.monotonic()
        m = metrics(port)
        scrapes.append(time.monotonic() - s)
        seen.append((gauge(m, "vllm:num_requests_running"), gauge(m, "vllm:num_requests_waiting")))
        time.sleep(0.05)
    for t in threads:
        t.join()
    dedup = [x for i, x in enumerate(seen) if i == 0 or x != seen[i - 1]]
    print(f"burst: {n} x {tokens} tokens, wall {time.monotonic() - t0:.2f} s")
    print(f"  (running, waiting) seen: {dedup}")
    print(f"  scrapes: {len(scrapes)}, max {max(scrapes) * 1000:.0f} ms, "
          f"mean {sum(scrapes) / len(scrapes) * 1000:.0f} ms")
    print(f"  (status, head s, end s, events): {sorted(results, key=lambda r: r[2] if len(r) > 2 else 0)}")


def wait_running(port: int, want: float, limit: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if gauge(metrics(port), "vllm:num_requests_running") == want:
            return time.monotonic() - t0
        time.sleep(0.01)
    return float("nan")


def raw_post(port: int, body: bytes) -> socket.socket:
    sock = socket.create_connection((HOST, port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def disconnect(port: int) -> None:
    sock = raw_post(port, chat(1900, True))
    got = b""
    deadline = time.monotonic() + 30
    while got.count(b"data: ") < 5 and time.monotonic() < deadline:
        got += sock.recv(65536)
    print(f"  stream: {wait_running(port, 1, 5):.3f} s more to see running 1")
    t0 = time.monotonic()
    sock.close()
    wait_running(port, 0, 10)
    print(f"disconnect (stream): running 0 {time.monotonic() - t0:.3f} s after the close")
    sock = raw_post(port, chat(1900, False))
    print(f"  non-streaming: {wait_running(port, 1, 10):.3f} s to see running 1")
    t0 = time.monotonic()
    sock.close()
    wait_running(port, 0, 10)
    print(f"disconnect (non-streaming): running 0 {time.monotonic() - t0:.3f} s after the close")


def cap(port: int, n: int, tokens: int) -> None:
    results = [None] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        conn.connect()
        barrier.wait()
        body = chat(tokens, True)
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        evs = events_of(text)
        errors = [e for e in evs if e.startswith('{"error"')]
        results[i] = (resp.status, resp.getheader("content-type"), len(evs), errors[:1] or text[:200] if resp.status != 200 else errors[:1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        print(f"  {r}")
    m = metrics(port)
    print("  " + json.dumps({k: v for k, v in m.items() if "rejection" in k or "request_success_total" in k}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("what", nargs="?", default="all")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=100)
    a = ap.parse_args()
    if a.what in ("speed", "all"):
        speed(a.port, a.tokens)
    if a.what in ("burst", "all"):
        burst(a.port, a.n, a.tokens)
    if a.what in ("disconnect", "all"):
        disconnect(a.port)
    if a.what == "cap":
        cap(a.port, a.n, a.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
