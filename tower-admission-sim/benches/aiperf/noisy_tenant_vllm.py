"""The noisy tenant (issue 37) through the sidecar in front of the real vLLM.

One tenant, `steady`, sends short streaming chat completions at a modest
rate from the start; another, `flood`, sends long prompts from FLOOD_START
on at a rate above what vLLM serves. The same seeded arrival trace (times,
prompts, output lengths) is replayed against each configuration:

    direct          the client -> vLLM (its own unbounded queue)
    sidecar         the client -> tower-admission, its defaults
                    (--max-num-seqs 4: 4 admitted, a FIFO queue of 8)
    tenant-limits   the sidecar with each API key its own tenant
                    (--api-key K1 --api-key K2 --tenant-from-api-key) and
                    per-tenant limits: --tenant-request-limit,
                    --tenant-token-limit (with --estimate-cost),
                    --tenant-queue-limit
    fair            (not by default) the sidecar with API-key tenants only:
                    fair queueing, no limits
    flood-named     (not by default) tenant-limits with the keys named
                    (--api-key-file: `steady K1`, `flood K2`) and the
                    flood bounded by name, --tenant-limit
                    flood=FLOOD_REQUEST_LIMIT:FLOOD_TOKEN_LIMIT:FLOOD_QUEUE_LIMIT
                    (by default 1 request; the rest as for every tenant)

and one markdown table is printed: steady's p50/p95 TTFT (time to its first
content chunk, measured here) before the flood and during it, steady's
goodput (completed with TTFT <= TTFT_MS), how each tenant's requests were
answered, and what vLLM's /metrics showed (polled every 0.5 s: the largest
vllm:num_requests_waiting, the mean vllm:num_requests_running and largest
vllm:kv_cache_usage_perc during the flood, vllm:num_preemptions_total).

    VLLM_BIN=... VLLM_TINY_MODEL=... SIDECAR=target/release/tower-admission \\
        /work/aiperf-venv/bin/python tower-admission-sim/benches/aiperf/noisy_tenant_vllm.py
    ... noisy_tenant_vllm.py direct tenant-limits fair     # a choice of configurations

Run from anywhere with a python that has aiohttp and tokenizers (aiperf's
virtualenv has both). One vLLM (scripts/vllm/serve.sh, --max-num-seqs 4,
16 MiB of KV: 8,192 tokens) is started for the whole run, warmed up with a
discarded closed-loop run, and its flood capacity measured (FLOOD requests,
4 in flight); VLLM_EXTRA_ARGS go to that one vLLM, so a configuration
with vLLM's --long-prefill-token-threshold and one without are two runs
of this script:

    VLLM_EXTRA_ARGS='--long-prefill-token-threshold 256' ... noisy_tenant_vllm.py flood-named tenant-limits
    ... noisy_tenant_vllm.py flood-named tenant-limits     # the same trace, no threshold

 each configuration starts once vLLM shows nothing running or
waiting (this client's leftover requests are cancelled after GRACE s, and
vLLM aborts a request whose client went away). About 7-8 minutes with the
defaults (three configurations).

Settings (environment):
  SEED=1                  the trace's seed
  DURATION=90             seconds of arrivals per configuration
  FLOOD_START=30          the flood's first arrival; "before" is steady
                          arriving BEFORE_FROM..FLOOD_START, "during"
                          FLOOD_START..DURATION
  BEFORE_FROM=5
  STEADY_RATE=2           steady's Poisson arrivals, requests/s
  STEADY_PROMPT=60 STEADY_OUT=32    prompt tokens (the model's tokenizer,
                          chat template excluded) and output tokens
  FLOOD_RATE=12           the flood's Poisson arrivals, requests/s (fixed, so
                          that a seed gives the same trace in every run: the
                          flood capacity measured at start varied from 5.4 to
                          10.9 req/s between two runs on the shared cores,
                          and vLLM completed 8-11.6 of them a second with the
                          flood sent direct); `auto`: FLOOD_LOAD x that
                          capacity
  FLOOD_LOAD=2
  FLOOD_PROMPT=1500 FLOOD_OUT=64
  TTFT_MS=1000            steady's objective: good = completed, TTFT <= it
  GRACE=15                seconds after the last arrival before the
                          requests still open are cancelled
  WARMUP=15 CALIBRATE=20  seconds of the discarded warm-up (steady-sized
                          requests, 4 in flight) and of the flood capacity
                          run (flood requests, 4 in flight, reported beside
                          the flood's rate; 0: skipped)
  TENANT_REQUEST_LIMIT=3 TENANT_TOKEN_LIMIT= TENANT_QUEUE_LIMIT=2
                          the tenant-limits configuration's flags; the
                          token limit, in the sidecar's estimate (prompt
                          bytes / 4 + max_tokens), defaults to that of two
                          flood requests (a third waits)
  FLOOD_REQUEST_LIMIT=1 FLOOD_TOKEN_LIMIT= FLOOD_QUEUE_LIMIT=
                          flood-named: tenant flood's own limits (empty:
                          the tenant-limits figure for every tenant)
  VLLM_EXTRA_ARGS=        more `vllm serve` flags (split as a shell would,
                          after serve.sh's own, so they override them), e.g.
                          '--long-prefill-token-threshold 256'
  SIDECAR=target/release/tower-admission (from the repository's root)
  VLLM_BIN VLLM_TINY_MODEL  as scripts/vllm/serve.sh reads them
  OUT=target/noisy-tenant-vllm   logs and per-request records (JSONL)
"""

import asyncio
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[3]
ENV = os.environ


def env_float(name, default):
    value = ENV.get(name, "")
    return float(value) if value else default


SEED = int(env_float("SEED", 1))
DURATION = env_float("DURATION", 90)
FLOOD_START = env_float("FLOOD_START", 30)
BEFORE_FROM = env_float("BEFORE_FROM", 5)
STEADY_RATE = env_float("STEADY_RATE", 2)
STEADY_PROMPT = int(env_float("STEADY_PROMPT", 60))
STEADY_OUT = int(env_float("STEADY_OUT", 32))
FLOOD_LOAD = env_float("FLOOD_LOAD", 2)
FLOOD_PROMPT = int(env_float("FLOOD_PROMPT", 1500))
FLOOD_OUT = int(env_float("FLOOD_OUT", 64))
TTFT_MS = env_float("TTFT_MS", 1000)
GRACE = env_float("GRACE", 15)
WARMUP = env_float("WARMUP", 15)
CALIBRATE = env_float("CALIBRATE", 20)
TENANT_REQUEST_LIMIT = int(env_float("TENANT_REQUEST_LIMIT", 3))
TENANT_QUEUE_LIMIT = int(env_float("TENANT_QUEUE_LIMIT", 2))
FLOOD_LIMIT = ":".join(ENV.get(f"FLOOD_{k}_LIMIT", d) for k, d in (("REQUEST", "1"), ("TOKEN", ""), ("QUEUE", ""))).rstrip(":")
VLLM_EXTRA_ARGS = shlex.split(ENV.get("VLLM_EXTRA_ARGS", ""))
MAX_NUM_SEQS = 4
MAX_MODEL_LEN = 2048
KEYS = {"steady": "K1", "flood": "K2"}
OUT = Path(ENV.get("OUT", str(ROOT / "target" / "noisy-tenant-vllm")))
SIDECAR = ENV.get("SIDECAR", str(ROOT / "target" / "release" / "tower-admission"))
MODEL_DIR = ENV.get("VLLM_TINY_MODEL", str(ROOT / "target" / "vllm" / "tiny-llama"))

WORDS = (
    "admission control keeps goodput near capacity when the offered load is far above "
    "what the engine can serve the gate answers the excess at once so that admitted "
    "requests meet their first token objective tenant flood steady chat prompt token "
    "queue slot cache block prefill decode batch stream latency budget limit fair share "
    "river mountain window garden lantern copper orange silver market harbour winter "
    "summer autumn spring morning evening letter number table chair paper pencil"
).split()


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the trace


class Prompts:
    """Prompts of a given length in the model's own tokens, each distinct
    from its first words on (so vLLM's prefix cache saves no prefill)."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

    def make(self, rng, tokens):
        words = [f"{rng.randrange(10**6)}"] + [rng.choice(WORDS) for _ in range(tokens)]
        # the first cut: about as many words as tokens is too long; trim by halves
        lo, hi = 1, len(words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self.tok.encode(" ".join(words[:mid])).ids) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        return " ".join(words[:lo])

    def count(self, text):
        return len(self.tok.encode(text).ids)


def poisson(rng, rate, start, end):
    t, times = start, []
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= end:
            return times
        times.append(t)
    return times


def trace(prompts, flood_rate):
    """The seeded arrivals: (time, tenant, prompt, max_tokens), by time."""
    rng = random.Random(SEED)
    arrivals = [(t, "steady") for t in poisson(rng, STEADY_RATE, 0.0, DURATION)]
    arrivals += [(t, "flood") for t in poisson(rng, flood_rate, FLOOD_START, DURATION)]
    arrivals.sort()
    out = []
    for t, tenant in arrivals:
        if tenant == "steady":
            out.append((t, tenant, prompts.make(rng, STEADY_PROMPT), STEADY_OUT))
        else:
            out.append((t, tenant, prompts.make(rng, FLOOD_PROMPT), FLOOD_OUT))
    return out


def estimate(prompt, max_tokens):
    """The sidecar's --estimate-cost figure without a tokenizer: prompt
    bytes / 4 plus max_tokens (src/http/estimate.rs)."""
    return len(prompt.encode()) // 4 + max_tokens


# ---------------------------------------------------------------- one request


def body(prompt, max_tokens):
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


async def request(session, url, tenant, prompt, max_tokens, record):
    """One streaming chat completion; fills `record` as it goes (so a
    cancelled request keeps what it saw)."""
    record["sent"] = time.monotonic()
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body(prompt, max_tokens), headers=headers) as resp:
            record["status"] = resp.status
            reason = resp.headers.get("x-admission-rejection-reason")
            if reason:
                record["reason"] = reason
            if resp.status != 200:
                await resp.read()
                record["end"] = time.monotonic()
                return
            chunks, last, gap = 0, None, 0.0
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    record["done"] = True
                    break
                if b'"error"' in line[:40]:
                    record["stream_error"] = True
                    continue
                if b'"content":"' in line and b'"content":""' not in line:
                    now = time.monotonic()
                    if last is None:
                        record["first"] = now
                    else:
                        gap = max(gap, now - last)
                    last = now
                    chunks += 1
                    record["chunks"], record["last"], record["max_gap"] = chunks, last, gap
                elif b'"usage":{' in line and b'"choices":[]' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    record["tokens"] = usage.get("completion_tokens")
            record["end"] = time.monotonic()
    except asyncio.CancelledError:
        record["cancelled"] = True
        raise
    except Exception as exc:  # recorded, not fatal
        record["error"] = type(exc).__name__
        record["end"] = time.monotonic()


async def replay(url, arrivals, stop_after):
    """Sends each arrival at its time (from now); cancels what is still
    open `stop_after` s after the start. Returns the records."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    records = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic()
        tasks = []

        async def one(at, tenant, prompt, max_tokens):
            record = {"at": at, "tenant": tenant, "start": start}
            records.append(record)
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await request(session, url, tenant, prompt, max_tokens, record)

        for at, tenant, prompt, max_tokens in arrivals:
            tasks.append(asyncio.create_task(one(at, tenant, prompt, max_tokens)))
        done, pending = await asyncio.wait(tasks, timeout=stop_after)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stopped = time.monotonic()
    for record in records:
        record["stopped"] = stopped
    return records


async def closed_loop(url, make, seconds, parallel=MAX_NUM_SEQS):
    """`parallel` requests in flight for `seconds`; completed requests/s."""
    connector = aiohttp.TCPConnector(limit=0)
    done = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        end = time.monotonic() + seconds

        async def worker(i):
            nonlocal done
            rng = random.Random(1000 + i)
            while time.monotonic() < end:
                tenant, prompt, max_tokens = make(rng)
                record = {}
                await request(session, url, tenant, prompt, max_tokens, record)
                if record.get("done") and time.monotonic() <= end:
                    done += 1

        await asyncio.gather(*(worker(i) for i in range(parallel)))
    return done / seconds


# ---------------------------------------------------------------- metrics


def gauges(text):
    """vLLM's gauges and counters of interest from its /metrics text."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not m:
            continue
        name, value = m.group(1), float(m.group(3))
        if name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
        ):
            out[name] = out.get(name, 0.0) + value
    return out


async def get_text(session, url, headers=None):
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=3)) as resp:
            return await resp.text()
    except Exception:
        return ""


async def poll_engine(engine_url, samples, stop):
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            text = await get_text(session, f"{engine_url}/metrics")
            if text:
                samples.append((time.monotonic(), gauges(text)))
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass


async def wait_idle(engine_url, limit=180):
    async with aiohttp.ClientSession() as session:
        for _ in range(limit * 2):
            g = gauges(await get_text(session, f"{engine_url}/metrics"))
            if g and g.get("vllm:num_requests_running", 1) == 0 and g.get("vllm:num_requests_waiting", 1) == 0:
                return
            await asyncio.sleep(0.5)
    raise SystemExit("error: vLLM still busy 3 minutes after a run")


# ---------------------------------------------------------------- processes


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def start_vllm():
    port = free_port()
    logf = open(OUT / "vllm.log", "w")
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "vllm" / "serve.sh"), str(port), *VLLM_EXTRA_ARGS],
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(3000):  # 5 minutes
            if proc.poll() is not None:
                break
            try:
                async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return proc, url
            except Exception:
                pass
            await asyncio.sleep(0.1)
    stop(proc)
    raise SystemExit("error: vLLM did not become healthy; see " + str(OUT / "vllm.log"))


async def start_sidecar(label, engine_url, flags):
    logf = open(OUT / f"{label}.sidecar.log", "w")
    cmd = [SIDECAR, "--listen", "127.0.0.1:0", "--upstream", engine_url, "--max-num-seqs", str(MAX_NUM_SEQS), *flags]
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    want = f'admission_engine_request_limit{{dp_rank="0"}} {MAX_NUM_SEQS}'
    url = None
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            if proc.poll() is not None:
                break
            if url is None:
                m = re.search(r"^listening on (http:\S+)", (OUT / f"{label}.sidecar.log").read_text(), re.M)
                url = m.group(1) if m else None
            if url:
                text = await get_text(session, f"{url}/metrics", {"Authorization": "Bearer K1"})
                if want in text:
                    return proc, url, cmd
            await asyncio.sleep(0.05)
    stop(proc)
    raise SystemExit(f"error: the sidecar did not start; see {OUT / (label + '.sidecar.log')}")


# ---------------------------------------------------------------- the tables


def pct(values, q):
    """Nearest-rank percentile; inf (a request with no first token by the
    end) sorts last."""
    if not values:
        return None
    values = sorted(values)
    return values[max(0, math.ceil(q / 100 * len(values)) - 1)]


def ms(value):
    if value is None:
        return "-"
    if math.isinf(value):
        return "unanswered"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.0f} ms"


def window(records, tenant, lo, hi):
    return [r for r in records if r["tenant"] == tenant and lo <= r["at"] < hi]


def ttfts(records):
    """TTFT of each request that was not refused: measured, or inf when no
    content came before the run stopped (or the request failed)."""
    out = []
    for r in records:
        if r.get("status") not in (None, 200):
            continue
        out.append(r["first"] - r["sent"] if "first" in r else math.inf)
    return out


def good(r):
    return bool(
        r.get("status") == 200
        and r.get("done")
        and not r.get("stream_error")
        and "first" in r
        and r["first"] - r["sent"] <= TTFT_MS / 1000
    )


def answers(records):
    """How a tenant's requests were answered: completed, refused by status
    (and reason), unanswered (cancelled at the end), failed."""
    counts = {}
    for r in records:
        if r.get("status") == 200 and r.get("done") and not r.get("stream_error"):
            key = "ok"
        elif r.get("status") == 200 and r.get("stream_error"):
            key = "200+error"
        elif r.get("status") not in (None, 200):
            key = str(r["status"]) + (f" {r['reason']}" if r.get("reason") else "")
        elif r.get("cancelled"):
            key = "unanswered"
        else:
            key = r.get("error", "failed")
        counts[key] = counts.get(key, 0) + 1
    order = ["ok"]
    return ", ".join(
        f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (kv[0] not in order, kv[0]))
    )


def engine_figures(samples, start):
    during = [g for t, g in samples if t - start >= FLOOD_START]
    all_ = [g for _, g in samples]
    if not all_:
        return {}
    pre = [g.get("vllm:num_preemptions_total", 0) for g in all_]
    return {
        "waiting_max": max(g.get("vllm:num_requests_waiting", 0) for g in all_),
        "running_mean": statistics.mean(g.get("vllm:num_requests_running", 0) for g in during) if during else None,
        "kv_max": max(g.get("vllm:kv_cache_usage_perc", 0) for g in all_),
        "preemptions": max(pre) - min(pre),
    }


def summarize(label, records, samples, sidecar_metrics):
    start = records[0]["start"] if records else 0
    before = window(records, "steady", BEFORE_FROM, FLOOD_START)
    during = window(records, "steady", FLOOD_START, DURATION)
    flood = window(records, "flood", FLOOD_START, DURATION)
    tb, td = ttfts(before), ttfts(during)
    p95b, p95d = pct(tb, 95), pct(td, 95)
    ratio = "-"
    if p95b and p95d is not None:
        ratio = "∞" if math.isinf(p95d) else f"{p95d / p95b:.1f}×"
    span = DURATION - FLOOD_START
    flood_done = [r for r in flood if r.get("status") == 200 and r.get("done")]
    eng = engine_figures(samples, start)
    return {
        "label": label,
        "before": f"{ms(pct(tb, 50))} / {ms(p95b)}",
        "during": f"{ms(pct(td, 50))} / {ms(p95d)}",
        "ratio": ratio,
        "good_before": f"{sum(map(good, before))}/{len(before)}",
        "good_during": f"{sum(map(good, during))}/{len(during)}",
        "good_per_s": f"{sum(map(good, during)) / span:.2f}",
        "steady_answers": answers(during),
        "flood_answers": answers(flood),
        "flood_done_per_s": f"{len(flood_done) / span:.2f}",
        "waiting_max": f"{eng.get('waiting_max', 0):.0f}" if eng else "-",
        "running_mean": f"{eng['running_mean']:.2f}" if eng.get("running_mean") is not None else "-",
        "kv_max": f"{eng.get('kv_max', 0) * 100:.0f}%" if eng else "-",
        "preemptions": f"{eng.get('preemptions', 0):.0f}" if eng else "-",
        "sidecar": sidecar_metrics,
    }


def print_table(rows, flood_rate, capacity, cmds, costs):
    print(
        f"vLLM (scripts/vllm/serve.sh) --max-num-seqs {MAX_NUM_SEQS}, 8,192 tokens of KV, ignore_eos; "
        f"seed {SEED}; steady {STEADY_RATE:g} req/s from 0 s ({STEADY_PROMPT} prompt tokens, "
        f"{STEADY_OUT} out); flood {flood_rate:g} req/s from {FLOOD_START:g} s ({FLOOD_PROMPT} prompt "
        f"tokens, {FLOOD_OUT} out)"
        + (f", {flood_rate / capacity:.1f}x the {capacity:.2f} req/s vLLM completed of them alone (4 in flight)" if capacity else "")
        + f"; {DURATION:g} s of arrivals, open requests cancelled {GRACE:g} s after"
        + (f"; vLLM started with {shlex.join(VLLM_EXTRA_ARGS)}" if VLLM_EXTRA_ARGS else "")
    )
    print(
        f"before: steady arriving {BEFORE_FROM:g}-{FLOOD_START:g} s; during: {FLOOD_START:g}-{DURATION:g} s; "
        f"good: completed with TTFT <= {TTFT_MS:g} ms (measured by this client from sending); "
        "TTFT percentiles over steady's requests not refused, 'unanswered' when the percentile "
        "falls on one with no first token by the end; vLLM figures polled every 0.5 s "
        "(running: mean during the flood)"
    )
    print(f"sidecar's estimates (prompt bytes / 4 + max_tokens): steady ~{costs[0]}, flood ~{costs[1]}")
    print()
    print(
        "| configuration | steady p50 / p95 TTFT before | steady p50 / p95 TTFT during | p95 × before "
        "| steady good before | steady good during | steady good/s during | steady during: answers "
        "| flood: answers | flood completed/s | vLLM waiting max | vLLM running mean | KV max | preemptions |"
    )
    print("|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['label']} | {r['before']} | {r['during']} | {r['ratio']} | {r['good_before']} "
            f"| {r['good_during']} | {r['good_per_s']} | {r['steady_answers']} | {r['flood_answers']} "
            f"| {r['flood_done_per_s']} | {r['waiting_max']} | {r['running_mean']} | {r['kv_max']} | {r['preemptions']} |"
        )
    print()
    for label, cmd in cmds:
        print(f"{label}: {cmd}")


def sidecar_summary(text):
    """Rejections by reason and the goodput counter from the sidecar's
    /metrics."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^admission_(rejection_total|goodput_requests_total|finished_requests_total)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            reason = re.search(r'reason="([^"]+)"', m.group(2) or "")
            key = m.group(1) + (f"[{reason.group(1)}]" if reason else "")
            out[key] = out.get(key, 0) + float(m.group(3))
    return out


# ---------------------------------------------------------------- main


CONFIGS = {
    "direct": None,
    "sidecar": [],
    "fair": ["--api-key", "K1", "--api-key", "K2", "--tenant-from-api-key"],
    "tenant-limits": None,  # filled in main: depends on the flood's estimate
    "flood-named": None,  # likewise, and the key file
}


async def main(argv):
    names = argv or ["direct", "sidecar", "tenant-limits"]
    for name in names:
        if name not in CONFIGS:
            raise SystemExit(f"error: unknown configuration {name!r} (one of {', '.join(CONFIGS)})")
    OUT.mkdir(parents=True, exist_ok=True)
    prompts = Prompts(MODEL_DIR)
    rng = random.Random(SEED + 99)
    sample_steady = prompts.make(rng, STEADY_PROMPT)
    sample_flood = prompts.make(rng, FLOOD_PROMPT)
    costs = (estimate(sample_steady, STEADY_OUT), estimate(sample_flood, FLOOD_OUT))
    token_limit = int(env_float("TENANT_TOKEN_LIMIT", 2 * costs[1] + costs[1] // 2))
    limits = [
        "--estimate-cost",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--tenant-request-limit", str(TENANT_REQUEST_LIMIT),
        "--tenant-token-limit", str(token_limit),
        "--tenant-queue-limit", str(TENANT_QUEUE_LIMIT),
    ]  # fmt: skip
    CONFIGS["tenant-limits"] = CONFIGS["fair"] + limits
    keys = OUT / "keys.txt"
    keys.write_text("".join(f"{tenant} {key}\n" for tenant, key in KEYS.items()))
    CONFIGS["flood-named"] = [
        "--api-key-file", str(keys), "--tenant-from-api-key",
        *limits,
        "--tenant-limit", f"flood={FLOOD_LIMIT}",
    ]  # fmt: skip
    log(
        f"prompts: steady {prompts.count(sample_steady)} tokens ({len(sample_steady)} bytes), "
        f"flood {prompts.count(sample_flood)} tokens ({len(sample_flood)} bytes); estimates {costs}"
    )

    engine, engine_url = None, None
    sidecar = None
    try:
        log("starting vLLM (scripts/vllm/serve.sh)")
        t0 = time.monotonic()
        engine, engine_url = await start_vllm()
        log(f"vLLM healthy after {time.monotonic() - t0:.0f} s at {engine_url}")
        log(f"vLLM flags beyond serve.sh's: {shlex.join(VLLM_EXTRA_ARGS) or 'none'}")
        if WARMUP > 0:
            log(f"warm-up: steady-sized requests, 4 in flight, {WARMUP:g} s (discarded)")
            await closed_loop(engine_url, lambda r: ("steady", prompts.make(r, STEADY_PROMPT), STEADY_OUT), WARMUP)
        capacity = None
        if CALIBRATE > 0:
            await wait_idle(engine_url)
            capacity = await closed_loop(engine_url, lambda r: ("flood", prompts.make(r, FLOOD_PROMPT), FLOOD_OUT), CALIBRATE)
            log(f"flood capacity: {capacity:.2f} req/s (4 in flight, {CALIBRATE:g} s)")
        if ENV.get("FLOOD_RATE", "12") == "auto":
            flood_rate = round(FLOOD_LOAD * (capacity or 0), 1)
        else:
            flood_rate = env_float("FLOOD_RATE", 12)
        if flood_rate <= 0:
            raise SystemExit("error: FLOOD_RATE=auto needs CALIBRATE > 0")
        arrivals = trace(prompts, flood_rate)
        log(f"trace: {sum(a[1] == 'steady' for a in arrivals)} steady, {sum(a[1] == 'flood' for a in arrivals)} flood arrivals")
        rows, cmds = [], []
        for name in names:
            await wait_idle(engine_url)
            flags = CONFIGS[name]
            url = engine_url
            if flags is not None:
                sidecar, url, cmd = await start_sidecar(name, engine_url, flags)
                cmds.append((name, "tower-admission " + " ".join(cmd[1:]).replace(engine_url, "$VLLM").replace(str(OUT), "$OUT")))
            log(f"running {name}")
            samples, halt = [], asyncio.Event()
            poller = asyncio.create_task(poll_engine(engine_url, samples, halt))
            records = await replay(url, arrivals, DURATION + GRACE)
            halt.set()
            await poller
            metrics = {}
            if sidecar is not None:
                async with aiohttp.ClientSession() as session:
                    text = await get_text(session, f"{url}/metrics", {"Authorization": "Bearer K1"})
                (OUT / f"{name}.sidecar.metrics").write_text(text)
                metrics = sidecar_summary(text)
                stop(sidecar)
                sidecar = None
            with open(OUT / f"{name}.records.jsonl", "w") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
            with open(OUT / f"{name}.engine.jsonl", "w") as f:
                for t, g in samples:
                    f.write(json.dumps({"t": t - records[0]["start"], **g}) + "\n")
            row = summarize(name, records, samples, metrics)
            rows.append(row)
            log(f"  {name}: steady before {row['before']}, during {row['during']}; {row['steady_answers']}; sidecar {metrics}")
        print()
        print_table(rows, flood_rate, capacity, cmds, costs)
        for row in rows:
            if row["sidecar"]:
                print(f"{row['label']} sidecar /metrics: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(row["sidecar"].items())))
    finally:
        stop(sidecar)
        stop(engine)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
