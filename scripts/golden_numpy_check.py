#!/usr/bin/env python3
"""Independent numpy forward pass (float64) for the golden fixtures; not run in CI.

Cross-checks the frozen references of scripts/make_golden_fixtures.py (transformers and mlx-lm) against a
from-scratch implementation that reads config.json and model.safetensors itself, and documents the exact
math an engine must implement. Then measures how far common mistakes move the logits ("ablations"), so the
tolerance of tests/model/golden_test.cpp can be judged against them.

    python scripts/golden_numpy_check.py [model-name ...]

Math (Qwen3 / Qwen2 / Llama decoder, pre-norm):
  h = embed[ids]                                           [T, hidden]
  per layer:
    a = rmsnorm(h, input_layernorm)                        rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w
    q = a Wq^T (+bq)  [T, H, D];  k, v = a Wk^T (+bk), a Wv^T (+bv)  [T, KV, D]   (D = head_dim, explicit
                                                           in Qwen3/Llama configs, else hidden / H)
    Qwen3 only: q, k = rmsnorm over D with q_norm / k_norm (before RoPE)
    RoPE, rotate-half ("neox") layout: inv_freq[i] = theta^(-2i/D), i < D/2; angle = pos * inv_freq[i];
      x' [i] = x[i] cos - x[i + D/2] sin;  x'[i + D/2] = x[i + D/2] cos + x[i] sin
    llama3 rope scaling: wavelen = 2pi / inv_freq; wavelen < orig/high_ff: keep; wavelen > orig/low_ff:
      inv_freq / factor; else smooth = (orig / wavelen - low_ff) / (high_ff - low_ff),
      inv_freq' = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    yarn rope scaling (transformers' _compute_yarn_parameters): corr(r) = D ln(orig / (2 pi r)) / (2 ln theta);
      low = floor(corr(beta_fast = 32)), high = ceil(corr(beta_slow = 1)) (no rounding with truncate false),
      clamped to [0, D - 1]; ramp[i] = clip((i - low) / (high - low), 0, 1);
      inv_freq' = inv_freq / factor * ramp + inv_freq * (1 - ramp); orig defaults to max_position_embeddings;
      cos and sin are multiplied by attention_factor (default 0.1 ln(factor) + 1), i.e. q and k are
    longrope (transformers' _compute_longrope_parameters; Phi3Config also reads "su" and "yarn" so):
      inv_freq' = 1 / (ext * theta^(2i/D)) with ext = short_factor, or long_factor past the original
      context; factor = max_position_embeddings / original_max_position_embeddings (top level or in
      rope_scaling; without one, rope_scaling.factor and original = max_position_embeddings); cos and sin
      multiplied by attention_factor (default sqrt(1 + ln factor / ln original), 1 when factor <= 1)
    GQA: query head h reads kv head h // (H / KV); causal softmax(q k^T / sqrt(D)); o = concat_h(...) Wo^T
    h += o;  m = rmsnorm(h, post_attention_layernorm);  h += Wdown (silu(Wgate m) * Wup m)
  logits = rmsnorm(h, model.norm) lm_head^T   (tied: lm_head = embed_tokens)
Partial rotary (Phi-3's partial_rotary_factor p, Phi-4-mini's 0.75): RoPE over the first R = int(D p) dims of each
  head (pairs (i, i + R/2), frequencies theta^(-2i/R), and the attention factor on those dims only), the rest as is.
Phi-3 (model_type phi3) fuses the projections: qkv = a Wqkv^T, q | k | v its columns [0, H D), [H D, (H + KV) D),
  [(H + KV) D, (H + 2 KV) D); gu = m Wgate_up^T, gate its first intermediate_size columns, up the rest.
MLX affine quantization: weight uint32 [out, in*bits/32]; each row is a little-endian bit stream in which
element k occupies bits [k*bits, (k+1)*bits); w[o, k] = scales[o, k // gs] * q + biases[o, k // gs].
"""
import json
import math
import os
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
SHARED = Path(os.environ.get("ANVIL_SHARED_DIR", ROOT.parent / "shared"))


def read_safetensors(path):
    """Own reader: 8-byte LE header length, JSON header, raw little-endian data. bf16 -> float64."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a:base + b]
        dt = info["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(buf, "<f4")
        elif dt == "F16":
            arr = np.frombuffer(buf, "<f2")
        elif dt == "U32":
            arr = np.frombuffer(buf, "<u4")
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        arr = arr.reshape(info["shape"])
        out[name] = arr.astype(np.float64) if arr.dtype != np.uint32 else arr
    return out


def unpack_bits(words, bits, n, msb_first=False):
    """uint32 [rows, n*bits/32] -> int [rows, n]: row = little-endian bit stream, element k at bits
    [k*bits, (k+1)*bits). msb_first=True is a deliberate mistake used as an ablation."""
    rows = words.shape[0]
    bytes_ = words.astype("<u4").view(np.uint8).reshape(rows, -1)
    stream = np.unpackbits(bytes_, axis=1, bitorder="little")[:, :n * bits].reshape(rows, n, bits)
    weights = 1 << np.arange(bits)
    if msb_first:
        weights = weights[::-1]
    return (stream * weights).sum(-1)


class Weights:
    def __init__(self, model_dir, ablate):
        self.t = {}
        for f in sorted(Path(model_dir).glob("*.safetensors")):
            self.t.update(read_safetensors(f))
        self.cfg = json.loads((Path(model_dir) / "config.json").read_text())
        self.q = self.cfg.get("quantization") or {}
        self.ablate = ablate

    def has(self, name):
        return name in self.t

    def matrix(self, module):
        """Dense [out, in] float64 weight of `module` (dequantized if the checkpoint quantizes it)."""
        w = self.t[module + ".weight"]
        if module + ".scales" not in self.t:
            assert w.dtype != np.uint32, module
            return w
        spec = self.q.get(module, self.q)
        assert spec is not False, module + ": has scales but config says unquantized"
        gs, bits = spec["group_size"], spec["bits"]
        scales, biases = self.t[module + ".scales"], self.t[module + ".biases"]
        n_in = w.shape[1] * 32 // bits
        assert scales.shape[1] * gs == n_in, (module, scales.shape, gs, n_in)
        q = unpack_bits(w, bits, n_in, msb_first=self.ablate == "quant_msb_first").astype(np.float64)
        return q * np.repeat(scales, gs, axis=1) + np.repeat(biases, gs, axis=1)

    def vector(self, name):
        return self.t[name]


def yarn_attention_factor(sc):
    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    if sc.get("attention_factor") is not None:
        return sc["attention_factor"]
    if sc.get("mscale") and sc.get("mscale_all_dim"):
        return mscale(sc["factor"], sc["mscale"]) / mscale(sc["factor"], sc["mscale_all_dim"])
    return mscale(sc["factor"])


def longrope(cfg, sc, D, theta, long_factors, ablate):
    orig = cfg.get("original_max_position_embeddings") or sc.get("original_max_position_embeddings")
    if orig is None and cfg.get("model_type") == "phi3":
        orig = 4096  # Phi3Config's default
    if orig:
        factor = cfg["max_position_embeddings"] / orig
    else:
        orig, factor = cfg["max_position_embeddings"], sc["factor"]
    if ablate == "longrope_other_factors":
        long_factors = not long_factors
    ext = np.array(sc["long_factor"] if long_factors else sc["short_factor"], dtype=np.float64)
    inv = 1.0 / (ext * theta ** (np.arange(0, D, 2, dtype=np.float64) / D))
    af = sc.get("attention_factor")
    if af is None:
        af = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return inv, (1.0 if ablate == "longrope_no_attention_factor" else af)


def rope_inv_freq(cfg, D, ablate, long_factors=False):
    """(inv_freq [D/2], attention factor multiplying cos and sin). long_factors: LongRoPE's long ones."""
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    sc = cfg.get("rope_scaling")
    kind = sc.get("rope_type", sc.get("type")) if sc else None
    if kind in ("longrope", "su") or (kind == "yarn" and cfg.get("model_type") == "phi3"):
        return longrope(cfg, sc, D, theta, long_factors, ablate)
    if kind == "yarn":
        factor = sc["factor"]
        orig = sc.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        corr = lambda r: D * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
        low, high = corr(sc.get("beta_fast") or 32), corr(sc.get("beta_slow") or 1)
        if sc.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, D - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(D // 2) - low) / (high - low), 0, 1)
        if ablate != "no_yarn_freqs":
            inv = inv / factor * ramp + inv * (1 - ramp)
        return inv, (1.0 if ablate == "no_yarn_attention_factor" else yarn_attention_factor(sc))
    if kind == "llama3" and ablate != "no_llama3_scaling":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        orig = sc["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        smooth = (orig / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > orig / lo, inv / factor, inv)
        mid = (wavelen >= orig / hi) & (wavelen <= orig / lo)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif sc and ablate != "no_llama3_scaling":
        assert kind in (None, "default"), sc
    return inv, 1.0


def apply_rope(x, rope, ablate, R=None):
    """x [T, heads, D]; positions 0..T-1; rope = (inv_freq, attention factor); R: the rotated dims (partial
    rotary: the first R, pairs (i, i + R/2), the rest passed through unscaled)."""
    if R is not None and R < x.shape[-1]:
        if ablate == "rotate_whole_head":
            R = x.shape[-1]
            rope = (np.concatenate([rope[0], np.zeros((R - 2 * len(rope[0])) // 2)]), rope[1])
        else:
            return np.concatenate([apply_rope(x[..., :R], rope, ablate), x[..., R:]], axis=-1)
    inv, factor = rope
    T, _, D = x.shape
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]        # [T, D/2]
    cos, sin = factor * np.cos(ang)[:, None, :], factor * np.sin(ang)[:, None, :]
    if ablate == "interleaved_rope":                                      # GPT-J pairs (2i, 2i+1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return out
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def sliding_window(cfg):
    """The window the config's transformers class applies to every layer (None: none). MistralConfig's
    default is 4096; Qwen's use_sliding_window is not read here (anvil refuses it)."""
    if cfg.get("model_type") not in ("mistral", "mixtral", "phi3"):
        return None
    return cfg.get("sliding_window", 4096 if cfg.get("model_type") == "mistral" else None)


def forward(model_dir, ids, ablate=None, long_factors=False):
    W = Weights(model_dir, ablate)
    cfg = W.cfg
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    if ablate == "eps_1e-5_vs_1e-6":
        eps = 1e-6 if eps == 1e-5 else 1e-5
    bf = (lambda a: a) if ablate != "bf16_activations" else to_bf16
    prf = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0
    R = int(D * prf)  # Phi3Attention's rotary_ndims
    inv = rope_inv_freq(cfg, R, ablate, long_factors)
    T = len(ids)
    emb = W.matrix("model.embed_tokens")
    h = bf(emb[ids])
    mask = np.triu(np.full((T, T), -np.inf), 1)
    # Sliding-window attention, as transformers' Mistral/Mixtral/Phi-3 masks (and mlx-lm's
    # create_causal_mask): query i sees keys j with i - window < j <= i.
    window = sliding_window(cfg)
    if window and ablate != "no_sliding_window":
        i, j = np.indices((T, T))
        mask[i - j >= window] = -np.inf
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = bf(rmsnorm(h, W.vector(p + "input_layernorm.weight"), eps))

        def proj(name, x):
            y = x @ W.matrix(p + "self_attn." + name).T
            if W.has(p + "self_attn." + name + ".bias") and ablate != "no_qkv_bias":
                y = y + W.vector(p + "self_attn." + name + ".bias")
            return y
        if W.has(p + "self_attn.qkv_proj.weight"):  # Phi-3: one product, its output sliced
            qkv = proj("qkv_proj", a)
            q, k, v = np.split(qkv, [H * D, (H + KV) * D], axis=-1)
            if ablate == "qkv_order_kqv":
                k, q = np.split(qkv, [KV * D], axis=-1)[0], qkv[:, KV * D:(KV + H) * D]
            q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
        else:
            q = proj("q_proj", a).reshape(T, H, D)
            k = proj("k_proj", a).reshape(T, KV, D)
            v = proj("v_proj", a).reshape(T, KV, D)
        if W.has(p + "self_attn.q_norm.weight") and ablate != "no_qk_norm":
            q = rmsnorm(q, W.vector(p + "self_attn.q_norm.weight"), eps)
            k = rmsnorm(k, W.vector(p + "self_attn.k_norm.weight"), eps)
        q, k = bf(apply_rope(q, inv, ablate, R)), bf(apply_rope(k, inv, ablate, R))
        v = bf(v)
        o = np.empty((T, H, D))
        for hh in range(H):
            kvh = hh % KV if ablate == "gqa_modulo" else hh // (H // KV)
            s = q[:, hh, :] @ k[:, kvh, :].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh, :] = (s / s.sum(-1, keepdims=True)) @ v[:, kvh, :]
        h = bf(h + bf(o.reshape(T, H * D)) @ W.matrix(p + "self_attn.o_proj").T)
        m = bf(rmsnorm(h, W.vector(p + "post_attention_layernorm.weight"), eps))
        if W.has(p + "mlp.gate_up_proj.weight"):  # Phi-3: gate first, then up
            g, u = np.split(m @ W.matrix(p + "mlp.gate_up_proj").T, 2, axis=-1)
            if ablate == "up_gate_order":
                g, u = u, g
        else:
            g, u = m @ W.matrix(p + "mlp.gate_proj").T, m @ W.matrix(p + "mlp.up_proj").T
        h = bf(h + bf(g / (1 + np.exp(-g)) * u) @ W.matrix(p + "mlp.down_proj").T)
    hn = bf(rmsnorm(h, W.vector("model.norm.weight"), eps))
    head = emb if cfg.get("tie_word_embeddings") and not W.has("lm_head.weight") else W.matrix("lm_head")
    return hn @ head.T


def to_bf16(a):
    """Round float64 -> bf16 (nearest even) -> float64: simulates an engine keeping activations in bf16."""
    f = np.asarray(a, np.float32).view(np.uint32)
    f = ((f + 0x7FFF + ((f >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return f.view(np.float32).astype(np.float64)


def rel_err(ours, ref):
    return (np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)).max()


ABLATIONS = ["bf16_activations", "interleaved_rope", "eps_1e-5_vs_1e-6", "gqa_modulo", "no_qk_norm",
             "no_qkv_bias", "no_llama3_scaling", "no_yarn_freqs", "no_yarn_attention_factor", "quant_msb_first",
             "qkv_order_kqv", "up_gate_order", "longrope_other_factors", "longrope_no_attention_factor",
             "rotate_whole_head", "no_sliding_window"]


def applies(ablation, W):
    cfg = W.cfg
    sc = cfg.get("rope_scaling") or {}
    kind = sc.get("rope_type", sc.get("type"))
    return {
        "no_qk_norm": W.has("model.layers.0.self_attn.q_norm.weight"),
        "no_qkv_bias": W.has("model.layers.0.self_attn.q_proj.bias"),
        "no_llama3_scaling": kind == "llama3",
        "no_yarn_freqs": kind == "yarn",
        "no_yarn_attention_factor": kind == "yarn",
        "quant_msb_first": bool(cfg.get("quantization")),
        "qkv_order_kqv": W.has("model.layers.0.self_attn.qkv_proj.weight"),
        "up_gate_order": W.has("model.layers.0.mlp.gate_up_proj.weight"),
        "longrope_other_factors": "long_factor" in sc,
        "longrope_no_attention_factor": "long_factor" in sc,
        "rotate_whole_head": (cfg.get("partial_rotary_factor") or 1.0) != 1.0,
        "no_sliding_window": bool(sliding_window(cfg)),
    }.get(ablation, True)


def main():
    names = sys.argv[1:] or sorted(p.name for p in GOLDEN.iterdir() if (p / "meta.json").exists())
    print(f"{'model':22s} {'prompt':>6s} {'rel_err':>9s} {'argmax':>7s}   "
          "ablations: max rel_err (argmax mismatches)")
    for name in names:
        meta = json.loads((GOLDEN / name / "meta.json").read_text())
        model_dir = SHARED / meta["shared_model"] if "shared_model" in meta else GOLDEN / name
        if not model_dir.exists():
            print(f"{name}: {model_dir} missing, skipped")
            continue
        W = Weights(model_dir, None)
        long_factors = meta.get("longrope_factors") == "long"  # LongRoPE: which factors the engine runs
        for k, ids in enumerate(meta["prompts"]):
            ref = np.load(GOLDEN / name / f"ref_{k}.npy").astype(np.float64)
            ours = forward(model_dir, ids, None, long_factors)
            mism = int((ours.argmax(-1) != ref.argmax(-1)).sum())
            line = f"{name:22s} {k:6d} {rel_err(ours, ref):9.2e} {mism:7d}  "
            if k == 0:
                for ab in ABLATIONS:
                    if applies(ab, W):
                        alt = forward(model_dir, ids, ab, long_factors)
                        flips = int((alt.argmax(-1) != ref.argmax(-1)).sum())
                        line += f" {ab}={rel_err(alt, ref):.1e}({flips})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
