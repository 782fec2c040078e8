#!/usr/bin/env python3
"""Freeze the mixture-of-experts golden fixtures under tests/data/golden/ (issue 12).

    python scripts/make_moe_golden_fixtures.py [model-name ...]     (no names: all of them)

A sibling of make_golden_fixtures.py that reuses its machinery (prompt selection, references, meta.json;
see that file for the rules): the same comparison and greedy-continuation tests in tests/model/golden_test.cpp
run on every directory written here.

For each of the four MoE architectures it writes two tiny random models:
  <arch>-bf16   saved by transformers, then rewritten with Hugging Face per-expert tensor names
                (mlp.experts.N.{gate,up,down}_proj, Mixtral's block_sparse_moe.experts.N.w1/w2/w3) as real Hub
                checkpoints have them; the float32 reference is transformers re-loading that directory.
  <arch>-q4     the bf16 model quantized by mlx-lm: experts and everything else 4-bit group 64, the router
                (and qwen2_moe's shared-expert gate) 8-bit group 64 through a per-module override, as
                mlx-community Qwen3-MoE checkpoints keep mlp.gate; experts stacked (switch_mlp) as mlx-lm saves
                them; the reference is mlx-lm.

Shapes exercise what differs between the families: qwen3_moe has a dense layer (mlp_only_layers) and
renormalized top-k; qwen2_moe has q/k/v biases and the gated shared expert, no renormalization; olmoe has
q/k RMSNorm over the whole projection; mixtral's softmax over the top-k logits. The expert width (64) is a
multiple of the CPU integer kernel's block, so the 4-bit models run the fast path.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden_fixtures as g  # noqa: E402

COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
              tie_word_embeddings=False)
MODELS = {
    # 3 layers, layer 1 dense (mlp_only_layers); head_dim 16; renormalized top-2 of 8
    "qwen3-moe": dict(arch="Qwen3Moe", seed=51, num_hidden_layers=3, head_dim=16, intermediate_size=128,
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[1], rope_theta=1e6),
    # shared expert with its sigmoid gate; q/k/v biases; top-2 of 8 without renormalization
    "qwen2-moe": dict(arch="Qwen2Moe", seed=52, num_hidden_layers=2, intermediate_size=128, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=128,
                      norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1e6,
                      use_sliding_window=False),
    # q/k norm over the whole projection; experts use intermediate_size
    "olmoe": dict(arch="Olmoe", seed=53, num_hidden_layers=2, intermediate_size=64, num_experts=8,
                  num_experts_per_tok=2, norm_topk_prob=False, rope_theta=10000.0, rms_norm_eps=1e-5),
    # block_sparse_moe, w1/w2/w3; softmax over the top-2 logits
    "mixtral": dict(arch="Mixtral", seed=54, num_hidden_layers=2, intermediate_size=64, num_local_experts=8,
                    num_experts_per_tok=2, rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None),
}


def hub_moe_config(model_dir, arch):
    """transformers 5 writes the expert count as num_local_experts for every family; Hub checkpoints of
    qwen3_moe / qwen2_moe / olmoe (and mlx-lm, which requires it) say num_experts."""
    p = Path(model_dir) / "config.json"
    cfg = json.loads(p.read_text())
    if arch != "Mixtral" and "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    p.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def check_loads(model_dir):
    """transformers must find every parameter under the rewritten names (else it would initialize some
    randomly and the reference would not be the saved model)."""
    import torch
    from transformers import AutoModelForCausalLM
    _, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, f"{model_dir}: transformers did not load the checkpoint cleanly: {bad}"


def to_per_expert(model_dir, arch):
    """Write the experts under the per-expert names of Hub checkpoints: transformers-5 fused tensors
    (experts.gate_up_proj [E, 2F, H], experts.down_proj [E, H, F]) are split; Mixtral's modules are named
    block_sparse_moe.experts.N.w1 (gate) / w3 (up) / w2 (down) and block_sparse_moe.gate."""
    import re
    from safetensors.torch import load_file as tload, save_file as tsave
    p = Path(model_dir) / "model.safetensors"
    t = tload(str(p))
    out = {}
    mixtral = arch == "Mixtral"
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for k, v in t.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            if mixtral:
                base = base.replace(".mlp.experts.", ".block_sparse_moe.experts.")
            F = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.{names[0]}.weight"] = v[e, :F].contiguous()
                out[f"{base}{e}.{names[1]}.weight"] = v[e, F:].contiguous()
        elif k.endswith("experts.down_proj"):
            base = k[: -len("down_proj")]
            if mixtral:
                base = base.replace(".mlp.experts.", ".block_sparse_moe.experts.")
            for e in range(v.shape[0]):
                out[f"{base}{e}.{names[2]}.weight"] = v[e].contiguous()
        elif mixtral and ".mlp.gate." in k:
            out[k.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = v
        elif mixtral and re.search(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.", k):
            k2 = k.replace(".mlp.experts.", ".block_sparse_moe.experts.")
            k2 = k2.replace(".gate_proj.", ".w1.").replace(".up_proj.", ".w3.").replace(".down_proj.", ".w2.")
            out[k2] = v
        else:
            out[k] = v
    tsave(out, str(p), metadata={"format": "pt"})
    return sorted(out)


# A prompt whose bf16 reference run lands farther than this from the float32 one (teacher-forced max
# rel_err) is rejected: with MoE that means a router near-tie somewhere along the prompt (the bf16 run
# picked another expert), a knife edge on which any engine may fall either way, and it would widen the
# test's limit (2x that error) to meaninglessness. Dense bf16 errors are 0.02..0.12 (make_golden_fixtures).
# mlx-lm's bf16 path also computes the router logits in bf16 and flips a top-2 choice on most prompts of the
# tiny 8-expert models (0.25..1.0 for 45 of 46 mixtral-q4 candidates), so its bound is looser.
MAX_BF16_REL_ERR = {"hf": 0.25, "mlx": 0.5}
# A prompt whose float32 reference path has a router near-tie anywhere (at some position and layer the k-th
# and (k+1)-th expert probabilities lie closer than this) is rejected too: an engine at bf16-level error
# may pick the other expert there, and that token's logits then move by 0.15..0.35 rel_err. Measured on
# these models (transformers bf16 vs float32 router probabilities): median |dp| 0.0003..0.0005, max
# 0.008..0.025; anvil's CUDA backend flipped ties of 0.00028 and 0.00062 and kept ties of 0.0011..0.0012,
# so 0.002 (~5x the median noise) leaves a margin over the observed flips. Checked for the HF (bf16)
# fixtures; the mlx (q4) ones rely on MAX_BF16_REL_ERR.
MIN_ROUTER_GAP = 0.002
_last_ref = {}


class HFRunner(g.HFRunner):
    def __init__(self, model_dir, dtype):
        super().__init__(model_dir, dtype)
        self.f32 = dtype == self.torch.float32

    def router_min_gap(self, ids):
        """min over positions and MoE layers of p_k - p_(k+1), the router's softmax probabilities sorted."""
        torch, probs = self.torch, []
        hook = lambda mod, inp, out: probs.append(torch.softmax(
            torch.nn.functional.linear(inp[0].reshape(-1, inp[0].shape[-1]), mod.weight).float(), -1))
        hs = [m.register_forward_hook(hook) for n, m in self.model.named_modules()
              if (n.endswith("mlp.gate") or n.endswith("block_sparse_moe.gate")) and hasattr(m, "weight")]
        with torch.no_grad():
            self.model(input_ids=torch.tensor([ids]), use_cache=False)
        for h in hs:
            h.remove()
        k = self.model.config.num_experts_per_tok
        s = torch.sort(torch.stack(probs), -1, descending=True).values
        return float((s[..., k - 1] - s[..., k]).min())


class MLXRunner(g.MLXRunner):
    def __init__(self, model_dir, float32):
        super().__init__(model_dir, float32)
        self.f32 = float32


g.HFRunner, g.MLXRunner = HFRunner, MLXRunner  # write_fixture constructs them by these names


def greedy_no_eos(runner, ids, steps, eos=0):
    # write_fixture runs the float32 greedy path first, then (if accepted so far) the bf16 one.
    if runner.f32:
        _last_ref["ids"], _last_ref["logits"] = list(ids), runner.logits(ids)
    elif _last_ref.get("ids") == list(ids):
        err = g.rel_err_rows(runner.logits(ids), _last_ref["logits"]).max()
        bound = MAX_BF16_REL_ERR["mlx" if isinstance(runner, g.MLXRunner) else "hf"]
        if err > bound:
            print(f"  bf16 reference rel_err {err:.3f} > {bound} (router near-tie): rejecting")
            return [-1] * steps, [1.0] * steps  # counted as "bf16 reference greedy path differs"
    new, margins = _greedy_no_eos(runner, ids, steps, eos)
    if runner.f32 and isinstance(runner, HFRunner):
        gap = runner.router_min_gap(list(ids) + new[:-1])
        if gap < MIN_ROUTER_GAP:
            print(f"  router near-tie {gap:.5f} < {MIN_ROUTER_GAP} along the path: rejecting")
            return new, [0.0] * steps  # counted as a greedy near-tie
    return new, margins


def _greedy_no_eos(runner, ids, steps, eos=0):
    """Greedy continuation with EOS suppressed, as `anvil generate --ignore-eos` does (the tiny models' EOS
    id is 0): the EOS logit is excluded from the argmax and from the top1-top2 margin."""
    seq = list(ids)
    new, margins = [], []
    if hasattr(runner, "cache"):
        del runner.cache
    for i in range(steps):
        last = runner.step_logits(seq if i == 0 else seq[-1:]) if hasattr(runner, "step_logits") \
            else runner.logits(seq)[-1]
        last = np.array(last, dtype=np.float64)
        last[eos] = -np.inf
        nxt = int(np.argmax(last))
        margins.append(g.top2_margin(last))
        new.append(nxt)
        seq.append(nxt)
    return new, margins


g.greedy = greedy_no_eos  # write_fixture looks it up at call time


def router_8bit(path, module):
    if path.endswith("mlp.gate") or path.endswith("block_sparse_moe.gate") or path.endswith("shared_expert_gate"):
        return {"group_size": 64, "bits": 8}
    return True


def main():
    only = set(sys.argv[1:])
    want = lambda n: not only or n in only
    g.OUT.mkdir(parents=True, exist_ok=True)
    for i, (base, spec) in enumerate(MODELS.items()):
        spec = dict(spec)
        arch, seed = spec.pop("arch"), spec.pop("seed")
        cfg = dict(COMMON)
        cfg.update(spec)
        bf16, q4 = f"{base}-bf16", f"{base}-q4"
        if want(bf16) or want(q4):
            if want(bf16) or not (g.OUT / bf16 / "model.safetensors").exists():
                print(f"[{bf16}] building")
                d = g.make_hf_model(bf16, arch, seed, **cfg)
                names = to_per_expert(d, arch)
                hub_moe_config(d, arch)
                check_loads(d)
                print(f"  {bf16}: {len(names)} tensors, e.g. {[n for n in names if 'experts.0.' in n][:3]}")
        if want(bf16):
            g.write_fixture(bf16, "hf", g.OUT / bf16, g.random_prompt_candidates(seed, g.VOCAB), g.MIN_MARGIN)
        if want(q4):
            print(f"[{q4}] quantizing {bf16} g64 b4, router 8-bit")
            g.make_mlx_quant(q4, g.OUT / bf16, 64, 4, router_8bit)
            # More candidates than the dense models need: the quantized 8-expert models have flatter logits
            # and mlx-lm's bf16 run often flips a router choice (mixtral-q4 accepted 1 of the first 200).
            g.write_fixture(q4, "mlx", g.OUT / q4, g.random_prompt_candidates(200 + i, g.VOCAB, n=1000),
                                       g.MIN_MARGIN, {"quantized_from": bf16})


if __name__ == "__main__":
    main()
