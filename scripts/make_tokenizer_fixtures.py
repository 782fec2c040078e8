#!/usr/bin/env python3
"""Freezes the tokenizer conformance fixtures into tests/data/tokenizer/.

Reference: the Hugging Face `tokenizers` library (pip). Re-run from the repository root:
    python3 scripts/make_tokenizer_fixtures.py
It writes:
  qwen3/, tiny-code/          copies of the shared Qwen3 and anvil-tiny-code tokenizer files
  llama3-style/tokenizer.json a small BPE trained here: Split(Llama 3 regex) + ByteLevel(use_regex=False),
                              ignore_merges=True, no normalizer, added tokens with lstrip/rstrip/
                              normalized/single_word variants
  gpt2-style/tokenizer.json   a small BPE trained here: ByteLevel(use_regex=True), Sequence([NFC])
  gpt2-prefix-space/          the same with ByteLevel add_prefix_space=True
  corpus.jsonl                the conformance corpus (long entries are described, not stored: see
                              build_long below; the C++ test rebuilds them with the same generator)
  postproc/cases.jsonl        special tokens (encode(text, add_special_tokens=True)): per case, a base
                              tokenizer from this directory, an optional replacement "post_processor"
                              (Llama 3's, Mistral's, Bert/Roberta, Sequence, multi-id specials) and an
                              optional tokenizer_config.json; the ids of a few corpus texts with and
                              without special tokens. Reference: `tokenizers` for the post-processor
                              cases; transformers' AutoTokenizer for the cases with a config (where
                              tokenizer.json has no post-processor, with add_bos_token/add_eos_token
                              applied by transformers' update_post_processor, as 4.x's
                              LlamaTokenizerFast did: 5.x ignores the flags). Re-run only these with
                                  python3 scripts/make_tokenizer_fixtures.py --post-processors
  expected_<name>.jsonl       per corpus entry: tokenizers' encode(text, add_special_tokens=False).ids,
                              decode(ids) and decode(ids, skip_special_tokens=True); long entries
                              store a count and FNV-1a 64 hashes instead; plus "random_*" lines with
                              random id sequences and their (lossy UTF-8) decodes.
"""
import json
import os
import random
import shutil
import sys

from tokenizers import Tokenizer, AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
SHARED = os.environ.get("ANVIL_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    ("empty", ""),
    ("ascii_prose", "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of "
                    "times; it was the age of wisdom, it was the age of foolishness!"),
    ("code_python", "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
                    "print([fib(i) for i in range(10)])  # 0 1 1 2 3 5\n"),
    ("code_cpp", "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n"
                 "\treturn v.size() == 3 ? 0 : 1;\n}\n"),
    ("whitespace_runs", "a  b   c\t\td\n\ne\n\n\nf\r\ng\r\n\r\nh \r\n \n  \t x    \t\n   y     "),
    ("only_spaces", "     "),
    ("only_newlines", "\n\n\r\n\n"),
    ("leading_trailing", "   leading and trailing   "),
    ("contractions_lower", "it's I'm we'll they're don't you've he'd she's 'll 're 've 'd 'm 's 't"),
    ("contractions_upper", "IT'S I'M WE'LL THEY'RE DON'T YOU'VE HE'D SHE'S 'LL 'RE 'VE 'D 'M 'S 'T"),
    ("contractions_mixed", "It'S We'Ll They'rE Don'T You'Ve She'd O'Neil rock'n'roll ''s"),
    ("digits", "0 12 345 6789 12345678901234567890 3.14159 1,000,000.00 007 2024-01-31 x2y3z"),
    ("cjk", "你好，世界！这是一个测试。日本語のテキストです。한국어 텍스트입니다。"),
    ("scripts", "Привет, мир! Ελληνικά γράμματα. שלום עולם. مرحبا بالعالم. हिन्दी ภาษาไทย"),
    ("emoji", "👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 😀😃😄 ❤️ 🇫🇷 a👋b"),
    ("combining", "e\u0301 vs \u00e9, A\u030a vs \u00c5, n\u0303 vs \u00f1, \u1e9b\u0323, Cafe\u0301 cafe\u0301s"),
    ("invisible", "a\u00a0b\u200bc\u200dd\ufeffe\u2009f\u3000g\u202fh\u2028i\u0085j\u00adk"),
    ("special_qwen", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi"
                     "<|endoftext|>"),
    ("special_adjacent", "<|endoftext|><|endoftext|>x<|im_end|> <|im_start|>  <think></think>"),
    ("special_llama", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"),
    ("added_variants", "a <lstrip> b <rstrip>  c\t<both>\td [norm] e hello_sw xhello_sw hello_sw! "
                       "<LSTRIP>   <lstrip><rstrip>"),
    ("partial_special", "<|im_sta <|endoftext <think <|im_end|"),
    ("mixed_unicode", "naïve café — “quoted” ‘single’ … €100 ¥200 ½ ² ℃ ﬁ ｆｕｌｌｗｉｄｔｈ"),
    ("punct", "!!! ??? ... --- ((())) {}[] @#$%^&*_+=|\\/~`\"<>"),
    ("url_path", "https://example.com/a/b?c=d&e=f#g /usr/local/bin C:\\Windows\\System32"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
]

# Long inputs are generated, not stored: text = concatenation of PARTS[lcg() % len(PARTS)], `count` times.
# lcg: x = (x * 6364136223846793005 + 1442695040888963407) mod 2^64; index = (x >> 33) % len(parts).
LONG_PARTS = ["The ", "quick ", "brown fox", " jumps", "\n", "\n\n", "    ", "\t", "def f(x):\n    return x\n",
              "你好", "世界", "。", "👍🏽", "👨‍👩‍👧", "e\u0301", "Привет ", "12345", "3.14", "'s ", "'LL ", "don't ",
              "<|endoftext|>", "<think>", " ", "  ", "\r\n", "ÅÉ", "\u00a0", "\u200b", "!!", "?"]
LONG_ENTRIES = [
    ("long_mixed", {"parts": LONG_PARTS, "count": 20000, "seed": 42}),   # ~100 KB
    ("long_one_word", {"parts": ["a", "b", "ab", "ba", "abc"], "count": 40000, "seed": 7}),  # one huge pre-token
    ("long_spaces", {"parts": [" ", "  ", "\t"], "count": 20000, "seed": 3}),
]

TRAIN_EXTRA = [
    "hello world hello there hello_sw the quick brown fox",
    "The rain in Spain stays mainly in the plain. It's a fine day, isn't it? We'll see.",
    "def main():\n    print('hello')\n    return 0\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
]


def build_long(spec):
    x = spec["seed"] & 0xFFFFFFFFFFFFFFFF
    parts = spec["parts"]
    out = []
    for _ in range(spec["count"]):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(parts[(x >> 33) % len(parts)])
    return "".join(out)


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def ids_bytes(ids):
    return b"".join(int(i).to_bytes(4, "little", signed=True) for i in ids)


def training_text():
    texts = [t for _, t in CORPUS] + TRAIN_EXTRA
    texts += [build_long(spec)[:20000] for _, spec in LONG_ENTRIES[:1]]
    return texts * 3


def make_gpt2_style():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    return tok


def make_llama3_style():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_special_tokens([
        AddedToken("<|start_header_id|>", special=True, normalized=False),
        AddedToken("<|end_header_id|>", special=True, normalized=False),
        AddedToken("<|eot_id|>", special=True, normalized=False),
        AddedToken("<lstrip>", special=True, lstrip=True, normalized=False),
        AddedToken("<rstrip>", special=True, rstrip=True, normalized=False),
        AddedToken("<both>", special=True, lstrip=True, rstrip=True, normalized=False),
    ])
    tok.add_tokens([
        AddedToken("[norm]", special=False, normalized=True),
        AddedToken("hello_sw", special=False, single_word=True, normalized=False),
        AddedToken("<think>", special=False, normalized=False),
    ])
    # The trainer may rebuild the model; make sure ignore_merges survived.
    d = json.loads(tok.to_str())
    if not d["model"].get("ignore_merges"):
        d["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(d))
    return tok


def write_expected(name, tok, corpus, rng):
    path = os.path.join(OUT, "expected_%s.jsonl" % name)
    vocab_n = tok.get_vocab_size(with_added_tokens=True)
    with open(path, "w", encoding="utf-8") as f:
        # Vocabulary facts: size with added tokens, a sample of token <-> id pairs, the special ids.
        sample = sorted(rng.sample(range(vocab_n), 50))
        added = tok.get_added_tokens_decoder()
        f.write(json.dumps({"name": "meta", "vocab_size": vocab_n,
                            "id_to_token": {str(i): tok.id_to_token(i) for i in sample if tok.id_to_token(i) is not None},
                            "special_ids": sorted(i for i, t in added.items() if t.special),
                            "added_ids": sorted(added.keys())}, ensure_ascii=False) + "\n")
        for entry_name, text, is_long in corpus:
            ids = tok.encode(text, add_special_tokens=False).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            dec_skip = tok.decode(ids, skip_special_tokens=True)
            if is_long:
                rec = {"name": entry_name, "n_ids": len(ids), "ids_fnv": fnv1a64(ids_bytes(ids)),
                       "decoded_fnv": fnv1a64(dec.encode("utf-8")),
                       "decoded_skip_fnv": fnv1a64(dec_skip.encode("utf-8")), "head": ids[:64]}
            else:
                rec = {"name": entry_name, "ids": ids, "decoded": dec, "decoded_skip": dec_skip}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        # Random id sequences: decode must match tokenizers' lossy UTF-8 decoding exactly.
        for k in range(40):
            n = rng.randint(1, 24)
            ids = [rng.randrange(vocab_n) for _ in range(n)]
            f.write(json.dumps({"name": "random_%d" % k, "decode_ids": ids,
                                "decoded": tok.decode(ids, skip_special_tokens=False),
                                "decoded_skip": tok.decode(ids, skip_special_tokens=True)},
                               ensure_ascii=False) + "\n")
    print("wrote", path, os.path.getsize(path), "bytes")


POSTPROC_TEXTS = ["empty", "ascii_prose", "leading_trailing", "cjk", "special_llama", "special_qwen"]


def template(single, specials):
    """A TemplateProcessing as JSON; `specials`: [(name, [ids])]."""
    p = processors.TemplateProcessing(single=single, special_tokens=[
        {"id": n, "ids": ids, "tokens": [n] * len(ids)} for n, ids in specials])
    return json.loads(p.__getstate__())


def post_processor_cases():
    """(name, base dir, post_processor override or "keep", tokenizer_config dict or None)."""
    keep = "keep"
    llama3_pp = json.loads(processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", 0)])]).__getstate__())
    mistral_pp = template("<s> $A", [("<s>", [1])])
    cases = [(name, name, keep, None) for name in
             ("qwen3", "tiny-code", "llama3-style", "gpt2-style", "gpt2-prefix-space", "sp-llama", "comp-bpe")]
    cases += [
        ("llama3-bos-sequence", "llama3-style", llama3_pp, None),
        ("mistral-bos", "sp-llama", mistral_pp, None),
        ("sp-bos-eos", "sp-llama", template("<s> $A </s>", [("<s>", [1]), ("</s>", [2])]), None),
        ("bert", "comp-bpe", json.loads(processors.BertProcessing(("</s>", 2), ("<s>", 1)).__getstate__()), None),
        ("roberta", "comp-bpe", json.loads(processors.RobertaProcessing(("</s>", 2), ("<s>", 1)).__getstate__()), None),
        ("nested-sequence", "comp-bpe", {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            {"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                                 "use_regex": False}, template("<sep> $A </s>", [("<sep>", [420]), ("</s>", [2])])]}]},
         None),
        ("multi-id-special", "gpt2-style", template("PFX $A", [("PFX", [0, 700])]), None),
        # tokenizer_config.json flags, as transformers 5.x applies them.
        ("cfg-bos", "sp-llama", keep, {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>"}),
        ("cfg-bos-eos", "sp-llama", keep, {"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>", "eos_token": "</s>"}),
        ("cfg-no-flags", "sp-llama", keep, {"bos_token": "<s>", "eos_token": "</s>"}),
        ("cfg-eos-only", "sp-llama", keep, {"add_eos_token": True, "bos_token": "<s>", "eos_token": "</s>"}),
        ("cfg-json-beats-flags", "sp-llama", mistral_pp, {"add_bos_token": False, "bos_token": "<s>", "eos_token": "</s>"}),
        ("cfg-json-stands", "llama3-style", llama3_pp, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
        ("cfg-bos-null", "sp-llama", keep, {"add_bos_token": True, "bos_token": None, "eos_token": "</s>"}),
        ("cfg-qwen3", "qwen3", keep, "qwen3/tokenizer_config.json"),
        ("cfg-tiny-code", "tiny-code", keep, "tiny-code/tokenizer_config.json"),
    ]
    return cases


def write_post_processor_fixtures():
    import tempfile
    texts = dict(CORPUS)
    out_dir = os.path.join(OUT, "postproc")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for name, base_name, pp, cfg in post_processor_cases():
            with open(os.path.join(OUT, base_name, "tokenizer.json"), encoding="utf-8") as tf:
                d = json.load(tf)
            if pp != "keep":
                d["post_processor"] = pp
            tok = Tokenizer.from_str(json.dumps(d))
            rec = {"name": name, "base": base_name}
            if pp != "keep":
                rec["post_processor"] = pp
            if cfg is None:
                rec["reference"] = "tokenizers " + __import__("tokenizers").__version__
                enc = lambda t: tok.encode(t, add_special_tokens=True).ids  # noqa: E731
            else:
                import transformers
                from transformers import AutoTokenizer
                if isinstance(cfg, str):
                    with open(os.path.join(OUT, cfg), encoding="utf-8") as cf:
                        cfg = json.load(cf)
                    cfg.pop("chat_template", None)
                else:
                    # The generic fast tokenizer: it reads tokenizer.json as is (LlamaTokenizer would
                    # rebuild the pipeline from its own defaults).
                    cfg = dict(cfg, tokenizer_class="PreTrainedTokenizerFast")
                rec["tokenizer_config"] = cfg
                rec["reference"] = "transformers " + transformers.__version__
                tmp = tempfile.mkdtemp()
                with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as tf:
                    tf.write(json.dumps(d, ensure_ascii=False))
                with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as cf:
                    json.dump(cfg, cf, ensure_ascii=False)
                hf = AutoTokenizer.from_pretrained(tmp)
                shutil.rmtree(tmp)
                if d.get("post_processor") is None:
                    # transformers 5 drops the flags when there is a tokenizer.json; 4.x's
                    # LlamaTokenizerFast (and llama.cpp's converter) applied them to a file without a
                    # post-processor: transformers' own update_post_processor builds that template.
                    hf._add_bos_token = bool(cfg.get("add_bos_token"))
                    hf._add_eos_token = bool(cfg.get("add_eos_token"))
                    hf.update_post_processor()
                enc = lambda t: hf(t)["input_ids"]  # noqa: E731
            rec["texts"] = [{"name": t, "ids": enc(texts[t]), "plain_ids": tok.encode(texts[t], add_special_tokens=False).ids}
                            for t in POSTPROC_TEXTS]
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    print("wrote", path, os.path.getsize(path), "bytes")


def main():
    if "--post-processors" in sys.argv:
        return write_post_processor_fixtures()
    os.makedirs(OUT, exist_ok=True)
    for src, dst in [("qwen3-tokenizer", "qwen3"), ("anvil-tiny-code", "tiny-code")]:
        os.makedirs(os.path.join(OUT, dst), exist_ok=True)
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(SHARED, "fixtures", src, fn), os.path.join(OUT, dst, fn))

    with open(os.path.join(OUT, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for name, text in CORPUS:
            f.write(json.dumps({"name": name, "text": text}, ensure_ascii=False) + "\n")
        for name, spec in LONG_ENTRIES:
            f.write(json.dumps({"name": name, "long": spec}, ensure_ascii=False) + "\n")
    corpus = [(n, t, False) for n, t in CORPUS] + [(n, build_long(s), True) for n, s in LONG_ENTRIES]

    toks = {
        "qwen3": Tokenizer.from_file(os.path.join(OUT, "qwen3", "tokenizer.json")),
        "tiny-code": Tokenizer.from_file(os.path.join(OUT, "tiny-code", "tokenizer.json")),
    }
    for name, maker in [("llama3-style", make_llama3_style), ("gpt2-style", make_gpt2_style)]:
        tok = maker()
        os.makedirs(os.path.join(OUT, name), exist_ok=True)
        p = os.path.join(OUT, name, "tokenizer.json")
        tok.save(p)
        toks[name] = Tokenizer.from_file(p)  # what the C++ side reads, reloaded
    # The same GPT-2 style model with ByteLevel(add_prefix_space=True): a space is prepended to every
    # piece between added tokens that does not already start with one.
    d = json.loads(toks["gpt2-style"].to_str())
    d["pre_tokenizer"]["add_prefix_space"] = True
    os.makedirs(os.path.join(OUT, "gpt2-prefix-space"), exist_ok=True)
    p = os.path.join(OUT, "gpt2-prefix-space", "tokenizer.json")
    with open(p, "w", encoding="utf-8") as f:
        f.write(json.dumps(d, ensure_ascii=False))
    toks["gpt2-prefix-space"] = Tokenizer.from_file(p)
    for name, tok in toks.items():
        write_expected(name, tok, corpus, random.Random(1234))
    write_post_processor_fixtures()


if __name__ == "__main__":
    sys.exit(main())
