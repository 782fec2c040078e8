#!/usr/bin/env python3
"""Freeze the LongRoPE golden fixtures tests/data/golden/phi3-longrope-short/ and phi3-longrope-long/.

    PYTHONPATH=<dir with numpy, safetensors, mlx, mlx-lm> python scripts/make_longrope_golden_fixtures.py

(`pip install --target DIR numpy safetensors "mlx[cpu]" mlx-lm` is enough: no torch.) A sibling of
make_phi3_golden_fixtures.py (its tiny Phi-3 and machinery) for the long-context Phi-3 checkpoints
(Phi-3-mini-128k, Phi-3-medium-128k, Phi-3.5-mini), whose rope_scaling is LongRoPE: a divisor per rotary
frequency, `short_factor` for contexts up to original_max_position_embeddings and `long_factor` past it,
and cos and sin multiplied by sqrt(1 + ln(max_position_embeddings / original) / ln(original)).

The references disagree on when the long factors apply: transformers takes them once a forward's sequence
passes the original context (short ones for every shorter sequence), mlx-lm always, llama.cpp when the
context it runs with does. anvil chooses by its context as llama.cpp does, for every position, so the two
fixtures are the same checkpoint (original context 256, max_position_embeddings 2048) run two ways:

  phi3-longrope-short  with `-c 256` (meta "ctx"): the short factors, transformers' computation for any
                       sequence up to 256 tokens. The reference is mlx-lm on a copy of the checkpoint whose
                       long_factor is its short_factor (mlx-lm then computes the short-factor forward).
  phi3-longrope-long   at the default context (2,048, past 256): the long factors, mlx-lm's own forward.
  phi4mini-longrope    Phi-4-mini's shape of the same: partial_rotary_factor 0.75 (RoPE over 12 of each
                       head's 16 dims, 6 factors each, the attention factor on those dims only) and tied
                       embeddings, at the default context (long factors), against mlx-lm.

The script refuses to write unless the independent float64 numpy forward (scripts/golden_numpy_check.py,
written from transformers' _compute_longrope_parameters and modeling_phi3) agrees with mlx-lm on every
prompt within 1e-5, with the factors each fixture says (meta "longrope_factors"); the two fixtures'
references must also differ (else the test could not tell the factors apart).
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_numpy_check as npref  # noqa: E402
import make_golden_fixtures as g  # noqa: E402
import make_phi3_golden_fixtures as phi3  # noqa: E402

SEED = 91
ORIGINAL = 256


def config(rng):
    c = dict(phi3.CONFIG)
    half = c["hidden_size"] // c["num_attention_heads"] // 2
    c.update({
        "max_position_embeddings": 2048, "original_max_position_embeddings": ORIGINAL, "sliding_window": None,
        # Phi-3.5-mini's shape of factors: short ones near 1, long ones growing with the wavelength.
        "rope_scaling": {"type": "longrope",
                         "short_factor": [round(1.0 + 0.5 * float(x), 4) for x in rng.random(half)],
                         "long_factor": [round(1.0 + 12.0 * (i / (half - 1)) ** 2 + float(x), 4)
                                         for i, x in enumerate(rng.random(half))]},
    })
    return c


def phi4mini_config(rng):
    c = config(rng)
    c["partial_rotary_factor"] = 0.75
    c["tie_word_embeddings"] = True
    rot = int(c["hidden_size"] // c["num_attention_heads"] * 0.75)
    c["rope_scaling"] = {"type": "longrope",
                         "short_factor": [round(1.0 + 0.5 * float(x), 4) for x in rng.random(rot // 2)],
                         "long_factor": [round(1.0 + 12.0 * (i / (rot // 2 - 1)) ** 2 + float(x), 4)
                                         for i, x in enumerate(rng.random(rot // 2))]}
    return c


def make_model(dst, cfg):
    saved = phi3.CONFIG
    phi3.CONFIG = cfg
    try:
        phi3.make_model(dst)  # the tiny Phi-3's weights (its seed), this config
    finally:
        phi3.CONFIG = saved
    if cfg.get("tie_word_embeddings"):  # no lm_head: the embedding is the head
        from make_yarn_golden_fixtures import write_safetensors
        t = npref.read_safetensors(dst / "model.safetensors")
        del t["lm_head.weight"]
        write_safetensors(dst / "model.safetensors", {k: v.astype(np.float64) for k, v in t.items()})


def check_against_numpy(name, long_factors):
    phi3.check_against_numpy(name, long_factors=long_factors, window=0,
                             ablations=("longrope_other_factors", "longrope_no_attention_factor", "rotate_whole_head"))


def main():
    cfg = config(np.random.default_rng(SEED))
    long_dir, short_dir = g.OUT / "phi3-longrope-long", g.OUT / "phi3-longrope-short"
    make_model(long_dir, cfg)
    g.write_fixture("phi3-longrope-long", "mlx", long_dir, g.random_prompt_candidates(SEED, g.VOCAB), g.MIN_MARGIN,
                    {"longrope_factors": "long"})
    check_against_numpy("phi3-longrope-long", True)

    make_model(short_dir, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        # mlx-lm rotates with long_factor whatever the length: a copy whose long factors are the short
        # ones gives the short-factor forward.
        ref_dir = Path(tmp) / "model"
        shutil.copytree(short_dir, ref_dir)
        c = json.loads((ref_dir / "config.json").read_text())
        c["rope_scaling"]["long_factor"] = c["rope_scaling"]["short_factor"]
        (ref_dir / "config.json").write_text(json.dumps(c, indent=2) + "\n")
        g.write_fixture("phi3-longrope-short", "mlx", ref_dir, g.random_prompt_candidates(SEED, g.VOCAB),
                        g.MIN_MARGIN, {"longrope_factors": "short", "ctx": ORIGINAL})
    check_against_numpy("phi3-longrope-short", False)

    mini = g.OUT / "phi4mini-longrope"
    make_model(mini, phi4mini_config(np.random.default_rng(SEED + 2)))
    g.write_fixture("phi4mini-longrope", "mlx", mini, g.random_prompt_candidates(SEED + 2, g.VOCAB), g.MIN_MARGIN,
                    {"longrope_factors": "long"})
    check_against_numpy("phi4mini-longrope", True)

    a = json.loads((long_dir / "meta.json").read_text())
    b = json.loads((short_dir / "meta.json").read_text())
    if a["prompts"][0] == b["prompts"][0]:
        diff = npref.rel_err(np.load(long_dir / "ref_0.npy").astype(np.float64),
                             np.load(short_dir / "ref_0.npy").astype(np.float64))
        print(f"  the two references of prompt 0 differ by rel_err {diff:.2e}")
        if diff < 1e-2:
            sys.exit("the short and long factors give nearly the same logits: the fixtures test nothing")


if __name__ == "__main__":
    main()
