#!/usr/bin/env python3
"""An independent reference of the sampler with OpenAI's logit_bias, for sampler_test.cpp.

Usage: logit_bias_reference.py CASES.json   (prints one JSON list of picks per case)

Each case: logits (float32 values), bias {id: value}, history, suppressed, the parameters and the
53-bit random numbers of the draws. The processors, in the order runtime/sampler.h states:
logit bias -> repetition penalty (each distinct history id once) -> suppression -> [sampling]
temperature -> top-k -> top-p (transformers' rule) -> min-p -> the inverse-CDF draw with 2^-44
fixed-point weights. Float32 arithmetic is done in float64 and rounded to float32 (exact for one
+, *, / of two float32 values), exp is Python's math.exp: nothing is shared with the C++ code.
Greedy (temperature 0) is the first maximum after bias, penalty and suppression.
"""
import json
import math
import struct
import sys


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def pick(case):
    V = len(case["logits"])
    l = [f32(x) for x in case["logits"]]
    for k, b in case["bias"].items():
        i = int(k)
        if i < V:
            l[i] = f32(l[i] + f32(b))
    pen = f32(case["repetition_penalty"])
    if pen != 1.0:
        for i in set(t for t in case["history"] if 0 <= t < V):
            l[i] = f32(l[i] * pen) if l[i] < 0 else f32(l[i] / pen)
    for i in case["suppressed"]:
        l[i] = -math.inf
    T = f32(case["temperature"])
    if T == 0:
        best = max(range(V), key=lambda i: (l[i], -i))
        return [best for _ in case["random"]]
    if T != 1.0:
        l = [f32(x / T) for x in l]
    m = max(l)
    alive = [i for i in range(V) if l[i] != -math.inf]
    k = case["top_k"]
    if 0 < k < V:
        kth = sorted((l[i] for i in alive), reverse=True)[k - 1]
        alive = [i for i in alive if l[i] >= kth]
    top_p = f32(case["top_p"])
    if top_p < 1.0:
        w = {i: math.exp(l[i] - m) for i in alive}
        total = sum(w.values())
        desc = sorted(alive, key=lambda i: (l[i], i), reverse=True)  # ties: the higher id first
        above, keep = 0.0, len(desc)
        for j, i in enumerate(desc):
            if j > 0 and (total - above) / total <= 1.0 - top_p:
                keep = j
                break
            above += w[i]
        alive = desc[:keep]
    min_p = f32(case["min_p"])
    if min_p > 0:
        alive = [i for i in alive if not (math.exp(l[i] - m) < min_p)]
    q = [(i, int(math.exp(l[i] - m) * 2.0**44)) for i in alive]
    total = sum(w for _, w in q)
    out = []
    for u in case["random"]:
        target = (u * total) >> 53
        acc = 0
        for i, w in q:
            acc += w
            if acc > target:
                out.append(i)
                break
    return out


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    print(json.dumps([pick(c) for c in cases]))


if __name__ == "__main__":
    main()
