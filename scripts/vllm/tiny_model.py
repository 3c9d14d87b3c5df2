#!/usr/bin/env python3
"""Write a tiny random-weight Llama that vLLM serves, with no model hub.

    python scripts/vllm/tiny_model.py --out target/vllm/tiny-llama [--seed 1234]

Runs in the virtualenv setup.sh makes (torch, transformers, tokenizers).

The model: LlamaForCausalLM, vocabulary 1,024, hidden 128, 2 layers, 4 heads
and 4 KV heads (head size 32: vLLM's CPU attention takes head sizes 32, 64,
80, 96, ...; hidden 64 with 4 heads fails), feed-forward 256, untied output,
float32, 4,096 positions: about 590 k parameters, saved with save_pretrained
(config.json, generation_config.json, model.safetensors).

The tokenizer: a BPE trained here with the `tokenizers` package on generated
text (Metaspace pre-tokenizer like SentencePiece's, printable ASCII plus "\\n"
as its alphabet, <unk> for anything else), wrapped as PreTrainedTokenizerFast
with a ChatML Jinja chat template so that /v1/chat/completions works:

    <|im_start|>user\\nHello<|im_end|>\\n<|im_start|>assistant\\n

Special tokens: <unk> 0, <s> 1 (bos), </s> 2 (eos), <|im_start|> 3,
<|im_end|> 4.

The output matrix's rows for those five tokens are zero and the others are
drawn with a standard deviation that spreads the logits of ordinary tokens
to about N(0, 3^2): a special token's logit is 0 against a maximum near 10,
so the model practically never samples EOS (about 5e-5 a token) and streams
run to max_tokens even without vLLM's "ignore_eos" (the tests send it anyway).
The text is readable nonsense in ASCII. Seeded: the same seed and package
versions give the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

N_VOCAB = 1024
N_EMBD = 128
N_LAYER = 2
N_HEAD = 4
N_FF = 256
N_POS = 4096
LOGIT_STD = 3.0
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = (
    "the a an and of to in is it that for on with as you this be are was at by "
    "or from not but have we can all one will do your if more so what up out "
    "about who get which when make like time no just know take into year good "
    "some could them see other than then now look only come its over think also "
    "back after use two how our work first well way even new want because any "
    "these give day most us hello world user assistant system test token model "
    "server request response stream chat queue slot engine gate admit wait"
).split()


def corpus(rng: random.Random, lines: int = 6000):
    """Generated text: common words, invented words from syllables, numbers, punctuation."""
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "st", "tr", "pl", "ch", "sh", "th", "br", "gr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "ng", "ck", "st"]
    invented = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                        for _ in range(rng.randint(1, 3))) for _ in range(800)]
    punct = [".", ",", "!", "?", ":", ";", "'s", ")", "\""]
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(4, 16)):
            r = rng.random()
            if r < 0.5:
                w = rng.choice(WORDS)
            elif r < 0.9:
                w = rng.choice(invented)
            else:
                w = str(rng.randint(0, 2000))
            if rng.random() < 0.15:
                w = w.capitalize()
            if rng.random() < 0.12:
                w += rng.choice(punct)
            words.append(w)
        line = " ".join(words)
        if rng.random() < 0.3:
            line += "\n" + rng.choice(WORDS)
        yield line + "\n"


def train_tokenizer(seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    alphabet = [chr(c) for c in range(0x20, 0x7F)] + ["\n", "\u2581"]
    trainer = trainers.BpeTrainer(
        vocab_size=N_VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=alphabet,
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(random.Random(seed)), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    t0 = time.monotonic()

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(args.out, exist_ok=True)
    raw = train_tokenizer(args.seed)
    n_vocab = raw.get_vocab_size()
    if n_vocab > N_VOCAB:
        sys.exit(f"tokenizer has {n_vocab} tokens, more than the model's {N_VOCAB}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        model_max_length=N_POS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(args.out)

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=N_VOCAB,
        hidden_size=N_EMBD,
        intermediate_size=N_FF,
        num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD,
        num_key_value_heads=N_HEAD,
        max_position_embeddings=N_POS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        # The final RMSNorm leaves a hidden state of norm ~sqrt(N_EMBD):
        # this std makes an ordinary token's logit ~N(0, LOGIT_STD^2).
        w = model.lm_head.weight
        w.normal_(0.0, LOGIT_STD / N_EMBD**0.5)
        w[: len(SPECIALS)].zero_()
    model.save_pretrained(args.out)

    # Check what was written: the chat template renders, the model runs.
    tok = AutoTokenizer.from_pretrained(args.out)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    probs = torch.softmax(logits, -1)
    n_params = sum(p.numel() for p in model.parameters())
    summary = {
        "out": os.path.abspath(args.out),
        "params": n_params,
        "vocab": n_vocab,
        "chat_hello_prompt_tokens": len(ids),
        "p_special_next": float(probs[: len(SPECIALS)].sum()),
        "seconds": round(time.monotonic() - t0, 1),
    }
    print("tiny_model: " + json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
