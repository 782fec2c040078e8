#!/usr/bin/env python3
"""Freezes MLX affine-quantization fixtures into tests/data/quant/mlx_quant.safetensors.

For every bits in {2,3,4,5,6,8} x group_size in {32,64,128} x dtype in {float32, bfloat16} it runs
the real mlx.core.quantize / mlx.core.dequantize on a small matrix and saves, under the prefix
"b{bits}_g{group}_{f32|bf16}.":
  w        [R, C]           the input (dtype)
  q        [R, C*bits/32]   U32, mx.quantize's packed weights
  scales   [R, C/group]     dtype
  biases   [R, C/group]     dtype
  deq      [R, C]           dtype, mx.dequantize(q, scales, biases) as MLX returns it
  deq_f32  [R, C]           F32, mx.dequantize with scales/biases cast to float32 (exact float math)

The rows exercise the edge handling: ordinary Gaussian values, an all-positive row, a row with a
constant group and an all-zero group, a row where |min| == |max|, and a large-magnitude row.

Re-run: python3 scripts/make_quant_fixtures.py   (needs mlx, numpy, torch, safetensors)
"""
import os

import mlx.core as mx
import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "quant", "mlx_quant.safetensors")
ROWS, COLS = 5, 256


def make_w(rng):
    w = np.empty((ROWS, COLS), dtype=np.float32)
    w[0] = rng.standard_normal(COLS) * 0.02
    w[1] = rng.uniform(0.1, 0.9, COLS)                     # all positive: bias = max, scale < 0
    w[2] = rng.standard_normal(COLS) * 0.5
    w[2, 0:32] = 0.25                                      # constant group
    w[2, 128:160] = 0.0                                    # all-zero group: scale = eps, q0 = 0
    w[3] = rng.uniform(-1.0, 1.0, COLS)
    w[3, 0], w[3, 1] = -1.0, 1.0                           # |min| == |max| in the first group
    w[4] = rng.standard_normal(COLS) * 300.0 - 50.0        # large magnitudes, mostly negative
    return w


def to_torch(a: mx.array) -> torch.Tensor:
    if a.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(a.view(mx.uint16))).view(torch.bfloat16).clone()
    return torch.from_numpy(np.array(a)).clone()


def main():
    rng = np.random.default_rng(20240611)
    tensors = {}
    for dt_name, dt in (("f32", mx.float32), ("bf16", mx.bfloat16)):
        for bits in (2, 3, 4, 5, 6, 8):
            for group in (32, 64, 128):
                w = mx.array(make_w(rng)).astype(dt)
                q, scales, biases = mx.quantize(w, group_size=group, bits=bits)
                deq = mx.dequantize(q, scales, biases, group_size=group, bits=bits)
                deq_f32 = mx.dequantize(q, scales.astype(mx.float32), biases.astype(mx.float32),
                                        group_size=group, bits=bits)
                assert q.dtype == mx.uint32 and q.shape == (ROWS, COLS * bits // 32)
                assert deq_f32.dtype == mx.float32
                p = f"b{bits}_g{group}_{dt_name}."
                for name, arr in (("w", w), ("q", q), ("scales", scales), ("biases", biases),
                                  ("deq", deq), ("deq_f32", deq_f32)):
                    tensors[p + name] = to_torch(arr)
    # uint32 is stored by torch as U32 (torch >= 2.3).
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(tensors, OUT, metadata={"generator": "scripts/make_quant_fixtures.py",
                                      "mlx_version": mx.__version__})
    print(f"wrote {len(tensors)} tensors to {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
