#!/usr/bin/env python3
"""Writes tests/data/sp-tiny-llama/: a tiny random Llama checkpoint that ships a SentencePiece-style
tokenizer (the Mistral-7B / Mixtral layout) and a Mistral-Instruct chat template, for the end-to-end
CLI tests (tests/cli/sentencepiece_model_test.cpp).

    python3 scripts/make_sentencepiece_model.py      (after scripts/make_sentencepiece_fixtures.py)

Files:
  config.json, model.safetensors   LlamaForCausalLM, 2 layers, hidden 32, tied embeddings, random bf16
                                   weights (transformers save_pretrained, Hub-style config)
  tokenizer.json                   tests/data/tokenizer/sp-llama/tokenizer.json (LlamaConverter, legacy)
  tokenizer_config.json            bos <s>, eos </s>, unk <unk>, add_bos_token, Mistral-7B-Instruct's template
  expected.json                    for each conversation: transformers' apply_chat_template text
                                   (tokenize=False) and `tokenizers`' ids for it from tokenizer.json,
                                   the references for what anvil renders and encodes
"""
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "sp-tiny-llama"
TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "sp-llama" / "tokenizer.json"

# Mistral-7B-Instruct-v0.1's template (alternating user/assistant turns, BOS first).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

CONVERSATIONS = {
    "one_turn": [{"role": "user", "content": "Hello, who are you?"}],
    "multi_turn": [
        {"role": "user", "content": "Write a haiku about rain."},
        {"role": "assistant", "content": "Soft rain on the roof,\n  quiet streets shine in the dark."},
        {"role": "user", "content": "Now in French, s'il vous plaît: « pluie » 雨 🌧"},
    ],
}


def main():
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok_json = json.loads(TOKENIZER.read_text(encoding="utf-8"))
    vocab_size = max(max(tok_json["model"]["vocab"].values()), max(t["id"] for t in tok_json["added_tokens"])) + 1
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, initializer_range=0.2,
                         rms_norm_eps=1e-5)
    torch.manual_seed(5)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(1.0 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    if OUT.exists():
        shutil.rmtree(OUT)
    model.to(torch.bfloat16).save_pretrained(str(OUT), safe_serialization=True)
    # Hub layout (rope_theta at top level, torch_dtype), as scripts/make_golden_fixtures.py writes it.
    cfg = json.loads((OUT / "config.json").read_text())
    rp = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = rp.get("rope_theta", 10000.0)
    cfg["rope_scaling"] = None
    cfg["torch_dtype"] = cfg.pop("dtype", "bfloat16")
    cfg.pop("layer_types", None)
    (OUT / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    for extra in ("generation_config.json",):
        if (OUT / extra).exists():
            (OUT / extra).unlink()

    shutil.copyfile(TOKENIZER, OUT / "tokenizer.json")
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": None, "legacy": True, "model_max_length": 2048,
        "tokenizer_class": "LlamaTokenizer", "chat_template": MISTRAL_TEMPLATE,
    }, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    tok = AutoTokenizer.from_pretrained(str(OUT))
    raw = Tokenizer.from_file(str(OUT / "tokenizer.json"))
    expected = {"transformers": transformers.__version__, "conversations": {}}
    for name, msgs in CONVERSATIONS.items():
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        # The ids are `tokenizers`' for the rendered text (special tokens in it are matched, none
        # added), from the shipped tokenizer.json. (transformers 5 rebuilds a LlamaTokenizer's
        # pipeline from its own defaults instead of reading tokenizer.json's normalizer, so its
        # apply_chat_template(tokenize=True) is not the reference for this file.)
        ids = raw.encode(text, add_special_tokens=False).ids
        expected["conversations"][name] = {"messages": msgs, "text": text, "ids": ids}
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for p in sorted(OUT.iterdir()):
        print(p.name, p.stat().st_size)


if __name__ == "__main__":
    sys.exit(main())
