#!/usr/bin/env python3
"""Writes attention_module_golden.json: minGPT's CausalSelfAttention in PyTorch, for ember's
nn::MultiheadSelfAttention test (tests/nn/attention_test.cpp).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/nn/golden/make_attention_module_golden.py

The module below is minGPT's (github.com/karpathy/minGPT, mingpt/model.py) with its dropouts
at 0. Each case stores its state dict (minGPT's names, its causal-mask buffer "bias"
included), the input x, grad_output, the output and the gradients of x and of every
parameter for sum(y * grad_output), in float32 and float64.
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def main():
    cases = []
    for dtype, name in [(torch.float32, "f32"), (torch.float64, "f64")]:
        torch.manual_seed(0)
        m = CausalSelfAttention(12, 3, 16).to(dtype)
        x = torch.randn(2, 9, 12, dtype=dtype, requires_grad=True)
        go = torch.randn(2, 9, 12, dtype=dtype)
        y = m(x)
        (y * go).sum().backward()
        cases.append({
            "dtype": name, "embed_dim": 12, "num_heads": 3,
            "state_dict": {k: flat(v) for k, v in m.state_dict().items()},
            "x": flat(x), "grad_output": flat(go), "y": flat(y), "grad_x": flat(x.grad),
            "grads": {n: flat(p.grad) for n, p in m.named_parameters()},
        })
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_module_golden.json")
    with open(out, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f, allow_nan=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
