#!/usr/bin/env python3
"""Writes fused_bn_golden.json: PyTorch's values for ember's fused batch norm + ReLU tests
(tests/tensor/fused_layers_test.cpp).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/tensor/golden/make_fused_bn_golden.py

Each case is F.relu(F.batch_norm(x, running_mean, running_var, weight, bias, training,
momentum, eps) [+ residual]) in float64, in NCHW or channels_last, training or eval: the
output, the running statistics after the call, and the gradients of x, weight, bias and
residual for sum(out * grad_output).
"""
import json
import os

import torch
import torch.nn.functional as F


def rand(shape, seed, lo=-2.0, hi=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def flat(t):
    # Values in logical (NCHW) order whatever the memory format.
    return {"shape": list(t.shape), "values": t.detach().contiguous().flatten().tolist()}


def case(name, shape, residual, training, channels_last, seed):
    c = shape[1]
    x = rand(shape, seed, -1.0, 3.0)
    r = rand(shape, seed + 1) if residual else None
    w, b = rand([c], seed + 2), rand([c], seed + 3)
    rm, rv = rand([c], seed + 4, -0.5, 0.5), rand([c], seed + 5, 0.5, 1.5)
    go = rand(shape, seed + 6)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    xs = x.clone().to(memory_format=fmt).requires_grad_(True)
    rs = r.clone().to(memory_format=fmt).requires_grad_(True) if residual else None
    ws, bs = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    rm_after, rv_after = rm.clone(), rv.clone()
    y = F.batch_norm(xs, rm_after, rv_after, ws, bs, training, 0.1, 1e-5)
    out = F.relu(y + rs if residual else y)
    (out * go).sum().backward()
    entry = {
        "name": name, "residual": residual, "training": training,
        "channels_last": channels_last, "momentum": 0.1, "eps": 1e-5,
        "input": flat(x), "weight": flat(w), "bias": flat(b),
        "running_mean": flat(rm), "running_var": flat(rv), "grad_output": flat(go),
        "output": flat(out), "running_mean_after": flat(rm_after),
        "running_var_after": flat(rv_after), "grad_input": flat(xs.grad),
        "grad_weight": flat(ws.grad), "grad_bias": flat(bs.grad),
    }
    if residual:
        entry["residual_values"] = flat(r)
        entry["grad_residual"] = flat(rs.grad)
    return entry


def main():
    cases = []
    seed = 10
    for residual in (False, True):
        for training in (True, False):
            for channels_last in (False, True):
                name = "%s %s %s" % ("add_relu" if residual else "relu",
                                     "train" if training else "eval",
                                     "nhwc" if channels_last else "nchw")
                cases.append(case(name, [3, 4, 5, 3], residual, training, channels_last, seed))
                seed += 10
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_bn_golden.json")
    with open(out, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
