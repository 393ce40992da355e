#!/usr/bin/env python3
"""Writes gpt_layers_golden.json: PyTorch's values for ember's GPT layer tests
(tests/tensor/gpt_layers_test.cpp): gelu (exact and tanh), layer_norm, embedding and silu (the
activation of LLaMA-style MLPs).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/tensor/golden/make_gpt_layers_golden.py

Each case stores its inputs, PyTorch's output and the gradients of sum(output * grad_output)
for the stored grad_output. Cases come in float32 and float64 (and bfloat16 for gelu and
layer_norm, whose bf16 CPU kernels compute in float): the stored inputs are exactly the values
the dtype holds.
"""
import itertools
import json
import os

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}


def rand(shape, seed, lo=-3.0, hi=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def gelu_cases(cases, seed):
    for shape, approximate, dtype in itertools.product(
            [[7], [3, 5], [2, 3, 4]], ["none", "tanh"], DTYPES):
        seed += 1
        x = rand(shape, seed, -5.0, 5.0)
        x.view(-1)[0] = 0.0
        x = x.to(DTYPES[dtype]).requires_grad_(True)
        y = F.gelu(x, approximate=approximate)
        gy = rand(shape, seed + 500, -1.5, 1.5).to(y.dtype)
        (y * gy).sum().backward()
        cases.append({"op": "gelu", "dtype": dtype, "approximate": approximate, "input": flat(x),
                      "grad_output": flat(gy), "output": flat(y), "grad_input": flat(x.grad)})
    return seed


def layer_norm_cases(cases, seed):
    shapes = [([4, 6], [6]), ([2, 3, 5], [5]), ([2, 3, 4], [3, 4]), ([3, 2, 2, 3], [2, 2, 3]),
              ([5], [5])]
    for (shape, normalized), affine, eps, dtype in itertools.product(
            shapes, ["both", "weight", "none"], [1e-5, 1e-2], DTYPES):
        if dtype == "bf16" and (affine != "both" or eps != 1e-5):
            continue
        seed += 1
        # bf16: PyTorch 1.13's CPU kernel keeps bf16 intermediates (errors of several bf16
        # ulps); the reference is its f32 kernel on the same bf16 values, rounded once to bf16,
        # which is what statistics in f32 (ember, PyTorch's CUDA kernel) give.
        compute = torch.float32 if dtype == "bf16" else DTYPES[dtype]

        def leaf(t):
            return t.to(DTYPES[dtype]).to(compute).requires_grad_(True)

        def stored(t):
            return flat(t.to(DTYPES[dtype]))

        # An offset mean: statistics must not cancel.
        x = leaf(rand(shape, seed) + 4.0)
        w = b = None
        if affine != "none":
            w = leaf(rand(normalized, seed + 100, 0.5, 1.5))
        if affine == "both":
            b = leaf(rand(normalized, seed + 200, -1.0, 1.0))
        y = F.layer_norm(x, normalized, w, b, eps)
        gy = rand(shape, seed + 500, -1.5, 1.5).to(DTYPES[dtype]).to(compute)
        (y * gy).sum().backward()
        case = {"op": "layer_norm", "dtype": dtype, "normalized_shape": normalized, "eps": eps,
                "input": stored(x), "grad_output": stored(gy), "output": stored(y),
                "grad_input": stored(x.grad)}
        if w is not None:
            case["weight"] = stored(w)
            case["grad_weight"] = stored(w.grad)
        if b is not None:
            case["bias"] = stored(b)
            case["grad_bias"] = stored(b.grad)
        cases.append(case)
    return seed


def embedding_cases(cases, seed):
    for ishape, padding_idx, dtype in itertools.product(
            [[5], [2, 3], [2, 2, 3], []], [None, 0, 3, -1], ["f32", "f64"]):
        seed += 1
        g = torch.Generator().manual_seed(seed)
        num, dim = 10, 4
        idx = torch.randint(0, num, ishape, generator=g, dtype=torch.int64)
        if idx.dim() > 0:
            idx.view(-1)[0] = 3  # the padding row, and repeats, appear
            idx.view(-1)[-1] = 3
            idx.view(-1)[1 % idx.numel()] = num - 1
        w = rand([num, dim], seed + 100).to(DTYPES[dtype]).requires_grad_(True)
        y = F.embedding(idx, w, padding_idx=padding_idx)
        gy = rand(list(y.shape), seed + 500, -1.5, 1.5).to(y.dtype)
        (y * gy).sum().backward()
        cases.append({"op": "embedding", "dtype": dtype, "padding_idx": padding_idx,
                      "indices": flat(idx), "weight": flat(w), "grad_output": flat(gy),
                      "output": flat(y), "grad_weight": flat(w.grad)})
    return seed


def silu_cases(cases, seed):
    for shape, dtype in itertools.product([[7], [3, 5], [2, 3, 4]], DTYPES):
        seed += 1
        x = rand(shape, seed, -8.0, 8.0)
        x.view(-1)[0] = 0.0
        x = x.to(DTYPES[dtype])
        # bf16: the reference is PyTorch's f32 kernel on the same bf16 values, rounded once to
        # bf16 (float math per element, as ember's and PyTorch's CUDA kernels compute).
        compute = torch.float32 if dtype == "bf16" else DTYPES[dtype]
        xc = x.to(compute).requires_grad_(True)
        y = F.silu(xc)
        gy = rand(shape, seed + 500, -1.5, 1.5).to(DTYPES[dtype])
        (y * gy.to(compute)).sum().backward()
        cases.append({"op": "silu", "dtype": dtype, "input": flat(x), "grad_output": flat(gy),
                      "output": flat(y.to(DTYPES[dtype])),
                      "grad_input": flat(xc.grad.to(DTYPES[dtype]))})
    return seed


def main():
    cases = []
    seed = gelu_cases(cases, 3000)
    seed = layer_norm_cases(cases, seed)
    seed = embedding_cases(cases, seed)
    silu_cases(cases, seed)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_layers_golden.json")
    with open(out, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
