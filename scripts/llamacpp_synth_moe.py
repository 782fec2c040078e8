#!/usr/bin/env python3
"""Writes a random-weight Qwen3-MoE GGUF with llama.cpp's own converter, for
scripts/bench_llamacpp_moe.sh. Not part of the tests.

Why not `anvil synth --quant bf16` + convert_hf_to_gguf.py + llama-quantize, as
scripts/bench_llamacpp.sh does for qwen3-0.6b: anvil synth builds the whole model in memory before
writing it, and the qwen3-30b-a3b-16L shape is 10.6 B parameters (21 GB as bf16) on a 24 GB
machine; and on the shared 2-core machine, pushing 21 GB through the Python converter and 21 GB more
through llama-quantize takes far longer than the benchmark. So this script takes the checkpoint
*without weights* (`anvil synth --config-only`: anvil's config.json for the shape and the Qwen3
tokenizer) and runs llama.cpp's Qwen3MoeModel converter on it with its tensors coming from a random
generator instead of safetensors files. Everything else (tensor names and GGUF layout, the
hyperparameters, the vocabulary and chat template) is the converter's own code path, and it stays
lazy: a tensor is generated when the writer reaches it, so memory never holds the model.

--outtype f16: the weights are drawn as anvil synth draws them (src/model/synth.h): every linear
uniform in [-a, a] with a = sqrt(3 / fan_in), norms 1, in the Hugging Face per-expert layout
(model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight) that Qwen/Qwen3-30B-A3B ships and the
converter stacks. Quantize it with `llama-quantize --pure F16.gguf OUT.gguf Q4_0`.

--outtype q4_0 (default): writes what `llama-quantize --pure ... Q4_0` makes of that file directly,
with random Q4_0 blocks: every tensor llama-quantize quantizes (all 2-D and 3-D weights except the
router ffn_gate_inp, which it keeps F32) is Q4_0 with random 4-bit codes and the block scale a/8
(values in [-a, 7a/8], as anvil synth's q4g64 draws random codes over [-a, a]); the router is drawn
uniform F32 as above and the norms are ones. bench_llamacpp_moe.sh checks on the tiny-moe shape
that both routes give the same tensor names, types and shapes. Decode speed does not depend on the
values; only the shapes and the router spreading tokens over experts matter, and a random router
does that as anvil's does.

Usage: llamacpp_synth_moe.py LLAMA_CPP_SRC MODEL_DIR OUT.gguf [--outtype q4_0|f16] [--seed N]
"""
import argparse
import logging
import math
import sys
import zlib
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("llama_cpp_src", type=Path, help="llama.cpp source tree (has convert_hf_to_gguf.py)")
    ap.add_argument("model_dir", type=Path, help="config.json + tokenizer files (anvil synth --config-only)")
    ap.add_argument("out", type=Path, help="output GGUF")
    ap.add_argument("--outtype", choices=["q4_0", "f16"], default="q4_0")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    src = args.llama_cpp_src.resolve()
    if not (src / "convert_hf_to_gguf.py").is_file():
        print(f"error: {src}/convert_hf_to_gguf.py not found (pass llama.cpp's source tree)", file=sys.stderr)
        return 2
    if not (args.model_dir / "config.json").is_file():
        print(f"error: {args.model_dir}/config.json not found (write it with anvil synth --config-only)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))
    logging.basicConfig(level=logging.INFO)

    import torch
    import gguf
    from conversion.base import LazyTorchTensor
    from conversion.qwen import Qwen3MoeModel

    class RandomQwen3Moe(Qwen3MoeModel):
        """Qwen3MoeModel whose tensors are generated, lazily, instead of read from safetensors."""
        model_arch = Qwen3MoeModel.model_arch

        def index_tensors(self, remote_hf_model_id=None):
            h = self.hparams
            if h.get("model_type") != "qwen3_moe":
                raise ValueError(f"config.json: model_type {h.get('model_type')!r}, expected 'qwen3_moe'")
            H, V, L = h["hidden_size"], h["vocab_size"], h["num_hidden_layers"]
            D = h["head_dim"]
            QD, KD = h["num_attention_heads"] * D, h["num_key_value_heads"] * D
            E = self.find_hparam(["num_experts", "num_local_experts"])  # transformers renames it
            F = h["moe_intermediate_size"]

            def lazy(name, shape, fan_in):
                # fan_in 0: a norm (ones). The generator is seeded per tensor name: deterministic.
                def gen(shape=shape, fan_in=fan_in, seed=(zlib.crc32(name.encode()) ^ args.seed)):
                    if fan_in == 0:
                        return torch.ones(shape, dtype=torch.bfloat16)
                    g = torch.Generator().manual_seed(seed)
                    a = math.sqrt(3.0 / fan_in)
                    return ((torch.rand(shape, generator=g) * 2.0 - 1.0) * a).to(torch.bfloat16)
                meta = torch.empty(shape, dtype=torch.bfloat16, device="meta")
                return lambda: LazyTorchTensor(meta=meta, args=(), func=lambda: gen())

            t = {"model.embed_tokens.weight": lazy("model.embed_tokens.weight", (V, H), H)}
            for l in range(L):
                p = f"model.layers.{l}."
                spec = [("input_layernorm.weight", (H,), 0), ("post_attention_layernorm.weight", (H,), 0),
                        ("self_attn.q_norm.weight", (D,), 0), ("self_attn.k_norm.weight", (D,), 0),
                        ("self_attn.q_proj.weight", (QD, H), H), ("self_attn.k_proj.weight", (KD, H), H),
                        ("self_attn.v_proj.weight", (KD, H), H), ("self_attn.o_proj.weight", (H, QD), QD),
                        ("mlp.gate.weight", (E, H), H)]
                for e in range(E):
                    spec += [(f"mlp.experts.{e}.gate_proj.weight", (F, H), H),
                             (f"mlp.experts.{e}.up_proj.weight", (F, H), H),
                             (f"mlp.experts.{e}.down_proj.weight", (H, F), F)]
                for n, shape, fan_in in spec:
                    t[p + n] = lazy(p + n, shape, fan_in)
            t["model.norm.weight"] = lazy("model.norm.weight", (H,), 0)
            if not h.get("tie_word_embeddings", False):
                t["lm_head.weight"] = lazy("lm_head.weight", (V, H), H)
            return t

    if args.outtype == "q4_0":
        import numpy as np
        Q4_0 = gguf.GGMLQuantizationType.Q4_0
        block, type_size = gguf.GGML_QUANT_SIZES[Q4_0]  # 32 weights in 18 bytes: fp16 d, 16 bytes of codes
        float_quantize = gguf.quants.quantize

        def random_q4_0(name, shape, fan_in):
            if shape[-1] % block:
                raise ValueError(f"{name}: {shape[-1]} columns is not a multiple of {block}")
            nblocks = math.prod(shape) // block
            d = np.float16(math.sqrt(3.0 / fan_in) / 8.0)  # codes 0..15 -> (q - 8) * d in [-a, 7a/8]

            def gen():
                rng = np.random.default_rng(zlib.crc32(name.encode()) ^ args.seed)
                b = np.frombuffer(rng.bytes(nblocks * type_size), dtype=np.uint8).reshape(nblocks, type_size).copy()
                b[:, :2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
                return b.reshape(*shape[:-1], shape[-1] // block * type_size)
            meta = gguf.LazyNumpyTensor.meta_with_dtype_and_shape(np.uint8, (*shape[:-1], shape[-1] // block * type_size))
            return gguf.LazyNumpyTensor(meta=meta, args=(), func=gen)

        # The converter asks for Q4_0 through tensor_force_quant and quantizes with gguf.quants.quantize;
        # for Q4_0 this returns random blocks of the tensor's shape instead, so the float weights the
        # generator would make are never materialized (they stay lazy, unevaluated).
        current = {}

        def quantize(data, qtype):
            if qtype != Q4_0:
                return float_quantize(data, qtype)
            return random_q4_0(current["name"], tuple(data.shape), current["fan_in"])
        gguf.quants.quantize = quantize

        def force_q4_0(self, name, new_name, bid, n_dims):
            if n_dims < 2 or new_name.endswith("_norm.weight") or ".ffn_gate_inp." in new_name:
                return False  # F32, as llama-quantize leaves them (norms, the router)
            current["name"] = new_name
            current["fan_in"] = self_hparams_fan_in(self, new_name)
            return Q4_0

        def self_hparams_fan_in(self, new_name):
            # The inner dimension: the expert FFN width for ffn_down_exps, attention width for attn_output.
            h = self.hparams
            if ".ffn_down_exps." in new_name:
                return h["moe_intermediate_size"]
            if ".attn_output." in new_name:
                return h["num_attention_heads"] * h["head_dim"]
            return h["hidden_size"]
        RandomQwen3Moe.tensor_force_quant = force_q4_0
        ftype = gguf.LlamaFileType.MOSTLY_Q4_0
    else:
        ftype = gguf.LlamaFileType.MOSTLY_F16

    with torch.inference_mode():
        m = RandomQwen3Moe(args.model_dir, ftype, args.out)
        m.write()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
