#!/usr/bin/env python3
"""Re-check the llama-server facts written down in scripts/llama/README.md.

Talks only to a llama-server already listening on 127.0.0.1 (start it with
scripts/llama/serve.sh).  Every loop is bounded; the whole run takes a few seconds.

Usage: python3 scripts/llama/probe.py PORT [burst|disconnect|overflow|speed|all]
Standard library only.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


def metrics(port: int) -> dict[str, float]:
    c = http.client.HTTPConnection(HOST, port, timeout=10)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in body.splitlines():
        m = re.match(r"^(llamacpp:\w+) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def chat_body(max_tokens: int, stream: bool = True, content: str = "Hello") -> bytes:
    return json.dumps({
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": max_tokens,
    }).encode()


def stream_chat(port: int, max_tokens: int, result: dict) -> None:
    """One streaming chat completion; records time to first byte/content and total."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection(HOST, port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=chat_body(max_tokens),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    result["status"] = r.status
    result["t_headers"] = time.monotonic() - t0
    chunks = 0
    first = None
    done = False
    buf = b""
    while True:
        data = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.strip()
            if ev == b"data: [DONE]":
                done = True
            elif ev.startswith(b"data: "):
                obj = json.loads(ev[6:])
                delta = obj["choices"][0]["delta"] if obj.get("choices") else {}
                if delta.get("content"):
                    chunks += 1
                    if first is None:
                        first = time.monotonic() - t0
    result["t_first_content"] = first
    result["t_total"] = time.monotonic() - t0
    result["content_chunks"] = chunks
    result["done"] = done
    c.close()


def burst(port: int, n: int = 6, max_tokens: int = 64) -> None:
    results = [dict() for _ in range(n)]
    threads = [threading.Thread(target=stream_chat, args=(port, max_tokens, results[i]))
               for i in range(n)]
    samples = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            m = metrics(port)
            samples.append((m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]))
            time.sleep(0.002)

    s = threading.Thread(target=sampler)
    s.start()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wall = time.monotonic() - t0
    stop.set()
    s.join()
    print(f"burst: {n} x {max_tokens} tokens, wall {wall*1000:.0f} ms")
    for i, r in enumerate(sorted(results, key=lambda r: r["t_total"])):
        print(f"  req: status {r['status']} headers {r['t_headers']*1000:.0f} ms first content {r['t_first_content']*1000:.0f} ms "
              f"total {r['t_total']*1000:.0f} ms chunks {r['content_chunks']} [DONE] {r['done']}")
    print(f"  metrics samples: {len(samples)}; max requests_processing "
          f"{max(p for p, _ in samples):.0f}; max requests_deferred {max(d for _, d in samples):.0f}")
    distinct = sorted(set(samples))
    print(f"  distinct (processing, deferred) pairs seen: {distinct}")


def speed(port: int, max_tokens: int = 64, runs: int = 3) -> None:
    for _ in range(runs):
        t0 = time.monotonic()
        c = http.client.HTTPConnection(HOST, port, timeout=60)
        c.request("POST", "/v1/chat/completions", body=chat_body(max_tokens, stream=False),
                  headers={"Content-Type": "application/json"})
        obj = json.loads(c.getresponse().read())
        wall = time.monotonic() - t0
        t = obj["timings"]
        print(f"speed: {max_tokens} tokens wall {wall*1000:.1f} ms; predicted_ms {t['predicted_ms']:.1f} "
              f"({t['predicted_per_second']:.0f} tok/s), prompt_n {t['prompt_n']} prompt_ms {t['prompt_ms']:.1f}")
        c.close()


def disconnect(port: int, max_tokens: int = 2000) -> None:
    """Start a long stream, read a few events, close the socket, watch the metrics."""
    sock = socket.create_connection((HOST, port), timeout=30)
    body = chat_body(max_tokens)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    t0 = time.monotonic()
    while got.count(b"data: ") < 5:
        got += sock.recv(4096)
    print(f"disconnect: read 5 events in {(time.monotonic()-t0)*1000:.0f} ms; "
          f"metrics now {metrics(port)['llamacpp:requests_processing']:.0f} processing")
    before = metrics(port)["llamacpp:tokens_predicted_total"]
    sock.close()
    tc = time.monotonic()
    seen = []
    while time.monotonic() - tc < 3:
        m = metrics(port)
        seen.append((round((time.monotonic() - tc) * 1000), m["llamacpp:requests_processing"]))
        if m["llamacpp:requests_processing"] == 0:
            break
        time.sleep(0.005)
    after = metrics(port)["llamacpp:tokens_predicted_total"]
    print(f"  after close: (ms, requests_processing) {seen[:3]} ... {seen[-1]}")
    print(f"  tokens_predicted_total grew by {after - before:.0f} after the close "
          f"(the request asked for {max_tokens})")


def overflow(port: int) -> None:
    for label, content, mt in [("prompt ~2100 tokens", "hello " * 2100, 8),
                               ("prompt 29 tokens, max_tokens 5000", "Hello", 5000)]:
        for stream in (False, True):
            c = http.client.HTTPConnection(HOST, port, timeout=60)
            c.request("POST", "/v1/chat/completions", body=chat_body(mt, stream=stream, content=content),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            body = r.read()
            text = body.decode(errors="replace")
            if len(text) > 600:
                text = text[:300] + " ... " + text[-300:]
            print(f"overflow [{label}, stream={stream}]: {r.status} {text}")
            c.close()


def main() -> None:
    port = int(sys.argv[1])
    what = sys.argv[2] if len(sys.argv) > 2 else "all"
    if what in ("speed", "all"):
        speed(port)
    if what in ("burst", "all"):
        burst(port)
    if what in ("disconnect", "all"):
        disconnect(port)
    if what in ("overflow", "all"):
        overflow(port)


if __name__ == "__main__":
    main()
