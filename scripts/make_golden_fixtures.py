#!/usr/bin/env python3
"""Freeze the golden model fixtures under tests/data/golden/.

    python scripts/make_golden_fixtures.py [model-name ...]     (no names: all of them)

Takes ~25 min on 2 busy cores, most of it mlx-lm's slow bf16 CPU path on anvil-tiny-code-q4. Re-running
it reproduces the committed files byte for byte (checked for the MLX models).

For every model this writes, into tests/data/golden/<name>/:
  config.json, model.safetensors (+ generation_config.json)   the tiny checkpoint itself
                                                               (not for the two shared anvil-tiny-code models)
  ref_<k>.npy   float32 [T, vocab]: logits of one teacher-forced forward over prompt k, computed in float32
                by an independent reference (transformers for HF checkpoints, mlx-lm for MLX ones)
  meta.json     prompts, 24-token greedy continuations of the float32 reference (EOS ignored), the minimum
                top1-top2 margin along each greedy path (a prompt is only accepted if that margin is >=
                MIN_MARGIN, the bf16 run of the reference produces the same 24 tokens, and the path has no
                EOS id: an engine's --ignore-eos never picks one, so it could not follow), and the error of
                the same reference run in bf16 against its float32 run (how far an engine that computes
                in bf16 is expected to land).

Error metric (the C++ test uses the same): for each position t,
    rel_err[t] = ||ours[t,:] - ref[t,:]||_2 / ||ref[t,:]||_2 ;  we store max_t rel_err[t]
plus argmax agreement per position.

Everything is deterministic: fixed seeds for weights and prompts; reference math on CPU in float32.
Tiny models are random but scaled so logits are peaky (lm_head/embedding std 1.0 -> logit std ~8), and a
prompt is only accepted when its greedy path has no near-tie (min top1-top2 margin >= MIN_MARGIN);
rejected candidates are counted in meta.json ("rejected_prompt_candidates").

config.json is written in the layout of real Hub checkpoints (rope_theta / rope_scaling at top level,
"torch_dtype"), not transformers 5's "rope_parameters"; the reference is computed by re-loading the saved
directory, so it is the saved config and the saved (bf16 / quantized) weights that the references use.
"""
import copy
import glob
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "golden"
SHARED = Path(os.environ.get("ANVIL_SHARED_DIR", ROOT.parent / "shared"))

GREEDY_STEPS = 24
MIN_MARGIN = 0.15          # minimum top1-top2 logit gap along an accepted greedy path (absolute, in logits)
MIN_MARGIN_TRAINED = 0.05  # the trained model has natural, flatter distributions
VOCAB = 512


# ----------------------------------------------------------------------------------------------- metrics

def rel_err_rows(ours, ref):
    """Per position ||ours-ref||_2 / ||ref||_2, float64."""
    ours = np.asarray(ours, np.float64)
    ref = np.asarray(ref, np.float64)
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def top2_margin(row):
    s = np.sort(np.asarray(row, np.float64))
    return float(s[-1] - s[-2])


# ------------------------------------------------------------------------------------------ transformers

def torch_setup():
    import torch
    torch.set_num_threads(2)
    torch.manual_seed(0)
    return torch


class HFRunner:
    """transformers reference on CPU; eager attention, no KV cache (greedy re-runs the whole prefix)."""

    def __init__(self, model_dir, dtype):
        torch = torch_setup()
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, attn_implementation="eager").eval()

    def logits(self, ids):
        with self.torch.no_grad():
            out = self.model(input_ids=self.torch.tensor([ids]), use_cache=False).logits[0]
        return out.float().numpy()


class MLXRunner:
    """mlx-lm reference on CPU. float32: every floating parameter (norms, scales, biases, dense weights) is
    cast to float32; the packed uint32 quantized weights stay exactly the checkpoint's."""

    def __init__(self, model_dir, float32):
        import mlx.core as mx
        from mlx.utils import tree_map
        from mlx_lm.utils import load_model
        mx.set_default_device(mx.cpu)
        self.mx = mx
        self.model, self.config = load_model(Path(model_dir))
        if float32:
            self.model.update(tree_map(
                lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                self.model.parameters()))
        mx.eval(self.model.parameters())

    def logits(self, ids):
        out = self.model(self.mx.array([ids]))[0].astype(self.mx.float32)
        return np.array(out)

    def step_logits(self, ids):
        """Like logits(seq)[-1] for seq = all ids fed so far, through mlx-lm's KV cache (MLX's bf16 CPU
        kernels are slow; re-running the whole prefix every step takes minutes on the 8k-vocab model)."""
        if not hasattr(self, "cache"):
            from mlx_lm.models.cache import make_prompt_cache
            self.cache = make_prompt_cache(self.model)
        out = self.model(self.mx.array([ids]), cache=self.cache)[0, -1].astype(self.mx.float32)
        return np.array(out)


def greedy(runner, ids, steps):
    """Greedy continuation (EOS ignored); returns (new ids, margins at each step)."""
    seq = list(ids)
    new, margins = [], []
    if hasattr(runner, "cache"):
        del runner.cache
    for i in range(steps):
        last = runner.step_logits(seq if i == 0 else seq[-1:]) if hasattr(runner, "step_logits") \
            else runner.logits(seq)[-1]
        nxt = int(np.argmax(last))
        margins.append(top2_margin(last))
        new.append(nxt)
        seq.append(nxt)
    return new, margins


def versions(kind):
    import safetensors
    v = {"numpy": np.__version__, "python": sys.version.split()[0], "safetensors": safetensors.__version__}
    if kind == "hf":  # torch only where it is the reference: an mlx-lm fixture needs neither it nor transformers
        import torch, transformers
        v.update(transformers=transformers.__version__, torch=torch.__version__)
    else:
        import mlx.core as mx
        import mlx_lm
        v.update(mlx=mx.__version__, mlx_lm=mlx_lm.__version__)
    return v


# ------------------------------------------------------------------------------------ fixture for a model

def random_prompt_candidates(seed, vocab, n=200):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length = int(rng.integers(12, 21))
        yield [int(x) for x in rng.integers(1, vocab, size=length)]  # id 0 is EOS; keep it out


def eos_ids(model_dir):
    """The stop ids of config.json and generation_config.json (an int or a list in each)."""
    ids = set()
    for f in ("config.json", "generation_config.json"):
        p = Path(model_dir) / f
        v = json.loads(p.read_text()).get("eos_token_id") if p.exists() else None
        ids.update(v if isinstance(v, list) else [] if v is None else [v])
    return ids


def write_fixture(name, kind, model_dir, candidates, min_margin, extra_meta=None, n_prompts=2):
    """Select prompts, compute references, write ref_<k>.npy and meta.json into OUT/name."""
    dst = OUT / name
    eos = eos_ids(model_dir)
    dst.mkdir(parents=True, exist_ok=True)
    if kind == "hf":
        import torch
        f32, b16 = HFRunner(model_dir, torch.float32), HFRunner(model_dir, torch.bfloat16)
        ref_name = "transformers %s (torch %s) float32, CPU, eager attention" % (
            __import__("transformers").__version__, torch.__version__)
    else:
        import mlx_lm
        f32, b16 = MLXRunner(model_dir, True), MLXRunner(model_dir, False)
        import mlx.core as mx
        ref_name = "mlx-lm %s (mlx %s) float32 (params incl. scales/biases cast to f32), CPU" % (
            mlx_lm.__version__, mx.__version__)

    meta = {"prompts": [], "greedy": [], "bf16_rel_err": [], "bf16_argmax_mismatch": [],
            "min_margin": [], "teacher_forced_min_margin": [], "reference": ref_name,
            "versions": versions(kind), "metric": "rel_err = max over positions of ||ours-ref||_2/||ref||_2",
            "rejected_prompt_candidates": 0}
    if extra_meta:
        meta.update(extra_meta)
    k = 0
    took_text = False
    for cand in candidates:
        ids, text = cand if isinstance(cand, tuple) else (cand, None)
        if text is not None and took_text:
            continue  # at most one real-text prompt; the other is random ids
        cont, margins = greedy(f32, ids, GREEDY_STEPS)
        # The engine's greedy run ignores EOS by never picking it (--ignore-eos, as llama.cpp's): a path
        # through an EOS id is one it cannot follow.
        if eos & set(cont):
            meta["rejected_prompt_candidates"] += 1
            print(f"  {name}: reject prompt (greedy path reaches an EOS id)")
            continue
        if min(margins) < min_margin:
            meta["rejected_prompt_candidates"] += 1
            print(f"  {name}: reject prompt (greedy near-tie {min(margins):.4f})")
            continue
        # An engine at bf16-level error must be able to reproduce the path exactly: require that the bf16
        # run of the reference itself does.
        if greedy(b16, ids, GREEDY_STEPS)[0] != cont:
            meta["rejected_prompt_candidates"] += 1
            print(f"  {name}: reject prompt (bf16 reference greedy path differs)")
            continue
        ref = f32.logits(ids).astype(np.float32)
        low = b16.logits(ids)
        err = rel_err_rows(low, ref)
        np.save(dst / f"ref_{k}.npy", ref)
        meta["prompts"].append(ids)
        meta["greedy"].append(cont)
        meta["min_margin"].append(round(min(margins), 5))
        meta["teacher_forced_min_margin"].append(round(min(top2_margin(r) for r in ref), 6))
        meta["bf16_rel_err"].append(float("%.3e" % err.max()))
        meta["bf16_argmax_mismatch"].append(int((low.argmax(-1) != ref.argmax(-1)).sum()))
        if text is not None:
            took_text = True
        if extra_meta and "shared_model" in extra_meta:
            meta.setdefault("prompt_texts", []).append(text)
        print(f"  {name}: prompt {k} len {len(ids)} min_margin {min(margins):.3f} "
              f"bf16_rel_err {err.max():.2e}")
        k += 1
        if k == n_prompts:
            break
    assert k == n_prompts, f"{name}: not enough prompts without near-ties"
    write_meta(dst, meta)


def write_meta(dst, meta):
    """dst/meta.json, one key per line, each value compact: readable diffs when the fixtures are re-made."""
    lines = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items())
    (dst / "meta.json").write_text("{\n" + lines + "\n}\n")


def accept_numpy_check(name, dst, meta, worst, said=""):
    """The sibling scripts' last step: refuse to write unless the numpy float64 forward agreed with the
    reference within 1e-5 (worst: its largest rel_err over the prompts), else record it in meta.json."""
    if worst > 1e-5:
        sys.exit(f"{name}: the numpy float64 forward and mlx-lm disagree (rel_err {worst:.2e}); not written")
    meta["numpy_float64_rel_err"] = float("%.3e" % worst)
    write_meta(dst, meta)
    print(f"  {name}: numpy float64 forward within {worst:.2e} of mlx-lm{said}")


# ------------------------------------------------------------------------------------- tiny HF checkpoints

def hub_style_config(model_dir):
    """Rewrite transformers-5 config.json (rope_parameters) into the layout of real Hub checkpoints."""
    p = Path(model_dir) / "config.json"
    cfg = json.loads(p.read_text())
    rp = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = rp.get("rope_theta", 10000.0)
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    cfg["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    cfg["torch_dtype"] = cfg.pop("dtype", "bfloat16")
    cfg.pop("layer_types", None)  # all full attention; real Qwen3/Qwen2/Llama configs mostly omit it
    p.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def make_hf_model(name, arch, seed, **cfg):
    """Random tiny model, saved in bf16 with save_pretrained; returns its directory."""
    torch = torch_setup()
    import transformers
    config_cls = getattr(transformers, arch + "Config")
    model_cls = getattr(transformers, arch + "ForCausalLM")
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=0,
                initializer_range=0.2)
    base.update(cfg)
    config = config_cls(**base)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):            # RMSNorm gains around 1, not all 1
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif pname.endswith(".bias"):                # Qwen2 q/k/v biases: non-zero
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in pname or "lm_head" in pname:
                p.copy_(1.0 * torch.randn(p.shape, generator=g))  # peaky logits
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    dst = OUT / name
    if dst.exists():
        shutil.rmtree(dst)
    model.to(torch.bfloat16).save_pretrained(str(dst), safe_serialization=True)
    hub_style_config(dst)
    return dst


# ------------------------------------------------------------------------------------ MLX quantized models

def make_mlx_quant(name, src, group_size, bits, predicate=None, explicit_false=()):
    """Quantize the HF checkpoint `src` with mlx-lm (affine, bf16 scales/biases, embedding quantized too)."""
    import mlx.core as mx
    from mlx_lm.utils import load_model, quantize_model, save_model, save_config
    mx.set_default_device(mx.cpu)
    model, config = load_model(Path(src))
    model, qconfig = quantize_model(model, config, group_size, bits, quant_predicate=predicate)
    for path in explicit_false:                          # per-module "not quantized" entries
        qconfig["quantization"][path] = False
    dst = OUT / name
    if dst.exists():
        shutil.rmtree(dst)
    save_model(dst, model)
    save_config(qconfig, dst / "config.json")
    shutil.copy(Path(src) / "generation_config.json", dst)
    return dst


# ----------------------------------------------------------------------------------------------- main

def main():
    only = set(sys.argv[1:])
    want = lambda n: not only or n in only
    OUT.mkdir(parents=True, exist_ok=True)

    hf = {
        # head_dim * heads == hidden; tied embeddings
        "qwen3-bf16-tied": dict(arch="Qwen3", seed=11, num_hidden_layers=2, head_dim=16,
                                tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6),
        # head_dim 32 with 4 heads != hidden 64; untied lm_head
        "qwen3-bf16-untied": dict(arch="Qwen3", seed=22, num_hidden_layers=3, head_dim=32,
                                  tie_word_embeddings=False, rope_theta=1e6, rms_norm_eps=1e-6),
        # q/k/v biases, no q/k norm; head_dim implied = hidden / heads
        "qwen2-bf16": dict(arch="Qwen2", seed=33, num_hidden_layers=2, tie_word_embeddings=True,
                           rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False),
        # llama3 rope scaling. head_dim 16, theta 5e5: inv freqs 1, .19, .037, ... -> wavelengths 6.3, 33,
        # 168, ...: with original_max_position_embeddings 64 (high-freq wavelen 16, low-freq wavelen 64),
        # pair 0 is kept, pair 1 is smoothly interpolated, pairs 2..7 are divided by 8, all visible at
        # positions 12..44.
        "llama-bf16": dict(arch="Llama", seed=44, num_hidden_layers=2, head_dim=16,
                           tie_word_embeddings=False, rms_norm_eps=1e-5,
                           rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}),
    }
    for name, spec in hf.items():
        spec = dict(spec)
        arch, seed = spec.pop("arch"), spec.pop("seed")
        if want(name) or not (OUT / name / "model.safetensors").exists():
            print(f"[{name}] building")
            make_hf_model(name, arch, seed, **spec)
        if want(name):
            write_fixture(name, "hf", OUT / name, random_prompt_candidates(seed, VOCAB), MIN_MARGIN)

    tied, untied = OUT / "qwen3-bf16-tied", OUT / "qwen3-bf16-untied"

    def keep_head_8bit(path, module):
        if path == "lm_head":
            return {"group_size": 32, "bits": 8}
        if path.startswith("model.layers.1.mlp."):
            return False
        return True

    quants = {
        "qwen3-q4g32": (tied, 32, 4, None, ()),
        "qwen3-q4g64": (untied, 64, 4, None, ()),
        "qwen3-q8g64": (tied, 64, 8, None, ()),
        "qwen3-q3g64": (untied, 64, 3, None, ()),   # 3-bit: elements straddle bytes and words
        "qwen3-q6g32": (tied, 32, 6, None, ()),     # 6-bit
        # base q4g64; lm_head 8-bit g32 (per-module dict); layer 1's MLP kept bf16 (per-module false)
        "qwen3-mixed": (untied, 64, 4, keep_head_8bit,
                        tuple(f"model.layers.1.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj"))),
    }
    for i, (name, (src, gs, bits, pred, false_paths)) in enumerate(quants.items()):
        if not want(name):
            continue
        print(f"[{name}] quantizing {src.name} g{gs} b{bits}")
        make_mlx_quant(name, src, gs, bits, pred, false_paths)
        write_fixture(name, "mlx", OUT / name, random_prompt_candidates(100 + i, VOCAB), MIN_MARGIN,
                      {"quantized_from": src.name})

    # The trained model: references only; its weights stay in ../shared (too big to commit).
    from tokenizers import Tokenizer
    texts = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main():\n",
             "class Stack:\n    def __init__(self):\n", "for i in range(10):\n    print("]
    for name, kind in (("anvil-tiny-code", "hf"), ("anvil-tiny-code-q4", "mlx")):
        if not want(name):
            continue
        src = SHARED / "fixtures" / name
        if not src.exists():
            print(f"[{name}] skipped: {src} not found")
            continue
        tok = Tokenizer.from_file(str(src / "tokenizer.json"))
        vocab = json.loads((src / "config.json").read_text())["vocab_size"]
        cands = [(tok.encode(t).ids, t) for t in texts] + list(random_prompt_candidates(7, vocab))
        print(f"[{name}] references")
        write_fixture(name, kind, src, cands, MIN_MARGIN_TRAINED,
                      {"shared_model": f"fixtures/{name}"})


if __name__ == "__main__":
    main()
