#!/usr/bin/python3
"""Writes second_derivatives_golden.json: programs PyTorch users write with second derivatives
(torch.autograd.grad(..., create_graph=True)), computed by PyTorch (Debian's python3-torch
1.13) in float64, for tests/autograd/second_derivatives_test.cpp to match. Run once by hand:

    /usr/bin/python3 tests/autograd/golden/make_second_derivatives_golden.py

Every input (weights, data, directions) is drawn here and stored with the results:
  wgan_*      WGAN-GP: a critic's parameter gradients of
              critic(fake).mean() - critic(real).mean() + lambda * mean((|d critic(x_hat) / d x_hat| - 1)^2)
  hvp_*       Hessian-vector products of an MLP's loss: grad(sum(grad(loss, params) * v), params)
  maml        one MAML outer gradient through two inner SGD steps (and first-order MAML's)
  gpt_*       a GPT-ish block's loss plus a penalty on the gradient of the loss with respect to
              the embedding output (gpt_penalty_output) or the embedding weight (gpt_penalty_weight)
  bn_hvp      a Conv2d / BatchNorm2d (training) / MaxPool2d net's Hessian-vector product
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
GEN = torch.Generator().manual_seed(16)


def randn(*shape, scale=1.0):
    return torch.randn(shape, generator=GEN) * scale


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def labels(n, classes):
    return torch.randint(0, classes, (n,), generator=GEN)


def set_params(module, scale):
    """Weights away from PyTorch's initialisation (and LayerNorm's / BatchNorm's 1 and 0)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(*p.shape, scale=scale))
    return {name: flat(p) for name, p in module.named_parameters()}


def by_name(module, tensors):
    return {name: flat(t) for (name, _), t in zip(module.named_parameters(), tensors)}


# ---- 1. WGAN-GP -------------------------------------------------------------------------------
class TanhCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((2, 2))
        self.fc = nn.Linear(12, 1)

    def forward(self, x):
        return self.fc(self.pool(torch.tanh(self.conv(x))).flatten(1))


def wgan(critic, image_shape):
    lam = 10.0
    params = set_params(critic, 0.5)
    real, fake = randn(*image_shape), randn(*image_shape)
    alpha = torch.rand((image_shape[0], 1, 1, 1), generator=GEN)
    x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = critic(x_hat)
    (gradients,) = torch.autograd.grad(out.sum(), x_hat, create_graph=True)
    grad_norm = gradients.view(gradients.shape[0], -1).norm(2, dim=1)
    penalty = lam * ((grad_norm - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + penalty
    grads = torch.autograd.grad(loss, list(critic.parameters()))
    return {"lambda": lam, "params": params, "real": flat(real), "fake": flat(fake),
            "alpha": flat(alpha), "grad_norm": flat(grad_norm), "penalty": penalty.item(),
            "loss": loss.item(), "grads": by_name(critic, grads)}


# ---- 2. Hessian-vector products of an MLP ---------------------------------------------------
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 5)
        self.fc3 = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc3(torch.sigmoid(self.fc2(torch.tanh(self.fc1(x)))))


def hvp(model, loss_fn, make_data):
    params = set_params(model, 0.7)
    data = make_data()
    v = [randn(*p.shape) for p in model.parameters()]
    loss = loss_fn(model, data)
    g = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    hv = torch.autograd.grad(sum((gi * vi).sum() for gi, vi in zip(g, v)),
                             list(model.parameters()))
    return {"params": params, "data": {k: flat(t) for k, t in data.items()},
            "v": by_name(model, v), "loss": loss.item(), "grads": by_name(model, g),
            "hv": by_name(model, hv)}


def mlp_mse_data():
    return {"x": randn(7, 4), "target": torch.softmax(randn(7, 3), dim=1)}


def mlp_mse_loss(model, d):
    logits = model(d["x"])
    soft_ce = -(F.log_softmax(logits, dim=1) * d["target"]).sum(1).mean()
    return F.mse_loss(torch.softmax(logits, dim=1), d["target"]) + 0.5 * soft_ce


def mlp_ce_data():
    ignored = labels(7, 3)
    ignored[2] = -100
    return {"x": randn(7, 4), "labels": labels(7, 3), "labels_ignored": ignored}


def mlp_ce_loss(model, d):
    logits = model(d["x"])
    return (F.cross_entropy(logits, d["labels"])
            + F.cross_entropy(logits, d["labels_ignored"], ignore_index=-100, label_smoothing=0.1))


# ---- 3. MAML ---------------------------------------------------------------------------------
def maml():
    inner_lr, inner_steps = 0.1, 2
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    params = set_params(net, 0.6)
    w = list(net.parameters())
    support_x, query_x = randn(5, 1, scale=2.0), randn(6, 1, scale=2.0)
    support_y, query_y = torch.sin(support_x + 0.5), torch.sin(query_x + 0.5)

    def forward(ws, x):
        x = torch.tanh(F.linear(x, ws[0], ws[1]))
        x = torch.tanh(F.linear(x, ws[2], ws[3]))
        return F.linear(x, ws[4], ws[5])

    def outer(create_graph):
        fast = w
        for _ in range(inner_steps):
            inner = F.mse_loss(forward(fast, support_x), support_y)
            g = torch.autograd.grad(inner, fast, create_graph=create_graph)
            fast = [p - inner_lr * gi for p, gi in zip(fast, g)]
        loss = F.mse_loss(forward(fast, query_x), query_y)
        return loss, torch.autograd.grad(loss, w)

    loss, grads = outer(True)
    _, first_order = outer(False)
    return {"inner_lr": inner_lr, "inner_steps": inner_steps, "params": params,
            "support_x": flat(support_x), "support_y": flat(support_y),
            "query_x": flat(query_x), "query_y": flat(query_y), "loss": loss.item(),
            "grads": by_name(net, grads), "first_order_grads": by_name(net, first_order)}


# ---- 4. GPT-ish block -----------------------------------------------------------------------
VOCAB, EMBD = 7, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.ln_1 = nn.LayerNorm(EMBD)
        self.fc = nn.Linear(EMBD, 2 * EMBD)
        self.proj = nn.Linear(2 * EMBD, EMBD)
        self.ln_f = nn.LayerNorm(EMBD)
        self.head = nn.Linear(EMBD, VOCAB)

    def forward_from(self, h):
        x = h + self.proj(F.gelu(self.fc(self.ln_1(h))))
        return self.head(self.ln_f(x))


def gpt(wrt_weight):
    lam = 5.0
    block = Block()
    params = set_params(block, 0.5)
    idx = torch.randint(0, VOCAB, (2, 5), generator=GEN)
    targets = torch.randint(0, VOCAB, (2, 5), generator=GEN)
    h = block.wte(idx)
    logits = block.forward_from(h)
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    wrt = block.wte.weight if wrt_weight else h
    (g,) = torch.autograd.grad(loss, wrt, create_graph=True)
    penalty = lam * g.pow(2).sum()
    total = loss + penalty
    grads = torch.autograd.grad(total, list(block.parameters()))
    return {"lambda": lam, "params": params, "idx": flat(idx), "targets": flat(targets),
            "loss": loss.item(), "penalty": penalty.item(), "grads": by_name(block, grads)}


# ---- 5. Batch-norm net ----------------------------------------------------------------------
class BnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(12, 2)

    def forward(self, x):
        # max before relu: the same values as relu then max, without the ties relu's zeros
        # would make inside a window (whose gradient goes to an index each library picks).
        return self.fc(F.relu(F.max_pool2d(self.bn(self.conv(x)), 2)).flatten(1))


def bn_data():
    return {"x": randn(4, 2, 4, 4), "target": randn(4, 2)}


def bn_loss(model, d):
    return F.mse_loss(model(d["x"]), d["target"])


def main():
    out = {
        "wgan_relu_avgpool": wgan(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                                                nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, 1)),
                                  (3, 2, 4, 4)),
        "wgan_tanh_adaptive": wgan(TanhCritic(), (3, 2, 5, 5)),
        "hvp_mlp_mse": hvp(Mlp(), mlp_mse_loss, mlp_mse_data),
        "hvp_mlp_cross_entropy": hvp(Mlp(), mlp_ce_loss, mlp_ce_data),
        "maml": maml(),
        "gpt_penalty_output": gpt(False),
        "gpt_penalty_weight": gpt(True),
    }
    bn = BnNet()
    out["bn_hvp"] = hvp(bn, bn_loss, bn_data)
    out["bn_hvp"]["running_mean"] = flat(bn.bn.running_mean)
    out["bn_hvp"]["running_var"] = flat(bn.bn.running_var)
    out["torch_version"] = torch.__version__
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "second_derivatives_golden.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
