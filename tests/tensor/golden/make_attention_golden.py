#!/usr/bin/env python3
"""Writes attention_golden.json: PyTorch's values for ember's scaled-dot-product attention
tests (tests/tensor/attention_test.cpp).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/tensor/golden/make_attention_golden.py

torch 1.13 has no F.scaled_dot_product_attention, so the reference is its definition composed
from torch ops: softmax(q @ k^T * scale + mask) @ v, the causal mask top-left aligned
(key j hidden from query i when j > i), scale 1/sqrt(E) unless given. Each case stores q, k,
v, grad_output, the output and the gradients of q, k and v for sum(out * grad_output), in
float32 and float64 (the stored inputs are exactly the values the dtype holds).
"""
import json
import math
import os

import torch

DTYPES = {"f32": torch.float32, "f64": torch.float64}


def rand(shape, seed, lo=-1.0, hi=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def attention(q, k, v, causal, scale):
    s = q @ k.transpose(-2, -1) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def main():
    # (leading dims, Lq, Lk, E, Ev, causal, scale)
    shapes = [
        ([2, 3], 7, 7, 8, 8, False, None),
        ([2, 3], 7, 7, 8, 8, True, None),
        ([1, 1], 65, 65, 16, 16, True, None),
        ([1, 1], 65, 65, 16, 16, False, None),
        ([2], 5, 9, 4, 6, False, 0.3),
        ([1, 1], 3, 3, 64, 64, True, None),
        ([], 3, 4, 5, 2, False, None),
        ([1, 1], 1, 1, 8, 8, True, None),
    ]
    cases = []
    seed = 0
    for dtype in DTYPES:
        for lead, lq, lk, e, ev, causal, scale in shapes:
            q = rand(lead + [lq, e], seed).to(DTYPES[dtype]).requires_grad_(True)
            k = rand(lead + [lk, e], seed + 1).to(DTYPES[dtype]).requires_grad_(True)
            v = rand(lead + [lk, ev], seed + 2).to(DTYPES[dtype]).requires_grad_(True)
            go = rand(lead + [lq, ev], seed + 3).to(DTYPES[dtype])
            seed += 4
            out = attention(q, k, v, causal, scale)
            (out * go).sum().backward()
            case = {"dtype": dtype, "causal": causal, "q": flat(q), "k": flat(k), "v": flat(v),
                    "grad_output": flat(go), "out": flat(out), "grad_q": flat(q.grad),
                    "grad_k": flat(k.grad), "grad_v": flat(v.grad)}
            if scale is not None:
                case["scale"] = scale
            cases.append(case)

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_golden.json")
    with open(out, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f, allow_nan=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
