"""Helpers of tower-admission-sim/benches/aiperf/run.sh and engine.sh (see there): an offline
tokenizer for aiperf, and summary tables of several aiperf runs.

    python3 aiperf_eval.py tokenizer DIR
        Trains a small byte-level BPE tokenizer with the `tokenizers`
        package (no model hub needed) and saves DIR/tokenizer.json and
        DIR/tokenizer_config.json, which aiperf loads with --tokenizer DIR.

    python3 aiperf_eval.py summary TTFT_MS TPOT_MS LABEL=ARTIFACT_DIR...
        Reads each run's profile_export_aiperf.json and prints one Markdown
        table: requests, errors (overload answers), goodput, TTFT and
        inter-token latency percentiles.

    python3 aiperf_eval.py engine-summary CAPACITY TTFT_MS ITL_MS
            LABEL|OFFERED|ARTIFACT_DIR... -- DIRECT_DIR,SIDECAR_DIR...
        engine.sh's table: per run the offered load, errors by HTTP status
        (or exception type), throughput, goodput and goodput as a fraction
        of CAPACITY, TTFT and inter-token latency percentiles, the largest
        engine queue polled (ARTIFACT_DIR.deferred, one number a line);
        then, per pair of runs after `--` (direct, then through the
        sidecar, at the same load), the sidecar's p50 TTFT difference and
        throughput ratio. For every run through a sidecar (its /metrics
        saved as ARTIFACT_DIR.sidecar.metrics), its goodput_requests_total
        beside aiperf's good requests, and aiperf's per-request records
        (profile_export.jsonl) judged by aiperf's rule (TTFT and the mean
        inter-token latency), by the sidecar's (TTFT and the mean gap
        between content chunks), by the rule of the sidecar before
        2026-12-07 (TTFT and the largest gap) and by TTFT alone.

    python3 aiperf_eval.py ttft-probe DIRECT_URL SIDECAR_URL N OSL
        One request at a time, alternating direct and through the sidecar,
        N of each (streaming chat, max_tokens OSL, a new connection each):
        median and p90 time to the first content chunk of each, and the
        median of the paired differences. Standard library only.
"""

import json
import sys
from pathlib import Path


def corpus_lines():
    """English text to train on: aiperf's own prompt corpus when it can be
    found (then the prompts aiperf builds tokenize the way it expects),
    else a generated one."""
    try:
        from importlib.resources import files

        text = (files("aiperf.dataset.generator") / "assets" / "shakespeare.txt").read_text()
        return text.splitlines()
    except Exception:  # any failure: fall back to generated text
        words = (
            "admission control keeps goodput near capacity when the offered load "
            "is far above what the engine can serve the gate answers the excess "
            "at once so that admitted requests meet their first token objective"
        ).split()
        return [" ".join(words[(i + j) % len(words)] for j in range(24)) for i in range(5000)]


def tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "eos_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"tokenizer: {out} ({tok.get_vocab_size()} tokens)")


def metric(data, name, stat):
    """A statistic of one metric of aiperf's JSON export, or None."""
    entry = data.get(name)
    if isinstance(entry, dict):
        value = entry.get(stat)
        return value if isinstance(value, (int, float)) else None
    return None


def summary(ttft_ms, tpot_ms, runs):
    rows = []
    for run in runs:
        label, _, directory = run.partition("=")
        paths = sorted(Path(directory).rglob("profile_export_aiperf.json"))
        if not paths:
            rows.append((label, None))
            continue
        rows.append((label, json.loads(paths[-1].read_text())))

    def fmt(value, unit=""):
        if value is None:
            return "-"
        if unit == "ms" and value >= 1000:
            return f"{value / 1000:.2f} s"
        if unit == "ms":
            return f"{value:.0f} ms"
        return f"{value:.2f}"

    print(
        f"goodput: requests with TTFT <= {ttft_ms} ms and inter-token latency <= {tpot_ms} ms "
        "(aiperf --goodput); errors are the gate's overload answers (529)"
    )
    print()
    header = (
        "| server | requests | ok | errors | throughput req/s | goodput req/s "
        "| p50 TTFT | p99 TTFT | p50 ITL | p99 ITL |"
    )
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, data in rows:
        if data is None:
            print(f"| {label} | no aiperf export found | | | | | | | | |")
            continue
        ok = metric(data, "request_count", "avg")
        errors = metric(data, "error_request_count", "avg") or 0
        total = None if ok is None else ok + errors
        print(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                label,
                "-" if total is None else f"{total:.0f}",
                "-" if ok is None else f"{ok:.0f}",
                f"{errors:.0f}",
                fmt(metric(data, "request_throughput", "avg")),
                fmt(metric(data, "goodput", "avg")),
                fmt(metric(data, "time_to_first_token", "p50"), "ms"),
                fmt(metric(data, "time_to_first_token", "p99"), "ms"),
                fmt(metric(data, "inter_token_latency", "p50"), "ms"),
                fmt(metric(data, "inter_token_latency", "p99"), "ms"),
            )
        )


def load_export(directory):
    paths = sorted(Path(directory).rglob("profile_export_aiperf.json"))
    return json.loads(paths[-1].read_text()) if paths else None


def error_counts(data):
    """Errors by HTTP status (or exception type when there is none)."""
    counts = {}
    for entry in data.get("error_summary") or []:
        details = entry.get("error_details") or {}
        key = str(details.get("code") or details.get("type") or "other")
        counts[key] = counts.get(key, 0) + int(entry.get("count") or 0)
    return counts


def ms(value):
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    return f"{value:.1f} ms"


def engine_summary(capacity, ttft_ms, itl_ms, runs, pairs):
    capacity = float(capacity)
    print(
        f"goodput: requests with TTFT <= {ttft_ms} ms and inter-token latency <= {itl_ms} ms "
        "(aiperf --goodput) per second; errors by status: 529 is the sidecar's overload "
        "answer (an error for aiperf); TTFT and ITL percentiles are over successful requests"
    )
    print()
    print(
        "| configuration | offered | requests | ok | errors | throughput req/s "
        "| goodput req/s | goodput / capacity | p50 TTFT | p99 TTFT | p50 ITL | p99 ITL "
        "| engine queue |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        label, offered, directory = run.split("|", 2)
        data = load_export(directory)
        if data is None:
            print(f"| {label} | {offered} | no aiperf export found | | | | | | | | | | |")
            continue
        ok = metric(data, "request_count", "avg") or 0
        errors = metric(data, "error_request_count", "avg") or 0
        by_status = error_counts(data)
        error_text = f"{errors:.0f}"
        if by_status:
            error_text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items())) + ")"
        goodput = metric(data, "goodput", "avg")
        polled = Path(directory + ".deferred")
        deferred = "-"
        if polled.exists():
            values = [int(v) for v in polled.read_text().split() if v.isdigit()]
            deferred = str(max(values)) if values else "-"
        print(
            "| {} | {} | {:.0f} | {:.0f} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                label,
                offered,
                ok + errors,
                ok,
                error_text,
                fmt2(metric(data, "request_throughput", "avg")),
                fmt2(goodput),
                "-" if goodput is None else f"{goodput / capacity:.2f}",
                ms(metric(data, "time_to_first_token", "p50")),
                ms(metric(data, "time_to_first_token", "p99")),
                ms(metric(data, "inter_token_latency", "p50")),
                ms(metric(data, "inter_token_latency", "p99")),
                deferred,
            )
        )
    goodput_counters(runs, float(ttft_ms), float(itl_ms))
    if not pairs:
        return
    print()
    print("overhead of the sidecar (same load, direct then through the sidecar):")
    print()
    print(
        "| pair | p50 TTFT direct | p50 TTFT sidecar | difference "
        "| req/s direct | req/s sidecar | ratio | tokens/s direct | tokens/s sidecar | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    diffs, ratios, token_ratios = [], [], []
    for i, pair in enumerate(pairs, 1):
        direct, _, sidecar = pair.partition(",")
        a, b = load_export(direct), load_export(sidecar)
        if a is None or b is None:
            print(f"| {i} | no aiperf export found | | | | | | | | |")
            continue
        ta, tb = metric(a, "time_to_first_token", "p50"), metric(b, "time_to_first_token", "p50")
        ra, rb = metric(a, "request_throughput", "avg"), metric(b, "request_throughput", "avg")
        oa, ob = metric(a, "output_token_throughput", "avg"), metric(b, "output_token_throughput", "avg")
        diffs.append(tb - ta)
        ratios.append(rb / ra)
        token_ratios.append(ob / oa)
        print(
            f"| {i} | {ta:.2f} ms | {tb:.2f} ms | {tb - ta:+.2f} ms | {ra:.2f} | {rb:.2f} "
            f"| {rb / ra:.3f} | {oa:.0f} | {ob:.0f} | {ob / oa:.3f} |"
        )
    if len(diffs) > 1:
        n = len(diffs)
        print(
            f"| mean | | | {sum(diffs) / n:+.2f} ms | | | {sum(ratios) / n:.3f} | | "
            f"| {sum(token_ratios) / n:.3f} |"
        )


def counter_sum(text, suffix):
    """The sum of every sample of the counter whose name ends in `suffix`
    (any prefix, any labels) in a Prometheus exposition text."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(suffix):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def record_ms(metric_value):
    """A metric of one aiperf record (profile_export.jsonl) in milliseconds:
    a number, or a list of numbers (inter_chunk_latency); None if absent."""
    if not isinstance(metric_value, dict) or metric_value.get("value") is None:
        return None
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}.get(metric_value.get("unit"), 1.0)
    value = metric_value["value"]
    if isinstance(value, list):
        return [v * scale for v in value]
    return value * scale


def record_judgements(directory, ttft_ms, itl_ms):
    """aiperf's own records of a run judged two ways: as aiperf judges them
    (TTFT and the request's average inter-token latency: output tokens by
    its tokenizer), as the sidecar judges them (TTFT and the mean gap
    between content chunks, `Objectives::met` in src/metrics/client.rs),
    and by the sidecar's rule before 2026-12-07 (the largest gap). None
    without a per-record export."""
    paths = sorted(Path(directory).rglob("profile_export.jsonl"))
    if not paths:
        return None
    counts = {"records": 0, "ok": 0, "aiperf_rule": 0, "gap_rule": 0, "largest_rule": 0,
              "ttft_miss": 0, "itl_miss": 0, "gap_miss_only": 0, "ttft_near": 0, "ttft_rule": 0}
    for line in paths[-1].read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        counts["records"] += 1
        if record.get("error"):
            continue
        metrics = record.get("metrics") or {}
        ttft = record_ms(metrics.get("time_to_first_token"))
        itl = record_ms(metrics.get("inter_token_latency"))
        gaps = record_ms(metrics.get("inter_chunk_latency")) or []
        if ttft is None:
            continue
        counts["ok"] += 1
        mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
        ttft_ok = ttft <= ttft_ms
        itl_ok = itl is not None and itl <= itl_ms
        gap_ok = mean_gap <= itl_ms
        counts["ttft_rule"] += ttft_ok
        counts["aiperf_rule"] += ttft_ok and itl_ok
        counts["gap_rule"] += ttft_ok and gap_ok
        counts["largest_rule"] += ttft_ok and (max(gaps) if gaps else 0.0) <= itl_ms
        counts["ttft_miss"] += not ttft_ok
        counts["itl_miss"] += not itl_ok
        counts["gap_miss_only"] += ttft_ok and itl_ok and not gap_ok
        counts["ttft_near"] += ttft_ms - 10 < ttft <= ttft_ms + 10
    return counts


def goodput_counters(runs, ttft_ms=None, itl_ms=None):
    """The sidecar's own goodput counter (`goodput_requests_total`, read
    from its /metrics at the end of the run) beside aiperf's count of good
    requests, for every run through a sidecar (issue 37: within 5%); then
    aiperf's records judged by the sidecar's rule (the mean gap between
    content chunks within the inter-token objective)."""
    rows, judged = [], []
    for run in runs:
        label, _, directory = run.split("|", 2)
        scraped = Path(directory + ".sidecar.metrics")
        data = load_export(directory)
        if not scraped.exists() or data is None:
            continue
        text = scraped.read_text()
        goodput = counter_sum(text, "_goodput_requests_total")
        finished = counter_sum(text, "_finished_requests_total")
        good = metric(data, "good_request_count", "avg")
        ok = metric(data, "request_count", "avg")
        if goodput is None or good is None:
            continue
        ratio = "-" if not good else f"{goodput / good:.3f}"
        rows.append(f"| {label} | {good:.0f} | {goodput:.0f} | {ratio} | {ok:.0f} | {finished:.0f} |")
        counts = None if ttft_ms is None else record_judgements(directory, ttft_ms, itl_ms)
        if counts:
            gap_ratio = "-" if not counts["gap_rule"] else f"{goodput / counts['gap_rule']:.3f}"
            judged.append(
                f"| {label} | {counts['ok']} | {counts['ttft_rule']} | {counts['aiperf_rule']} | {counts['gap_rule']} "
                f"| {counts['largest_rule']} | {goodput:.0f} | {gap_ratio} | {counts['ttft_miss']} "
                f"| {counts['itl_miss']} | {counts['gap_miss_only']} | {counts['ttft_near']} |"
            )
    if not rows:
        return
    print()
    print("the sidecar's goodput counter against aiperf's good requests (same run):")
    print()
    print(
        "| configuration | aiperf good | sidecar goodput_requests_total | ratio "
        "| aiperf ok | sidecar finished_requests_total |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row)
    if not judged:
        return
    print()
    print(
        f"aiperf's successful records judged by aiperf's rule (TTFT <= {ttft_ms:g} ms, average "
        f"inter-token latency <= {itl_ms:g} ms) and by the sidecar's (TTFT <= {ttft_ms:g} ms, "
        f"mean gap between content chunks <= {itl_ms:g} ms), by its rule before 2026-12-07 "
        f"(largest gap <= {itl_ms:g} ms), and by TTFT alone (the rule of a "
        "sidecar given no inter-token objective); misses by TTFT, by average ITL, "
        "by the mean chunk gap alone (TTFT and average ITL met); records with TTFT within "
        "10 ms of the objective:"
    )
    print()
    print(
        "| configuration | aiperf ok | TTFT alone | aiperf's rule | sidecar's rule | largest gap rule "
        "| sidecar counter | counter / sidecar's rule | TTFT missed | avg ITL missed "
        "| only the mean chunk gap missed | TTFT within ±10 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in judged:
        print(row)


def fmt2(value):
    return "-" if value is None else f"{value:.2f}"


def first_content_ms(url, osl):
    """Milliseconds from connecting to the first content chunk of one
    streaming chat completion; the rest of the stream is read and dropped."""
    import http.client
    import time
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "Tell me about admission control."}],
            "stream": True,
            "max_tokens": int(osl),
        }
    )
    start = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    for line in resp:
        if first is None and line.startswith(b"data: {") and b'"content":"' in line:
            first = (time.perf_counter() - start) * 1000
    conn.close()
    if resp.status != 200 or first is None:
        raise RuntimeError(f"{url}: status {resp.status}, no content chunk")
    return first


def ttft_probe(direct_url, sidecar_url, n, osl):
    from statistics import median, quantiles

    direct, sidecar, errors = [], [], {"direct": 0, "sidecar": 0}
    for _ in range(int(n)):
        for name, url, out in (("direct", direct_url, direct), ("sidecar", sidecar_url, sidecar)):
            try:
                out.append(first_content_ms(url, osl))
            except Exception:  # counted, not fatal: the figure says how many failed
                errors[name] += 1
    pairs = [b - a for a, b in zip(direct, sidecar)]
    print(
        f"sequential probe, {n} requests each, alternating, max_tokens {osl}, "
        "a new connection per request: time to the first content chunk"
    )
    for name, values in (("direct", direct), ("sidecar", sidecar)):
        if len(values) >= 2:
            print(
                f"  {name}: median {median(values):.2f} ms, p90 {quantiles(values, n=10)[-1]:.2f} ms, "
                f"failed {errors[name]}"
            )
    if pairs:
        print(
            f"  sidecar - direct: median of paired differences {median(pairs):+.2f} ms, "
            f"difference of medians {median(sidecar) - median(direct):+.2f} ms"
        )


def main(argv):
    if len(argv) >= 2 and argv[0] == "tokenizer":
        tokenizer(argv[1])
    elif len(argv) >= 4 and argv[0] == "summary":
        summary(argv[1], argv[2], argv[3:])
    elif len(argv) == 5 and argv[0] == "ttft-probe":
        ttft_probe(*argv[1:])
    elif len(argv) >= 4 and argv[0] == "engine-summary":
        rest = argv[4:]
        runs, pairs = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
        engine_summary(argv[1], argv[2], argv[3], runs, pairs)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
