#!/usr/bin/python3
"""Writes gpt_golden.json: a 2-layer GPT's forward, loss, gradients and one AdamW step computed
by PyTorch (Debian's python3-torch 1.13), for ember's GPT tests to match. Run once by hand:

    /usr/bin/python3 tests/nn/golden/make_gpt_golden.py

The model is ember's nn::GPT (nanoGPT's layout and parameter names): token and position
embeddings, pre-norm blocks (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, exact GELU,
mlp.c_proj), ln_f, and an lm_head tied to wte. Dropout is 0. Everything is float64. One
AdamW step from the same gradients under each weight-decay rule of ember's
optim::weight_decay_groups:
  after_step_nanogpt  nanoGPT's configure_optimizers, its code as nanoGPT has it: every
                      parameter of 2 or more dims decays (wte and wpe included), no other;
  after_step_mingpt   minGPT's: Linear weights decay; biases, LayerNorm weights and the
                      embeddings (the tied head among them) do not.
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD = 11, 8, 2, 2, 12
BATCH, LENGTH = 3, 7
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        shape = (b, t, N_HEAD, c // N_HEAD)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // N_HEAD)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = SelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = Mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def main():
    torch.manual_seed(0)
    model = GPT().double()
    g = torch.Generator().manual_seed(1)
    # Weights away from the defaults (LayerNorm 1/0 would hide a swapped weight and bias).
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    weights = {name: flat(p) for name, p in model.named_parameters()}
    idx = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
    targets = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)

    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    loss.backward()
    grads = {name: flat(p.grad) for name, p in model.named_parameters()}

    start = {name: p.detach().clone() for name, p in model.named_parameters()}

    def adamw_step(optim_groups):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name])
        torch.optim.AdamW(optim_groups, lr=LR, betas=BETAS, eps=EPS).step()
        return {name: flat(p) for name, p in model.named_parameters()}

    # nanoGPT's GPT.configure_optimizers, as it is written there.
    param_dict = {pn: p for pn, p in model.named_parameters()}
    param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
    decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
    nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
    after_nanogpt = adamw_step([{"params": decay_params, "weight_decay": WEIGHT_DECAY},
                                {"params": nodecay_params, "weight_decay": 0.0}])

    # minGPT's: no decay on biases, nor on any parameter of a LayerNorm or an Embedding.
    def decays(name, p):
        return p.dim() >= 2 and not name.startswith(("wte.", "wpe."))
    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    after_mingpt = adamw_step([{"params": decay, "weight_decay": WEIGHT_DECAY},
                               {"params": no_decay, "weight_decay": 0.0}])

    out = {
        "config": {"vocab_size": VOCAB, "block_size": BLOCK, "n_layer": N_LAYER,
                   "n_head": N_HEAD, "n_embd": N_EMBD, "lr": LR, "betas": list(BETAS),
                   "eps": EPS, "weight_decay": WEIGHT_DECAY},
        "parameter_names": [name for name, _ in model.named_parameters()],
        "idx": flat(idx), "targets": flat(targets),
        "weights": weights, "logits": flat(logits), "loss": loss.item(),
        "grads": grads,
        "after_step_nanogpt": after_nanogpt, "after_step_mingpt": after_mingpt,
        "torch_version": torch.__version__,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_golden.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}: loss {loss.item():.6f}, {len(weights)} parameters")


if __name__ == "__main__":
    main()
