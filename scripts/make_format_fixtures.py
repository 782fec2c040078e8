#!/usr/bin/env python3
"""Freezes the reference files the format tests read (tests/data/format/).

Every file here is written by the reference implementation (the Python `safetensors` package,
numpy.save), never by anvil, and the values are recorded in JSON beside them, so the C++ tests
check our reader against an independent writer:

  reference.safetensors  one tensor of every safetensors dtype + metadata (safetensors.torch.save_file)
  reference.json         {name: {dtype, shape, values (flat, C order)}, "__metadata__": {...}}
  writer_match.safetensors  four tensors of distinct element sizes + one metadata key: our writer must
                         produce these exact bytes (tensor order and header layout are deterministic)
  writer_match.json      the same, as values
  npy_*.npy / npy.json   numpy.save outputs (f4, i4, f2, i8, a scalar and an empty array) + values
  config_llama.json, config_qwen2.json   config.json files as transformers writes them
  config_mistral*.json   Mistral configs as the Hub's checkpoints have them (v0.3: sliding_window null;
                         Nemo: an explicit head_dim of 128 on a hidden size of 5120 with 32 heads; v0.1:
                         sliding_window 4096; one with sliding_window and num_key_value_heads left out)
  config_phi3*.json, config_phi4.json   Phi-3 family configs (model_type phi3) as the Hub has them (Phi-3-mini-4k:
                         sliding_window 2047, multi-head; Phi-4: 40 heads over 10 kv heads, rope_theta 250000, no
                         window), one leaving Phi3Config's defaults out, and one as transformers 5 writes it
                         (rope_parameters with partial_rotary_factor inside)
  config_expected.json   what transformers' config objects say about those and the shared
                         anvil-tiny-code{,-q4} configs (the values parse_model_config must produce)

Re-run: python3 scripts/make_format_fixtures.py   (needs numpy, torch, safetensors, transformers;
reads ../shared/fixtures/anvil-tiny-code* beside the checkout, or $ANVIL_SHARED_DIR)
        python3 scripts/make_format_fixtures.py configs   (the config files only: needs transformers, no torch)
"""
import json
import os
import sys

import numpy as np

if sys.argv[1:] != ["configs"]:
    import torch
    from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "format")

ST_NAME = {} if sys.argv[1:] == ["configs"] else {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.uint16: "U16",
    torch.int32: "I32", torch.uint32: "U32", torch.int64: "I64", torch.uint64: "U64", torch.bool: "BOOL",
}


def values_of(t):
    # Exact: every float dtype widens to float64 without rounding, so Python floats hold the value.
    if t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        return [int(x) for x in t.to(torch.int64).flatten().tolist()]
    if t.dtype == torch.bool:
        return [bool(x) for x in t.flatten().tolist()]
    if t.dtype.is_floating_point:
        return t.to(torch.float64).flatten().tolist()
    return t.flatten().tolist()


def describe(tensors, metadata):
    d = {name: {"dtype": ST_NAME[t.dtype], "shape": list(t.shape), "values": values_of(t)}
         for name, t in tensors.items()}
    d["__metadata__"] = metadata
    return d


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    f = torch.randn(3, 5, generator=g)
    tensors = {
        "model.embed_tokens.weight": (f * 3).to(torch.bfloat16),
        "layers.0.f32": f,
        "layers.0.f16": (f * 100).to(torch.float16),
        "layers.0.f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "ints.i8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
        "ints.u8": torch.tensor([[0, 1, 2], [253, 254, 255]], dtype=torch.uint8),
        "ints.i16": torch.tensor([-32768, 12345, 32767], dtype=torch.int16),
        "ints.u16": torch.tensor([0, 40000, 65535], dtype=torch.uint16),
        "ints.i32": torch.tensor([-2147483648, 7, 2147483647], dtype=torch.int32),
        "ints.u32": torch.tensor([0, 3000000000, 4294967295], dtype=torch.uint32),
        "ints.i64": torch.tensor([-(2**62), 5, 2**62], dtype=torch.int64),
        "ints.u64": torch.tensor([0, 2**40, 2**62], dtype=torch.uint64),
        "mask": torch.tensor([[True, False], [False, True]]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        # Odd element count: the next tensor's offset is not 4-byte aligned in the file.
        "odd.bf16": torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16),
    }
    meta = {"producer": "make_format_fixtures.py"}  # one key: Rust orders a map randomly
    save_file(tensors, os.path.join(OUT, "reference.safetensors"), metadata=meta)
    with open(os.path.join(OUT, "reference.json"), "w") as fp:
        json.dump(describe(tensors, meta), fp, indent=1)

    match = {
        "a.f32": torch.tensor([[1.5, -2.25], [3.0, 0.0]], dtype=torch.float32),
        "b.bf16": torch.tensor([0.5, 1.0, -8.0], dtype=torch.bfloat16),
        "c.u8": torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8),
        "d.i64": torch.tensor([-1, 2**40], dtype=torch.int64),
    }
    meta = {"format": "pt"}
    save_file(match, os.path.join(OUT, "writer_match.safetensors"), metadata=meta)
    with open(os.path.join(OUT, "writer_match.json"), "w") as fp:
        json.dump(describe(match, meta), fp, indent=1)

    rng = np.random.default_rng(99)
    arrays = {
        "npy_f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "npy_i32": np.array([-5, 0, 7, 2**31 - 1, -(2**31)], dtype=np.int32),
        "npy_f16": (rng.standard_normal((3, 2)) * 10).astype(np.float16),
        "npy_i64": np.arange(-3, 3, dtype=np.int64).reshape(2, 3) * (2**40),
        "npy_scalar": np.float32(0.125),
        "npy_empty": np.zeros((0, 3), dtype=np.float32),
    }
    desc = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        np.save(os.path.join(OUT, name + ".npy"), a)
        desc[name] = {"descr": a.dtype.str, "shape": list(a.shape),
                      "values": [x.item() for x in a.astype(np.float64 if a.dtype.kind == "f" else np.int64).flatten()]}
    with open(os.path.join(OUT, "npy.json"), "w") as fp:
        json.dump(desc, fp, indent=1)
    make_configs()
    for name in os.listdir(OUT):  # save_file creates 0600 files
        os.chmod(os.path.join(OUT, name), 0o644)


def config_facts(c):
    facts = config_facts_common(c)
    if c.model_type in ("mistral", "mixtral", "phi3"):  # None: no window
        facts["sliding_window"] = c.sliding_window
    return facts


def config_facts_common(c):
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    eos = c.eos_token_id
    eos = [] if eos is None else (eos if isinstance(eos, list) else [eos])
    return {
        "model_type": c.model_type, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": theta,
        "rope_type": rope.get("rope_type", rope.get("type", "default")),
        "rope_factor": rope.get("factor", 1.0), "low_freq_factor": rope.get("low_freq_factor", 1.0),
        "high_freq_factor": rope.get("high_freq_factor", 4.0),
        "original_max_position_embeddings": rope.get("original_max_position_embeddings", 8192),
        "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
        "eos_token_ids": eos, "bos_token_id": -1 if c.bos_token_id is None else c.bos_token_id,
        "dtype": str(c.dtype).replace("torch.", "") if getattr(c, "dtype", None) is not None else "bfloat16",
    }


def make_configs():
    from transformers import AutoConfig, LlamaConfig, Qwen2Config

    expected = {}
    llama = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=131072,
                        rope_theta=500000.0, eos_token_id=[2, 5, 9], bos_token_id=1,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                        tie_word_embeddings=True)
    qwen2 = Qwen2Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=4, rope_theta=1000000.0, eos_token_id=7)
    for name, c in (("config_llama.json", llama), ("config_qwen2.json", qwen2)):
        with open(os.path.join(OUT, name), "w") as fp:
            fp.write(c.to_json_string())
        expected[name] = config_facts(type(c).from_json_file(os.path.join(OUT, name)))
    # Mistral, written as the Hub's config.json files are (the fields of mistralai's own), parsed back by
    # transformers' MistralConfig.
    common = dict(architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=1000,
                  intermediate_size=512, num_hidden_layers=2, hidden_act="silu", bos_token_id=1, eos_token_id=2,
                  rms_norm_eps=1e-05, tie_word_embeddings=False, torch_dtype="bfloat16")
    mistral = {
        # v0.2 / v0.3: rope_theta 1e6, no window
        "config_mistral.json": dict(common, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                    max_position_embeddings=32768, rope_theta=1000000.0, sliding_window=None),
        # Mistral-Nemo: head_dim 128 with 32 heads on a hidden size of 5120 (not 5120 / 32 = 160)
        "config_mistral_nemo.json": dict(common, hidden_size=5120, num_attention_heads=32, num_key_value_heads=8,
                                         head_dim=128, max_position_embeddings=1024000, rope_theta=1000000.0,
                                         sliding_window=None),
        # v0.1: a window of 4096 positions
        "config_mistral_v01.json": dict(common, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                        max_position_embeddings=32768, rope_theta=10000.0, sliding_window=4096),
        # sliding_window and num_key_value_heads left out: MistralConfig's defaults (4096 and 8)
        "config_mistral_defaults.json": dict(common, hidden_size=512, num_attention_heads=16,
                                             max_position_embeddings=32768),
    }
    from transformers import MistralConfig
    for name, fields in mistral.items():
        with open(os.path.join(OUT, name), "w") as fp:
            json.dump(fields, fp, indent=2)
            fp.write("\n")
        expected[name] = config_facts(MistralConfig.from_json_file(os.path.join(OUT, name)))
    # Phi-3 / Phi-4 (model_type phi3), written as the Hub's config.json files are, parsed back by Phi3Config.
    phi_common = dict(architectures=["Phi3ForCausalLM"], model_type="phi3", attention_bias=False,
                      attention_dropout=0.0, embd_pdrop=0.0, resid_pdrop=0.0, hidden_act="silu",
                      initializer_range=0.02, rms_norm_eps=1e-05, rope_scaling=None, tie_word_embeddings=False,
                      torch_dtype="bfloat16", use_cache=True)
    phi3 = {
        # microsoft/Phi-3-mini-4k-instruct: 32 heads of 96, no grouping, a window of 2047 positions
        "config_phi3_mini_4k.json": dict(phi_common, bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
                                         hidden_size=3072, intermediate_size=8192, max_position_embeddings=4096,
                                         original_max_position_embeddings=4096, num_attention_heads=32,
                                         num_hidden_layers=32, num_key_value_heads=32, rope_theta=10000.0,
                                         sliding_window=2047, vocab_size=32064),
        # microsoft/phi-4: 40 heads of 128 over 10 kv heads, rope_theta 250000, no window
        "config_phi4.json": dict(phi_common, bos_token_id=100257, eos_token_id=100265, pad_token_id=100349,
                                 hidden_size=5120, intermediate_size=17920, max_position_embeddings=16384,
                                 original_max_position_embeddings=16384, num_attention_heads=40, num_hidden_layers=40,
                                 num_key_value_heads=10, rope_theta=250000, sliding_window=None, vocab_size=100352),
        # num_key_value_heads, rms_norm_eps, rope_theta, max_position_embeddings and sliding_window left out
        "config_phi3_defaults.json": dict(architectures=["Phi3ForCausalLM"], model_type="phi3", vocab_size=1000,
                                          hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                          num_attention_heads=8, bos_token_id=1, eos_token_id=2),
    }
    from transformers import Phi3Config
    for name, fields in phi3.items():
        with open(os.path.join(OUT, name), "w") as fp:
            json.dump(fields, fp, indent=2)
            fp.write("\n")
        expected[name] = config_facts(Phi3Config.from_json_file(os.path.join(OUT, name)))
    # As transformers 5 writes a Phi-3 config: rope_parameters, with partial_rotary_factor inside.
    v5 = Phi3Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=4, rope_theta=250000.0, sliding_window=2047, bos_token_id=1, eos_token_id=2,
                    pad_token_id=2)
    with open(os.path.join(OUT, "config_phi3_v5.json"), "w") as fp:
        fp.write(v5.to_json_string())
    expected["config_phi3_v5.json"] = config_facts(Phi3Config.from_json_file(os.path.join(OUT, "config_phi3_v5.json")))
    shared = os.environ.get("ANVIL_SHARED_DIR",
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))
    for d in ("anvil-tiny-code", "anvil-tiny-code-q4"):
        expected[d] = config_facts(AutoConfig.from_pretrained(os.path.join(shared, "fixtures", d)))
    with open(os.path.join(OUT, "config_expected.json"), "w") as fp:
        json.dump(expected, fp, indent=1)


if __name__ == "__main__":
    if sys.argv[1:] == ["configs"]:
        make_configs()
    else:
        main()
