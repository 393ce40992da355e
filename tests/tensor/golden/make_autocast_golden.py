#!/usr/bin/env python3
"""Writes autocast_golden.json: PyTorch's CPU bf16 autocast values for ember's autocast tests
(tests/tensor/autocast_test.cpp).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/tensor/golden/make_autocast_golden.py

One training step of a small ResNet basic block with a projection shortcut, under
torch.autocast("cpu", dtype=torch.bfloat16):
  h = relu(bn1(conv1(x)));  h = bn2(conv2(h));  s = bn3(conv3(x))    (1x1 projection)
  y = relu(h + s);  p = adaptive_avg_pool2d(y, 1).flatten(1);  logits = fc(p)
  loss = cross_entropy(logits, target)
For this block PyTorch 1.13's CPU lists and ember's agree: convolutions and linear in bf16,
batch norm in bf16 with f32 parameters and statistics, relu/add/pooling in their input's
dtype, cross-entropy in f32. Stored: the f32 parameters and inputs, the bf16 logits, the f32
loss, every parameter's f32 gradient and the updated running statistics.
"""
import json
import os

import torch
import torch.nn.functional as F


def rand(shape, seed, lo=-1.0, hi=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float32) * (hi - lo) + lo


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def main():
    n, c_in, c, hw, classes = 4, 3, 8, 8, 5
    params = {
        "conv1.weight": rand((c, c_in, 3, 3), 1, -0.5, 0.5),
        "bn1.weight": rand((c,), 2, 0.5, 1.5),
        "bn1.bias": rand((c,), 3, -0.2, 0.2),
        "conv2.weight": rand((c, c, 3, 3), 4, -0.25, 0.25),
        "bn2.weight": rand((c,), 5, 0.5, 1.5),
        "bn2.bias": rand((c,), 6, -0.2, 0.2),
        "conv3.weight": rand((c, c_in, 1, 1), 7, -0.8, 0.8),
        "bn3.weight": rand((c,), 8, 0.5, 1.5),
        "bn3.bias": rand((c,), 9, -0.2, 0.2),
        "fc.weight": rand((classes, c), 10, -0.6, 0.6),
        "fc.bias": rand((classes,), 11, -0.1, 0.1),
    }
    for p in params.values():
        p.requires_grad_(True)
    stats = {}
    for bn in ("bn1", "bn2", "bn3"):
        stats[bn + ".running_mean"] = torch.zeros(c)
        stats[bn + ".running_var"] = torch.ones(c)
    x = rand((n, c_in, hw, hw), 12, -2.0, 2.0)
    target = torch.tensor([0, 3, 1, 4], dtype=torch.int64)
    inputs = {k: flat(v) for k, v in params.items()}
    inputs["x"] = flat(x)

    def bn(h, name):
        return F.batch_norm(h, stats[name + ".running_mean"], stats[name + ".running_var"],
                            params[name + ".weight"], params[name + ".bias"], training=True,
                            momentum=0.1, eps=1e-5)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = F.relu(bn(F.conv2d(x, params["conv1.weight"], padding=1), "bn1"))
        h = bn(F.conv2d(h, params["conv2.weight"], padding=1), "bn2")
        s = bn(F.conv2d(x, params["conv3.weight"]), "bn3")
        y = F.relu(h + s)
        p = F.adaptive_avg_pool2d(y, 1).flatten(1)
        logits = F.linear(p, params["fc.weight"], params["fc.bias"])
        loss = F.cross_entropy(logits, target)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()

    out = {
        "torch_version": torch.__version__,
        "inputs": inputs,
        "target": target.tolist(),
        "logits": flat(logits),
        "loss": loss.item(),
        "grads": {k: flat(v.grad) for k, v in params.items()},
        "running": {k: flat(v) for k, v in stats.items()},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autocast_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
