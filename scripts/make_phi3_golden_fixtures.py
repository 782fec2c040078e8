#!/usr/bin/env python3
"""Freeze the Phi-3 golden fixtures tests/data/golden/phi3-bf16/ and tests/data/golden/phi3-q4/.

    PYTHONPATH=<dir with numpy, safetensors, mlx, mlx-lm> python scripts/make_phi3_golden_fixtures.py

(`pip install --target DIR numpy safetensors "mlx[cpu]" mlx-lm` is enough: no torch.) A sibling of
make_golden_fixtures.py and make_mistral_golden_fixtures.py that reuses their machinery (prompt selection,
meta.json, the safetensors writer, mlx-lm's quantizer; the rules are in make_golden_fixtures.py's
docstring); tests/model/golden_test.cpp runs the same comparisons on the directories written here.

Phi-3 / Phi-3.5-mini / Phi-4 (model_type "phi3", Phi3ForCausalLM) compute what Llama does: RMSNorm, SwiGLU
with silu, rotate-half RoPE, grouped-query (Phi-4, Phi-3-medium) or multi-head (Phi-3-mini) attention, no
biases. What differs is the checkpoint: q, k and v are one matrix self_attn.qkv_proj
[(heads + 2 kv_heads) * head_dim, hidden], in that order, and gate and up are one mlp.gate_up_proj
[2 * intermediate_size, hidden], gate first (transformers' Phi3MLP: gate, up = chunk(2); mlx-lm: the same
split). And config.json: Phi-3-mini-4k has sliding_window 2047, so the tiny model has a window too (64, more
than any prompt plus its 24 greedy tokens, <= 44: the windowed attention of the model and the full attention
of the references are the same computation; anvil caps its context at the window by default).

  phi3-bf16   the tiny checkpoint, written here with numpy: random bf16 weights scaled as
              make_golden_fixtures.py's tiny models, the tensor names and config.json of a Hub Phi-3
              checkpoint (Phi-3-mini-4k's fields, with 4 heads over 2 kv heads as Phi-4 groups them)
  phi3-q4     phi3-bf16 quantized by mlx-lm's own converter (quantize_model: affine 4-bit, groups of 32,
              embedding and lm_head too), which quantizes the fused qkv_proj and gate_up_proj as they are:
              their .scales/.biases are [rows, 2], split by rows with the packed weights at load

The reference is mlx-lm in float32; the script refuses to write unless an independent float64 numpy
forward (scripts/golden_numpy_check.py, written from transformers' modeling_phi3: one fused product, its
output sliced) agrees with mlx-lm on every prompt within 1e-5.
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_numpy_check as npref  # noqa: E402
import make_golden_fixtures as g  # noqa: E402
from make_yarn_golden_fixtures import write_safetensors  # noqa: E402

SEED = 81
CONFIG = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "embd_pdrop": 0.0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.2,
    "intermediate_size": 128, "max_position_embeddings": 512, "model_type": "phi3", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "original_max_position_embeddings": 512, "pad_token_id": 0,
    "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 64,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": g.VOCAB,
}


def make_model(dst):
    c = CONFIG
    rng = np.random.default_rng(SEED)
    H, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    D = H // nh  # Phi3Attention: hidden_size / num_attention_heads
    assert kv < nh, "the fixture exists to have q, k and v of different widths in one qkv_proj"
    norm = lambda n: 1.0 + 0.25 * rng.standard_normal(n)  # noqa: E731  (gains around 1, not all 1)
    lin = lambda o, i: 0.2 * rng.standard_normal((o, i))  # noqa: E731
    W = {"model.embed_tokens.weight": rng.standard_normal((V, H)), "lm_head.weight": rng.standard_normal((V, H)),
         "model.norm.weight": norm(H)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        W.update({p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
                  p + "self_attn.qkv_proj.weight": lin((nh + 2 * kv) * D, H),
                  p + "self_attn.o_proj.weight": lin(H, nh * D),
                  p + "mlp.gate_up_proj.weight": lin(2 * F, H), p + "mlp.down_proj.weight": lin(H, F)})
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    write_safetensors(dst / "model.safetensors", W)
    (dst / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    (dst / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2) + "\n")


def check_against_numpy(name, extra_meta=None, long_factors=False,
                        ablations=("qkv_order_kqv", "up_gate_order", "gqa_modulo"), window=None):
    """The float64 numpy forward must agree with the frozen mlx-lm references; records the error in meta.json.
    long_factors: LongRoPE's long factors (make_longrope_golden_fixtures.py); window: the sliding window the
    prompts and their continuations must stay within (default CONFIG's; 0: none)."""
    dst = g.OUT / name
    meta = json.loads((dst / "meta.json").read_text())
    window = CONFIG["sliding_window"] if window is None else window
    worst = 0.0
    for k, ids in enumerate(meta["prompts"]):
        assert not window or len(ids) + g.GREEDY_STEPS <= window, "a prompt and its continuation pass the window"
        ref = np.load(dst / f"ref_{k}.npy").astype(np.float64)
        err = float(npref.rel_err(npref.forward(dst, ids, None, long_factors), ref))
        worst = max(worst, err)
        for ab in ablations:
            alt = npref.forward(dst, ids, ab, long_factors)
            print(f"  {name}: prompt {k} ablation {ab}: rel_err {npref.rel_err(alt, ref):.2e}")
    g.accept_numpy_check(name, dst, meta, worst)


def main():
    bf16 = g.OUT / "phi3-bf16"
    make_model(bf16)
    g.write_fixture("phi3-bf16", "mlx", bf16, g.random_prompt_candidates(SEED, g.VOCAB), g.MIN_MARGIN)
    check_against_numpy("phi3-bf16")

    q4 = g.make_mlx_quant("phi3-q4", bf16, 32, 4)
    t = {}
    for f in sorted(q4.glob("*.safetensors")):
        t.update(npref.read_safetensors(f))
    nh, kv, F = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"], CONFIG["intermediate_size"]
    for module, rows in (("self_attn.qkv_proj", (nh + 2 * kv) * CONFIG["hidden_size"] // nh), ("mlp.gate_up_proj", 2 * F)):
        # quantized fused, as mlx-lm's converter does: several groups per row, split by rows at load
        w, sc = t[f"model.layers.0.{module}.weight"], t[f"model.layers.0.{module}.scales"]
        assert w.dtype == np.uint32 and sc.shape == (rows, CONFIG["hidden_size"] // 32), (module, w.shape, sc.shape)
    g.write_fixture("phi3-q4", "mlx", q4, g.random_prompt_candidates(SEED + 1, g.VOCAB), g.MIN_MARGIN,
                    {"quantized_from": bf16.name})
    check_against_numpy("phi3-q4")


if __name__ == "__main__":
    main()
