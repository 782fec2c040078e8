#!/usr/bin/env python3
"""Freezes tests/data/tokenizer/token_bytes/: the reference for Tokenizer::token_raw_bytes's invariant
(tests/tokenizer/token_bytes_test.cpp): for an id sequence, Hugging Face tokenizers' decode equals the
tokens' own bytes joined, changed only by the decoder's text-edge rules.

Reference: the `tokenizers` library. Re-run from the repository root (after
scripts/make_sentencepiece_fixtures.py and scripts/make_tokenizer_fixtures.py, whose tokenizer files
and variants it reads):
    python3 scripts/make_token_bytes_fixtures.py
It writes:
  variants.json      the tokenizers: {name, base, overrides} as in ../variants/variants.json (a base
                     tokenizer.json under tests/data/tokenizer/ with fields replaced): every variant
                     there whose decoder is not the plain BPE's, plus decoders written here
                     (Metaspace after Fuse, ByteLevel followed by a Strip)
  <name>.jsonl       per line {"ids": [...], "decoded": tokenizers' decode(ids)}: the ids of texts
                     with CJK, emoji (byte fallback), leading, double and trailing spaces, special
                     tokens; random id sequences (any id; biased to byte-fallback tokens, "▁" tokens
                     and special tokens); and random sequences whose byte-fallback runs spell whole
                     characters (valid UTF-8), so that they compare exactly (not "▁": a Metaspace
                     step after ByteFallback rewrites it, the one thing the invariant leaves out
                     besides lossy repair; no encoding spells it in bytes).
"""
import json
import os
import random

os.environ.setdefault("RUST_BACKTRACE", "0")  # tokenizers' Strip panics are expected (safe_decode)
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
OUT = os.path.join(DATA, "token_bytes")

TEXTS = [
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "double  spaces  inside  and trailing  ",
    "trailing space ",
    " ",
    "  ",
    "\u4e2d\u6587\u3001\u65e5\u672c\u8a9e\u3002 \u4f60\u597d\uff0c\u4e16\u754c",
    "\u9f98\u9f96 \U0001F980\U0001F9A9 \U0001F44D\U0001F3FD \u2764\ufe0f \U0001F1EB\U0001F1F7",
    " \U0001F600 leading emoji",
    "\U0001F600",
    "\u9f98",
    "{\"name\": \"\u96e8\", \"n\": [1, 2.5, true, null]}",
    " {\"a\": \"b c\"}",
    "a\u2581b \u2581\u2581c \u2581 d\u2581",
    "<0x41> <0xZZ> <0x0A>",
    "[INST] Hello there [/INST] Hi![INST]next[/INST]",
    "[INST]x",
    "\tindented\n\n\tagain\r\nend \u3000full\u3000width",
    "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m \u0416\u0438\u0437\u043d\u044c \u05e9\u05dc\u05d5\u05dd",
    "x \u0661\u0662\u0663 \u00bd \u2163 \U00010348 \u0b95\u0bbe",
]
CHARS = ("a", " ", "\n", "\u00e9", "\u00df", "\u4e2d", "\u9f98", "\u3042", "\U0001F980", "\U0001F44D", "\u2764",
         "\u0416", "\u05e9", "{", "\"", "\U00010348", "\uff21")  # not "▁": Metaspace rewrites it

# Decoders not in ../variants/variants.json.
EXTRA_VARIANTS = [
    # Metaspace after a fusing step: the whole text is its first token (every replacement dropped).
    {"name": "tb-metaspace-after-fuse", "base": "sp-llama", "overrides": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]}}},
    # Byte-level with a whole-text Strip after it.
    {"name": "tb-bytelevel-strip", "base": "gpt2-style", "overrides": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "Strip", "content": " ", "start": 1, "stop": 1}]}}},
    {"name": "gpt2-style", "base": "gpt2-style", "overrides": {}},
]


def build(base, overrides):
    with open(os.path.join(DATA, base, "tokenizer.json"), encoding="utf-8") as f:
        d = json.load(f)
    for k, v in overrides.items():
        if k.startswith("model."):
            d["model"][k[len("model."):]] = v
        else:
            d[k] = v
    return d


def safe_decode(tok, ids):
    try:
        return tok.decode(ids, skip_special_tokens=False)
    except BaseException:  # tokenizers' Strip with stop > 0 panics on an empty string
        return None


def sequences(tok, rng):
    vocab = tok.get_vocab(with_added_tokens=True)
    n = tok.get_vocab_size(with_added_tokens=True)
    byte_id = {int(t[3:5], 16): i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x") and t.endswith(">")}
    meta_ids = sorted(i for t, i in vocab.items() if t.startswith("\u2581"))
    special = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    plain = sorted(i for t, i in vocab.items() if len(t) != 6 or not t.startswith("<0x"))
    out = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    pools = [list(range(n)), sorted(byte_id.values()) or plain, meta_ids or plain, special or plain]
    for _ in range(80):  # anything: byte runs may be invalid UTF-8
        out.append([rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 14))])
    for _ in range(140):  # byte runs spell whole characters
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if byte_id and r < 0.35:
                ids += [byte_id[b] for b in rng.choice(CHARS).encode("utf-8") if b in byte_id]
            elif r < 0.6 and meta_ids:
                ids.append(rng.choice(meta_ids))
            elif r < 0.65 and special:
                ids.append(rng.choice(special))
            else:
                ids.append(rng.choice(plain))
        out.append(ids)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(DATA, "variants", "variants.json"), encoding="utf-8") as f:
        listed = json.load(f)
    chosen = [v for v in listed if v["base"] == "sp-llama" or "decoder" in v["overrides"]] + EXTRA_VARIANTS
    for v in chosen:
        tok = Tokenizer.from_str(json.dumps(build(v["base"], v["overrides"])))
        rng = random.Random(2024)
        lines = []
        for ids in sequences(tok, rng):
            dec = safe_decode(tok, ids)
            if dec is not None:
                lines.append(json.dumps({"ids": ids, "decoded": dec}, ensure_ascii=False, separators=(",", ":")))
        with open(os.path.join(OUT, v["name"] + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(v["name"], len(lines), "sequences")
    with open(os.path.join(OUT, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(chosen, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
