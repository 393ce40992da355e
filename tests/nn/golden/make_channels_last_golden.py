#!/usr/bin/env python3
"""Writes channels_last_golden.json: PyTorch's values for ember's channels_last tests
(tests/nn/channels_last_golden_test.cpp).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/nn/golden/make_channels_last_golden.py

Each case runs one op on channels_last inputs (4-d tensors converted with
.to(memory_format=torch.channels_last)) and stores the inputs (NCHW logical order), the output,
the gradients of sum(output * probe) for every input, and the strides PyTorch gives the
output and the 4-d inputs' gradients. Batch norm also stores the running statistics after
the step.
"""
import json
import os

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f64": torch.float64}
CL = torch.channels_last


def rand(shape, seed, lo=-2.0, hi=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def case(name, dtype, fn, inputs, seed, extra=None):
    leaves = []
    for t in inputs:
        t = t.to(DTYPES[dtype])
        if t.dim() == 4:
            t = t.to(memory_format=CL)
        leaves.append(t.clone(memory_format=torch.preserve_format).requires_grad_(True))
    out = fn(*leaves)
    probe = rand(out.shape, seed + 100).to(DTYPES[dtype])
    (out * probe).sum().backward()
    result = {
        "name": name,
        "dtype": dtype,
        "inputs": [flat(t) for t in leaves],
        "probe": flat(probe),
        "output": flat(out),
        "output_strides": list(out.stride()),
        "grads": [flat(t.grad) for t in leaves],
        "grad_strides": [list(t.grad.stride()) for t in leaves],
    }
    if extra:
        result.update(extra())
    return result


def main():
    cases = []
    for dtype in DTYPES:
        x = rand((2, 3, 6, 5), 1)
        w = rand((4, 3, 3, 3), 2, -0.5, 0.5)
        b = rand((4,), 3)
        cases.append(
            case("conv2d", dtype, lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1),
                 [x, w, b], 10))
        running_mean = torch.zeros(3, dtype=DTYPES[dtype])
        running_var = torch.ones(3, dtype=DTYPES[dtype])
        cases.append(
            case("batch_norm", dtype,
                 lambda x, g, b: F.batch_norm(x, running_mean, running_var, g, b, training=True,
                                              momentum=0.1, eps=1e-5),
                 [rand((2, 3, 4, 5), 4) * 2 + 1, rand((3,), 5), rand((3,), 6)], 20,
                 lambda: {"running_mean": flat(running_mean), "running_var": flat(running_var)}))
        cases.append(
            case("max_pool2d", dtype, lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
                 [rand((2, 3, 7, 6), 7)], 30))
        cases.append(
            case("adaptive_avg_pool2d", dtype, lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
                 [rand((2, 3, 5, 7), 8)], 40))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "channels_last_golden.json")
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
