#!/usr/bin/python3
"""The reference for bench/attention_bench: scaled-dot-product attention forward (no autograd)
and forward + backward in PyTorch with the same flags and JSON keys. --impl sdpa is
F.scaled_dot_product_attention (PyTorch 2; FlashAttention-2 on CUDA for bf16/f16), composed is
softmax(q k^T * scale + causal mask) v; auto (the default) takes sdpa where this torch has it
(Debian's PyTorch 1.13 does not).

    python3 bench/attention_torch.py [--batch 4] [--heads 6] [--length 256] [--dim 64]
        [--threads 2] [--device cpu|cuda] [--dtype f32|bf16|f16] [--causal 1|0]
        [--impl auto|sdpa|composed]
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_torch import median_ms  # noqa: E402  (the same timing rule as the other references)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def composed(q, k, v, causal):
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        length = q.shape[-2]
        above = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    parser.add_argument("--causal", type=int, default=1, choices=[0, 1])
    parser.add_argument("--impl", default="auto", choices=["auto", "sdpa", "composed"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    impl = ("sdpa" if has_sdpa else "composed") if args.impl == "auto" else args.impl
    causal = bool(args.causal)
    if impl == "sdpa":
        def attention(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        def attention(q, k, v):
            return composed(q, k, v, causal)

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    shape = (args.batch, args.heads, args.length, args.dim)
    q, k, v = (torch.randn(shape).to(device, dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(shape).to(device, dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def forward():
        with torch.no_grad():
            attention(q, k, v)
        sync()

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        attention(q, k, v).backward(grad)
        sync()

    fwd_flops = 4.0 * args.batch * args.heads * args.length**2 * args.dim * (0.5 if causal else 1.0)
    for name, step, flops in (("forward", forward, fwd_flops),
                              ("forward_backward", forward_backward, 3.5 * fwd_flops)):
        ms = median_ms(step)
        line = {"bench": "attention", "impl": "torch_" + impl, "pass": name,
                "device": args.device, "dtype": args.dtype, "batch": args.batch,
                "heads": args.heads, "length": args.length, "dim": args.dim, "causal": causal}
        if device.type == "cpu":
            line["threads"] = args.threads
        line.update({"ms": float(f"{ms:.4g}"), "tflops": float(f"{flops / ms * 1e-9:.4g}"),
                     "torch": torch.__version__})
        print(json.dumps(line))


if __name__ == "__main__":
    main()
