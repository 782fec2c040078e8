#!/usr/bin/env python3
"""Diagnoses a greedy divergence on a device: teacher-forces prompt + the reference greedy tokens
through `anvil generate --dump-logits` and prints, per generated step, the reference token, our
argmax and our top1-top2 margin (CPU and the given device side by side).
   python3 scripts/golden_decode_diag.py BUILD_DIR MODEL [PROMPT_INDEX] [DEVICE]"""
import json, subprocess, sys, tempfile, os
import numpy as np

build, model = sys.argv[1], sys.argv[2]
k = int(sys.argv[3]) if len(sys.argv) > 3 else 1
device = sys.argv[4] if len(sys.argv) > 4 else "cuda"
d = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden", model)
meta = json.load(open(os.path.join(d, "meta.json")))
prompt, greedy = meta["prompts"][k], meta["greedy"][k]
seq = prompt + greedy[:-1]
res = {}
for dev in ("cpu", device):
    out = tempfile.mktemp(suffix=".npy")
    subprocess.run([os.path.join(build, "anvil"), "generate", "--device", dev, "-m", d, "--ids",
                    ",".join(map(str, seq)), "-n", "0", "--dump-logits", out], check=True, capture_output=True)
    res[dev] = np.load(out)
for i, tok in enumerate(greedy):
    row = len(prompt) - 1 + i
    line = f"step {i:2d} ref {tok:4d}"
    for dev, lg in res.items():
        l = lg[row]
        o = np.argsort(-l)
        line += f" | {dev}: argmax {o[0]:4d} margin {l[o[0]] - l[o[1]]:.3f} ref-margin {l[tok] - l[o[1] if o[0] == tok else o[0]]:+.3f}"
    print(line + ("   <-- differs" if res[device][row].argmax() != tok else ""))
e = res[device] - res["cpu"]
print("rel_err cuda vs cpu per row:", np.round(np.linalg.norm(e, axis=1) / np.linalg.norm(res["cpu"], axis=1), 4))
