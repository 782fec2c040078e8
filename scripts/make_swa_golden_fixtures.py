#!/usr/bin/env python3
"""Freeze the sliding-window golden fixture tests/data/golden/mistral-swa/.

    PYTHONPATH=<dir with numpy, safetensors, mlx, mlx-lm> python scripts/make_swa_golden_fixtures.py

(`pip install --target DIR numpy safetensors "mlx[cpu]" mlx-lm` is enough: no torch.) A sibling of
make_mistral_golden_fixtures.py: the same tiny Mistral (head_dim != hidden / heads), with a sliding_window
of 13 positions, shorter than every prompt (12-20 ids) plus its 24 greedy tokens, so most positions
attend over only their last 13 (Mistral v0.1's 4,096, Phi-3-mini-4k's 2,047, scaled down). 13 divides
neither a KV page (16) nor a kernel's 16- or 64-position tile.

The reference is mlx-lm in float32: its own layers (mlx_lm.models.llama, which loads model_type
"mistral") under its own mask function, create_causal_mask(N, window_size=13) -- query i sees keys j with
i - 13 < j <= i, transformers' Mistral mask too. mlx-lm applies the window only to layers its
`layer_types` marks "sliding_attention" and cannot be given every layer so (it looks up a full-attention
layer), so the runner below calls the model's embedding, layers, norm and head itself with that mask, for
the teacher-forced logits and for each greedy step (the whole sequence each time: no cache). The script
refuses to write unless the independent float64 numpy forward (scripts/golden_numpy_check.py, which
masks by transformers' rule) agrees with it within 1e-5 on every prompt, and it prints how far the same
forward without the window is (the ablation must be far off, or the fixture would not test the window).
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_numpy_check as npref  # noqa: E402
import make_golden_fixtures as g  # noqa: E402
import make_mistral_golden_fixtures as mistral  # noqa: E402

NAME = "mistral-swa"
SEED = 83
WINDOW = 13


class WindowedMLXRunner(g.MLXRunner):
    """MLXRunner whose forward masks every layer with mlx-lm's sliding-window causal mask."""

    def logits(self, ids):
        from mlx_lm.models.base import create_causal_mask
        mx = self.mx
        inner = self.model.model
        h = inner.embed_tokens(mx.array([ids]))
        mask = create_causal_mask(len(ids), window_size=WINDOW)
        for layer in inner.layers:
            h = layer(h, mask, cache=None)
        h = inner.norm(h)
        out = self.model.lm_head(h) if not self.model.args.tie_word_embeddings else inner.embed_tokens.as_linear(h)
        return np.array(out[0].astype(mx.float32))

    def step_logits(self, ids):
        """greedy()'s incremental form, without mlx-lm's cache (its rotating cache is the per-layer path
        this runner replaces): the ids so far in `cache`, which greedy() deletes before each prompt."""
        if not hasattr(self, "cache"):
            self.cache = []
        self.cache += list(ids)
        return self.logits(self.cache)[-1]


def main():
    dst = g.OUT / NAME
    mistral.CONFIG["sliding_window"] = WINDOW
    mistral.SEED = SEED
    mistral.make_model(dst)
    g.MLXRunner = WindowedMLXRunner  # write_fixture's runners (no step_logits: greedy re-runs the sequence)
    candidates = (ids for ids in g.random_prompt_candidates(SEED, g.VOCAB) if len(ids) > WINDOW)
    g.write_fixture(NAME, "mlx", dst, candidates, g.MIN_MARGIN, extra_meta={"sliding_window": WINDOW})
    meta = json.loads((dst / "meta.json").read_text())
    worst = 0.0
    for k, ids in enumerate(meta["prompts"]):
        assert len(ids) > WINDOW, "every prompt passes the window"
        ref = np.load(dst / f"ref_{k}.npy").astype(np.float64)
        err = float(npref.rel_err(npref.forward(dst, ids), ref))
        worst = max(worst, err)
        full = float(npref.rel_err(npref.forward(dst, ids, "no_sliding_window"), ref))
        print(f"  {NAME}: prompt {k}: numpy rel_err {err:.2e}; without the window {full:.2e}")
        if full < 0.05:
            sys.exit(f"{NAME}: the window barely changes prompt {k}'s logits ({full:.2e}); not a test of it")
        # The greedy continuation through the numpy forward too (the whole sequence, windowed).
        seq = list(ids)
        for want in meta["greedy"][k]:
            nxt = int(np.argmax(npref.forward(dst, seq)[-1]))
            if nxt != want:
                sys.exit(f"{NAME}: prompt {k}: the numpy forward continues with {nxt}, mlx-lm with {want}")
            seq.append(nxt)
    g.accept_numpy_check(NAME, dst, meta, worst, "; greedy paths agree")


if __name__ == "__main__":
    main()
