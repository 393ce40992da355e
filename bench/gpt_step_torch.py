#!/usr/bin/python3
"""The reference for bench/gpt_step: the same GPT training step (forward, backward, AdamW) in
PyTorch, with the same flags and JSON keys. The model is ember's nn::GPT in nanoGPT's layout
(pre-norm blocks, exact GELU, the head tied to the token embedding). Attention is
F.scaled_dot_product_attention where PyTorch has it (2.0 and later), else the explicit
softmax(QK^T / sqrt(d) + causal mask) V that 1.13 offers. The first step is timed on its own
(first_step_s); under --compile its extra time over the median step, the compilation, is
compile_s."""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_torch import call_seconds  # noqa: E402  (the timing helpers of the references)

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class SelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = SelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.ln_f(self.h(self.wte(idx) + self.wpe(pos)))
        return F.linear(x, self.wte.weight)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (2.0 and later)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = GPT(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd).to(device)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=3e-4, betas=(0.9, 0.95))
    trained = torch.compile(model) if args.compile else model
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    low = args.precision == "bf16"
    idx = torch.randint(0, args.vocab, (args.batch, args.block_size), device=device)
    targets = torch.randint(0, args.vocab, (args.batch, args.block_size), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=low):
            logits = trained(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))
        loss.backward()
        optimizer.step()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    # The first step on its own: under --compile it compiles (reported apart as compile_s).
    first_step_s = call_seconds(step, sync)
    step()  # with the first, bench/gpt_step's two warm-up steps
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    tokens = args.batch * args.block_size
    flops_per_token = 6 * params + 12 * args.n_layer * args.n_embd * args.block_size
    out = {
        "framework": "torch-" + torch.__version__ + ("-compile" if args.compile else ""),
        "model": f"gpt-{args.n_layer}l-{args.n_head}h-{args.n_embd}d", "block_size": args.block_size,
        "batch": args.batch, "device": args.device, "precision": args.precision, "threads": args.threads,
        "attention": "sdpa" if HAS_SDPA else "naive", "parameters": params,
        "step_s": round(step_s, 4), "tokens_per_s": round(tokens / step_s, 1),
        "achieved_tflops": round(flops_per_token * tokens / step_s / 1e12, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "first_step_s": round(first_step_s, 3),
    }
    if args.compile:
        out["compile_s"] = round(first_step_s - step_s, 3)
    if device.type == "cuda":
        out["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
