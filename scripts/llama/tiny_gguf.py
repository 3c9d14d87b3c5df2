#!/usr/bin/env python3
"""Write a tiny random-weight llama-architecture GGUF for llama.cpp's llama-server.

2 layers, embedding length 64, 4 heads / 4 KV heads (head dim 16), feed-forward
128, all tensors F32, context length 65536, a ChatML chat template, and a seeded
RNG so the same arguments always give the same bytes.

Tokenizer: with --vocab PATH the tokenizer.ggml.* keys are copied from that
GGUF (meant for llama.cpp's vocab-only models/ggml-vocab-llama-spm.gguf, 32000
SentencePiece tokens); without it a small SentencePiece-style ("llama")
vocabulary is generated here: <unk>, <s>, </s>, the ChatML markers as control
tokens, the 256 byte-fallback tokens <0x00>..<0xFF>, and printable pieces.

output.weight is a separate random matrix: with an output tied to
token_embd.weight a random model mostly predicts its last input token again
(for a chat prompt, "\n" forever); untied, it writes varied text. Its rows
for byte-fallback, control, unknown and unused tokens are zero, so their logit
is 0 while ordinary tokens' logits spread around it: with the default top-k 40
sampling they are never picked, and the text streamed back is readable UTF-8
(no lone bytes, no "\u0000").

Usage: python3 scripts/llama/tiny_gguf.py --out target/llama/tiny.gguf [--vocab PATH]
Needs: pip install 'gguf==0.19.*' numpy
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - a hint for people running it by hand
    sys.exit("tiny_gguf.py needs the gguf package: pip install 'gguf==0.19.*' numpy")

N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
# Trained context: llama.cpp caps each slot at it, so it must exceed what a
# test holds a slot for (the weights are random: nothing is trained anyway).
N_CTX = 65536
RMS_EPS = 1e-5
ROPE_BASE = 10000.0

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TT = gguf.TokenType


def fallback_vocab(size: int = 512):
    """A small SentencePiece ("llama" tokenizer model) vocabulary llama.cpp accepts.

    Byte-fallback tokens make every UTF-8 string tokenizable; the printable
    pieces keep ordinary text from being all bytes.  Returns (tokens, scores,
    types, ids) where ids names the special tokens.
    """
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, ttype: int, score: float = 0.0) -> None:
        if text in tokens:
            return
        tokens.append(text)
        scores.append(score)
        types.append(int(ttype))

    add("<unk>", TT.UNKNOWN)
    add("<s>", TT.CONTROL)
    add("</s>", TT.CONTROL)
    add("<|im_start|>", TT.CONTROL)
    add("<|im_end|>", TT.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", TT.BYTE)
    pieces = ["\u2581"]
    pieces += [chr(c) for c in range(0x21, 0x7F)]
    words = (
        "the a an and of to in is it that for on with as you this be are was at by "
        "or from not but have we can all one will do your if more so what up out "
        "about who get which when make like time no just know take into year good "
        "some could them see other than then now look only come its over think also "
        "back after use two how our work first well way even new want because any "
        "these give day most us hello world user assistant system test token model "
        "server request response stream chat"
    ).split()
    pieces += ["\u2581" + w for w in words]
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    pieces += ["\u2581" + c for c in letters]
    pieces += [a + b for a in letters[:16] for b in letters[:16]]
    score = -1.0
    for p in pieces:
        if len(tokens) >= size:
            break
        add(p, TT.NORMAL, score)
        score -= 1.0
    ids = {"bos": 1, "eos": 2, "unk": 0}
    return tokens, scores, types, ids


def copy_tokenizer(writer: "gguf.GGUFWriter", vocab_path: str) -> list[int]:
    """Copy every tokenizer.ggml.* key from vocab_path; return the token types."""
    reader = gguf.GGUFReader(vocab_path)
    n_vocab = None
    types = None
    copied = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        main = field.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            value = field.contents()
            writer.add_key_value(key, value, main, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
            elif key == "tokenizer.ggml.token_type":
                types = [int(t) for t in value]
        else:
            writer.add_key_value(key, field.contents(), main)
        copied += 1
    if n_vocab is None:
        sys.exit(f"{vocab_path}: no tokenizer.ggml.tokens key")
    print(f"tiny_gguf: copied {copied} tokenizer keys ({n_vocab} tokens) from {vocab_path}",
          file=sys.stderr)
    if types is None or len(types) != n_vocab:
        types = [int(TT.NORMAL)] * n_vocab
    return types


def write_fallback_tokenizer(writer: "gguf.GGUFWriter") -> list[int]:
    tokens, scores, types, ids = fallback_vocab()
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(ids["bos"])
    writer.add_eos_token_id(ids["eos"])
    writer.add_unk_token_id(ids["unk"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    print(f"tiny_gguf: generated a fallback SPM vocabulary of {len(tokens)} tokens",
          file=sys.stderr)
    return types


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the GGUF to write")
    ap.add_argument("--vocab", help="GGUF whose tokenizer.ggml.* keys to copy "
                    "(e.g. ggml-vocab-llama-spm.gguf); a small vocabulary is generated without it")
    ap.add_argument("--seed", type=int, default=1234, help="RNG seed (default 1234)")
    args = ap.parse_args()

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"

    writer = gguf.GGUFWriter(tmp, "llama")
    writer.add_name("tower-admission-tiny-random")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    if args.vocab:
        types = copy_tokenizer(writer, args.vocab)
    else:
        types = write_fallback_tokenizer(writer)
    n_vocab = len(types)
    writer.add_vocab_size(n_vocab)
    writer.add_chat_template(CHATML_TEMPLATE)

    rng = np.random.default_rng(args.seed)
    n_embd_kv = N_EMBD // N_HEAD * N_HEAD_KV

    def rand(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # numpy shapes are (rows, cols); gguf stores them reversed as ggml's ne.
    writer.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD, std=0.5))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    output = rand(n_vocab, N_EMBD, std=0.25)
    never = np.array([t != int(TT.NORMAL) and t != int(TT.USER_DEFINED) for t in types])
    output[never] = 0.0
    writer.add_tensor("output.weight", output)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        writer.add_tensor(p + "attn_q.weight", rand(N_EMBD, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", rand(n_embd_kv, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", rand(n_embd_kv, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", rand(N_EMBD, N_EMBD))
        writer.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        writer.add_tensor(p + "ffn_gate.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_up.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_down.weight", rand(N_EMBD, N_FF))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, args.out)
    print(f"tiny_gguf: wrote {args.out} ({os.path.getsize(args.out)} bytes, vocab {n_vocab})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
