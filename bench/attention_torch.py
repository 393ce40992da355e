#!/usr/bin/python3
"""The reference for bench/attention_bench: scaled-dot-product attention forward + backward
in PyTorch 1.13 on the CPU (Debian's python3-torch), composed as softmax(q k^T * scale +
causal mask) v since 1.13 has no fused op, with the same flags and JSON keys.

    /usr/bin/python3 bench/attention_torch.py [--batch 4] [--heads 6] [--length 256] [--dim 64]
                                              [--threads 2]
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_torch import median_ms  # noqa: E402  (the same timing rule as the other references)


def composed(q, k, v):
    length = q.shape[-2]
    above = torch.ones(length, length, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(scores.masked_fill(above, float("-inf")), dim=-1) @ v


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.length, args.dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape)

    def step():
        for t in (q, k, v):
            t.grad = None
        composed(q, k, v).backward(grad)

    print(json.dumps({"bench": "attention", "impl": "torch_composed", "pass": "forward_backward",
                      "batch": args.batch, "heads": args.heads, "length": args.length,
                      "dim": args.dim, "causal": True, "threads": args.threads,
                      "ms": float(f"{median_ms(step):.4g}")}))


if __name__ == "__main__":
    main()
