"""Helpers of benches/aiperf/run.sh (see there): an offline tokenizer for
aiperf, and one summary table of several aiperf runs.

    python3 aiperf_eval.py tokenizer DIR
        Trains a small byte-level BPE tokenizer with the `tokenizers`
        package (no model hub needed) and saves DIR/tokenizer.json and
        DIR/tokenizer_config.json, which aiperf loads with --tokenizer DIR.

    python3 aiperf_eval.py summary TTFT_MS TPOT_MS LABEL=ARTIFACT_DIR...
        Reads each run's profile_export_aiperf.json and prints one Markdown
        table: requests, errors (overload answers), goodput, TTFT and
        inter-token latency percentiles.
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


def main(argv):
    if len(argv) >= 2 and argv[0] == "tokenizer":
        tokenizer(argv[1])
    elif len(argv) >= 4 and argv[0] == "summary":
        summary(argv[1], argv[2], argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
