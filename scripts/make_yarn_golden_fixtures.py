#!/usr/bin/env python3
"""Freeze the YaRN rope-scaling golden fixture tests/data/golden/qwen3-yarn/.

    PYTHONPATH=<dir with numpy, safetensors, mlx, mlx-lm> python scripts/make_yarn_golden_fixtures.py

(`pip install --target DIR numpy safetensors "mlx[cpu]" mlx-lm` is enough: no torch.) A sibling of
make_golden_fixtures.py that reuses its machinery (prompt selection, meta.json, the rules in its docstring);
tests/model/golden_test.cpp runs the same comparisons on the directory written here.

Qwen3's model cards tell users to add {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings":
32768} to config.json for long contexts. YaRN changes two things (transformers' _compute_yarn_parameters,
mlx-lm's YarnRoPE): the inverse frequencies (kept for dimensions that turn more than beta_fast = 32 times
over the original context, divided by the factor for those turning fewer than beta_slow = 1 times, blended
by a linear ramp between), and cos/sin, i.e. q and k, multiplied by the attention factor 0.1 ln(factor) + 1.
The tiny model makes both visible at positions < 45: head_dim 16 and rope_theta 1e4 with an original context
of 64 put the ramp over dimensions [0, 3] (pair 0 kept, pairs 1-2 blended, pairs 3-7 divided by 4), and the
factor 4 scales the attention scores by 1.1386^2.

The checkpoint is written here with numpy (random bf16 weights scaled as make_golden_fixtures.py's tiny
models, the layout and config.json of a Hub Qwen3 checkpoint); the reference is mlx-lm in float32, and the
script refuses to write unless an independent float64 numpy forward (scripts/golden_numpy_check.py, written
from transformers' formulas) agrees with mlx-lm on every prompt within 1e-5.
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_numpy_check as npref  # noqa: E402
import make_golden_fixtures as g  # noqa: E402

NAME = "qwen3-yarn"
SEED = 61
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 0, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.2,
    "intermediate_size": 128, "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "rope_theta": 10000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": g.VOCAB,
}


def bf16_bytes(a):
    """float32 -> bf16 (round to nearest even), little-endian bytes."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def write_safetensors(path, tensors):
    """tensors: {name: float32 array}, stored as BF16 in name order."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        b = bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_model(dst):
    c = CONFIG
    rng = np.random.default_rng(SEED)
    H, D, V, F = c["hidden_size"], c["head_dim"], c["vocab_size"], c["intermediate_size"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    norm = lambda n: 1.0 + 0.25 * rng.standard_normal(n)  # noqa: E731  (gains around 1, not all 1)
    lin = lambda o, i: 0.2 * rng.standard_normal((o, i))  # noqa: E731
    W = {"model.embed_tokens.weight": rng.standard_normal((V, H)), "lm_head.weight": rng.standard_normal((V, H)),
         "model.norm.weight": norm(H)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        W.update({p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
                  p + "self_attn.q_norm.weight": norm(D), p + "self_attn.k_norm.weight": norm(D),
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
        ref = np.load(dst / f"ref_{k}.npy").astype(np.float64)
        err = float(npref.rel_err(npref.forward(dst, ids), ref))
        worst = max(worst, err)
        for ab in ("no_yarn_freqs", "no_yarn_attention_factor"):
            print(f"  {NAME}: prompt {k} ablation {ab}: rel_err {npref.rel_err(npref.forward(dst, ids, ab), ref):.2e}")
    g.accept_numpy_check(NAME, dst, meta, worst)


if __name__ == "__main__":
    main()
