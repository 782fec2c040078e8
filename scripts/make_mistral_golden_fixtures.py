#!/usr/bin/env python3
"""Freeze the Mistral golden fixture tests/data/golden/mistral-bf16/.

    PYTHONPATH=<dir with numpy, safetensors, mlx, mlx-lm> python scripts/make_mistral_golden_fixtures.py

(`pip install --target DIR numpy safetensors "mlx[cpu]" mlx-lm` is enough: no torch.) A sibling of
make_golden_fixtures.py and make_yarn_golden_fixtures.py that reuses their machinery (prompt selection,
meta.json, the safetensors writer; the rules are in make_golden_fixtures.py's docstring);
tests/model/golden_test.cpp runs the same comparisons on the directory written here.

Mistral (model_type "mistral", MistralForCausalLM) computes what Llama does: RMSNorm, SwiGLU, rotate-half
RoPE, grouped-query attention, no biases. What its checkpoints add is in config.json: an explicit head_dim
that is not hidden_size / num_attention_heads (Mistral-Nemo: hidden 5120, 32 heads, head_dim 128), and
sliding_window (4096 in v0.1, null in v0.2/v0.3/Nemo/Small). The tiny model has both: head_dim 32 with 4
heads on a hidden size of 64 (the q projection is 128 wide, o_proj maps 128 back to 64), and a
sliding_window of 64, more than any prompt plus its 24 greedy tokens (<= 44), so the windowed attention of
the model and the full attention of the references are the same computation; anvil caps its context at the
window (64) by default, which the golden tests run under. rope_theta 1e6 and rms_norm_eps 1e-5 as in
v0.2/v0.3.

The checkpoint is written here with numpy (random bf16 weights scaled as make_golden_fixtures.py's tiny
models, the tensor names and config.json of a Hub Mistral checkpoint); the reference is mlx-lm in float32
(which loads model_type "mistral" as its llama model), and the script refuses to write unless an
independent float64 numpy forward (scripts/golden_numpy_check.py, written from transformers' formulas)
agrees with mlx-lm on every prompt within 1e-5.
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

NAME = "mistral-bf16"
SEED = 71
CONFIG = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0,
    "head_dim": 32, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.2, "intermediate_size": 128,
    "max_position_embeddings": 512, "model_type": "mistral", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": 64,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": g.VOCAB,
}


def make_model(dst):
    c = CONFIG
    rng = np.random.default_rng(SEED)
    H, D, V, F = c["hidden_size"], c["head_dim"], c["vocab_size"], c["intermediate_size"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    assert nh * D != H, "the fixture exists to have head_dim != hidden_size / num_attention_heads"
    norm = lambda n: 1.0 + 0.25 * rng.standard_normal(n)  # noqa: E731  (gains around 1, not all 1)
    lin = lambda o, i: 0.2 * rng.standard_normal((o, i))  # noqa: E731
    W = {"model.embed_tokens.weight": rng.standard_normal((V, H)), "lm_head.weight": rng.standard_normal((V, H)),
         "model.norm.weight": norm(H)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        W.update({p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
                  p + "self_attn.q_proj.weight": lin(nh * D, H), p + "self_attn.k_proj.weight": lin(kv * D, H),
                  p + "self_attn.v_proj.weight": lin(kv * D, H), p + "self_attn.o_proj.weight": lin(H, nh * D),
                  p + "mlp.gate_proj.weight": lin(F, H), p + "mlp.up_proj.weight": lin(F, H),
                  p + "mlp.down_proj.weight": lin(H, F)})
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    write_safetensors(dst / "model.safetensors", W)
    (dst / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    (dst / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2) + "\n")


def main():
    dst = g.OUT / NAME
    make_model(dst)
    g.write_fixture(NAME, "mlx", dst, g.random_prompt_candidates(SEED, g.VOCAB), g.MIN_MARGIN)
    meta = json.loads((dst / "meta.json").read_text())
    worst = 0.0
    for k, ids in enumerate(meta["prompts"]):
        assert len(ids) + g.GREEDY_STEPS <= CONFIG["sliding_window"], "a prompt and its continuation pass the window"
        ref = np.load(dst / f"ref_{k}.npy").astype(np.float64)
        err = float(npref.rel_err(npref.forward(dst, ids), ref))
        worst = max(worst, err)
        for ab in ("interleaved_rope", "gqa_modulo"):
            print(f"  {NAME}: prompt {k} ablation {ab}: rel_err {npref.rel_err(npref.forward(dst, ids, ab), ref):.2e}")
    g.accept_numpy_check(NAME, dst, meta, worst)


if __name__ == "__main__":
    main()
