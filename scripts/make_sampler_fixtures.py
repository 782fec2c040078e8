#!/usr/bin/env python3
"""Freezes sampler fixtures into tests/data/sampler/cases.json using transformers' own logits processors.

For each case it applies, in generate()'s order, RepetitionPenaltyLogitsProcessor,
SuppressTokensLogitsProcessor and (when sampling) TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper, MinPLogitsWarper to float32 logits, and stores the inputs plus the resulting
probabilities softmax(processed) (greedy cases, temperature 0: a one-hot at the argmax, as
generate(do_sample=False) does). Parameters are float32-representable so that C++ floats equal them.

repetition_window: transformers has no window, so the script hands it the last N history tokens;
the C++ side gets the whole history and the window parameter.

Tie cases at the top-p boundary use vocabularies small enough for torch.sort to be stable; the script
asserts that, so the expected result does not depend on an unspecified tie order.

Re-run: python3 scripts/make_sampler_fixtures.py   (needs torch, transformers, numpy)
"""
import json
import os

import numpy as np
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "sampler", "cases.json")


def f32(x):
    return float(np.float32(x))


def expected_probs(logits, history, p, suppressed):
    scores = torch.tensor([logits], dtype=torch.float32)
    hist = history[-p["repetition_window"]:] if p["repetition_window"] > 0 else history
    ids = torch.tensor([hist if hist else [0]], dtype=torch.long)
    procs = LogitsProcessorList()
    if p["repetition_penalty"] != 1.0 and hist:
        procs.append(RepetitionPenaltyLogitsProcessor(penalty=p["repetition_penalty"]))
    if suppressed:
        procs.append(SuppressTokensLogitsProcessor(suppressed, device="cpu"))
    if p["temperature"] == 0.0:
        out = procs(ids, scores)
        probs = torch.zeros_like(out)
        probs[0, int(torch.argmax(out[0]))] = 1.0  # torch.argmax returns the first maximal index
        return probs[0].tolist()
    if p["temperature"] != 1.0:
        procs.append(TemperatureLogitsWarper(p["temperature"]))
    if p["top_k"] != 0:
        procs.append(TopKLogitsWarper(top_k=p["top_k"]))
    if p["top_p"] < 1.0:
        procs.append(TopPLogitsWarper(top_p=p["top_p"]))
    if p["min_p"] > 0.0:
        procs.append(MinPLogitsWarper(min_p=p["min_p"]))
    out = procs(ids, scores)
    return torch.softmax(out, dim=-1)[0].tolist()


def params(**kw):
    p = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, repetition_window=0)
    p.update(kw)
    for k in ("temperature", "top_p", "min_p", "repetition_penalty"):
        p[k] = f32(p[k])
    return p


def main():
    rng = np.random.default_rng(1234)

    def rand_logits(v, scale=2.0):
        return [f32(x) for x in rng.standard_normal(v) * scale]

    cases = []

    def add(name, logits, p, history=(), suppressed=()):
        history, suppressed = list(history), list(suppressed)
        probs = expected_probs(logits, history, p, suppressed)
        cases.append(dict(name=name, logits=logits, history=history, suppressed=suppressed, params=p,
                          expected=[f32(x) for x in probs]))

    V = 64
    add("plain_softmax", rand_logits(V), params())
    add("temperature_0.7", rand_logits(V), params(temperature=0.7))
    add("temperature_1.5_top_k_10", rand_logits(V), params(temperature=1.5, top_k=10))
    add("top_k_1", rand_logits(V), params(top_k=1))
    tied = rand_logits(V)
    order = np.argsort(tied)[::-1]
    for j in (5, 6, 7):  # the 5th..8th largest become equal to the 5th: top_k=5 keeps 8
        tied[order[j]] = tied[order[4]]
    add("top_k_ties_at_kth", tied, params(top_k=5))
    add("top_k_larger_than_vocab", rand_logits(V), params(top_k=100, temperature=0.9))
    add("top_p_0.9", rand_logits(V), params(top_p=0.9))
    add("top_p_0.5_temperature_0.8", rand_logits(V), params(top_p=0.5, temperature=0.8))
    add("top_p_tiny_keeps_one", rand_logits(V), params(top_p=0.01))
    # Ties straddling the top-p boundary: p = [0.4, 0.1 x 5, small...]; top_p=0.65 keeps 0.4 plus
    # 3 of the five tied tokens (the higher ids, as torch's stable ascending sort puts them last).
    tie_logits = [f32(np.log(x)) for x in [0.1, 0.4, 0.1, 0.1, 0.02, 0.1, 0.1, 0.02, 0.02, 0.02, 0.01, 0.01]]
    add("top_p_ties_at_boundary", tie_logits, params(top_p=0.65))
    add("top_p_all_equal", [f32(0.5)] * 10, params(top_p=0.55))
    add("min_p_0.1", rand_logits(V), params(min_p=0.1))
    add("min_p_0.05_temperature_0.5", rand_logits(V), params(min_p=0.05, temperature=0.5))
    add("min_p_0.2_temperature_2", rand_logits(V), params(min_p=0.2, temperature=2.0))
    hist = [3, 7, 7, 12, 40, 3, 63, 5]
    add("repetition_penalty_1.3", rand_logits(V), params(repetition_penalty=1.3), history=hist)
    add("repetition_penalty_0.7", rand_logits(V), params(repetition_penalty=0.7), history=hist)
    add("repetition_window_4", rand_logits(V), params(repetition_penalty=1.5, repetition_window=4),
        history=hist + [9, 10, 11, 3])
    add("combined_all", rand_logits(V, 1.0),
        params(repetition_penalty=1.1, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05), history=hist)
    lg = rand_logits(V)
    add("suppressed_argmax_top_p", lg, params(top_p=0.8), suppressed=[int(np.argmax(lg)), 2])
    lg = rand_logits(V)
    top = int(np.argmax(lg))
    add("greedy_penalty_moves_argmax", lg, params(temperature=0.0, repetition_penalty=10.0), history=[top])
    add("greedy_plain", rand_logits(V), params(temperature=0.0))
    add("top_k_8_top_p_0.8_min_p_0.1", rand_logits(V, 0.7), params(temperature=1.2, top_k=8, top_p=0.8, min_p=0.1))
    # Larger than the first top-p sort chunk (256): exercises the incremental sort.
    add("large_vocab_top_p_0.95", rand_logits(3000, 1.0), params(top_p=0.95))
    add("large_vocab_top_k_300_min_p", rand_logits(3000, 1.0), params(top_k=300, min_p=0.02, temperature=0.9))

    # The tie cases must not depend on an unspecified tie order: check torch.sort is stable on them.
    for c in cases:
        if c["name"] in ("top_p_ties_at_boundary", "top_p_all_equal"):
            t = torch.tensor(c["logits"])
            assert torch.equal(torch.sort(t).indices, torch.sort(t, stable=True).indices), c["name"]

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    import transformers
    with open(OUT, "w") as f:
        json.dump({"generator": "scripts/make_sampler_fixtures.py", "transformers": transformers.__version__,
                   "torch": torch.__version__, "cases": cases}, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
