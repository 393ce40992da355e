#!/usr/bin/env python3
"""Writes loss_golden.json: PyTorch's values for ember's loss tests (tests/tensor/loss_test.cpp).

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/tensor/golden/make_loss_golden.py

Each case names a torch.nn.functional loss, its keyword options, the input and target, and
PyTorch's loss and the gradient of the input. For reduction 'none' the gradient is that of
sum(loss * grad_output) with the stored grad_output; otherwise of the loss itself. Cases come
in float32 and float64: the stored inputs are exactly the values the dtype holds.
"""
import itertools
import json
import os

import torch
import torch.nn.functional as F

REDUCTIONS = ["none", "mean", "sum"]
DTYPES = {"f32": torch.float32, "f64": torch.float64}


def rand(shape, seed, lo=-3.0, hi=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def randint(shape, high, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g, dtype=torch.int64)


def flat(t):
    return {"shape": list(t.shape), "values": t.detach().double().flatten().tolist()}


def run(cases, name, op, fn, dtype, inp, target, options, seed, stored_options=None):
    x = inp.to(DTYPES[dtype]).clone().requires_grad_(True)
    loss = fn(x, target, **options)
    case = {"name": name, "op": op, "dtype": dtype, "input": flat(x)}
    case["target"] = flat(target)
    case["target"]["dtype"] = {torch.int64: "i64", torch.float32: "f32", torch.float64: "f64"}[
        target.dtype]
    case["options"] = stored_options if stored_options is not None else {}
    if loss.dim() > 0:
        grad_output = rand(loss.shape, seed, -1.5, 1.5).to(loss.dtype)
        (loss * grad_output).sum().backward()
        case["grad_output"] = flat(grad_output)
    else:
        loss.backward()
    case["loss"] = flat(loss)
    case["grad"] = flat(x.grad)
    cases.append(case)


def class_targets(shape, classes, mode, seed):
    """Class indices; mode 'neg' sets some to -100 (ignored), 'class' uses ignore_index 1."""
    t = randint(shape, classes, seed)
    flat_t = t.view(-1)
    if mode == "neg" and flat_t.numel() > 1:
        flat_t[1] = -100
        flat_t[-1] = -100
    if mode == "class":
        flat_t[0] = 1
        return t, 1
    return t, -100


def main():
    cases = []
    seed = 1000
    # cross_entropy and nll_loss with class-index targets: [N, C], [N, C, d], [N, C, d1, d2], [C].
    shapes = [[5, 4], [2, 4, 3], [2, 3, 2, 3], [4]]
    for shape, mode, use_weight, smoothing, reduction, dtype in itertools.product(
            shapes, ["none", "neg", "class"], [False, True], [0.0, 0.15], REDUCTIONS, DTYPES):
        if len(shape) == 1 and mode == "neg":
            continue  # the only sample ignored: the mean is NaN, checked in the C++ test
        seed += 1
        classes = shape[0] if len(shape) == 1 else shape[1]
        tshape = [] if len(shape) == 1 else [shape[0]] + shape[2:]
        if len(shape) == 1:
            target = torch.tensor(2 if mode == "none" else 1, dtype=torch.int64)
            ignore = -100 if mode == "none" else 3
        else:
            target, ignore = class_targets(tshape, classes, mode, seed)
        inp = rand(shape, seed)
        if len(shape) == 2:
            inp[0, 1] = 40.0  # a large logit: the log-sum-exp must stay finite
        weight = rand([classes], seed + 50000, 0.2, 2.0) if use_weight else None
        stored = {"ignore_index": ignore, "reduction": reduction, "label_smoothing": smoothing}
        wt = weight.to(DTYPES[dtype]) if use_weight else None
        if use_weight:
            stored["weight"] = flat(wt)
        name = f"cross_entropy {shape} ignore={mode} weight={use_weight} ls={smoothing} {reduction}"
        run(cases, name, "cross_entropy", F.cross_entropy, dtype, inp, target,
            {"weight": wt, "ignore_index": ignore, "reduction": reduction,
             "label_smoothing": smoothing}, seed, stored)
        if smoothing == 0.0:
            stored = {k: v for k, v in stored.items() if k != "label_smoothing"}
            lp = torch.log_softmax(inp, 0 if len(shape) == 1 else 1)
            run(cases, name.replace("cross_entropy", "nll_loss").replace(" ls=0.0", ""),
                "nll_loss", F.nll_loss, dtype, lp, target,
                {"weight": wt, "ignore_index": ignore, "reduction": reduction}, seed, stored)

    # cross_entropy with class probabilities (target shaped like the input).
    for shape, use_weight, smoothing, reduction, dtype in itertools.product(
            [[5, 4], [2, 3, 2, 3], [4]], [False, True], [0.0, 0.2], REDUCTIONS, DTYPES):
        seed += 1
        cd = 0 if len(shape) == 1 else 1
        classes = shape[cd]
        inp = rand(shape, seed)
        probs = torch.softmax(rand(shape, seed + 70000, -2.0, 2.0), cd).to(DTYPES[dtype])
        weight = rand([classes], seed + 50000, 0.2, 2.0).to(DTYPES[dtype]) if use_weight else None
        stored = {"reduction": reduction, "label_smoothing": smoothing}
        if use_weight:
            stored["weight"] = flat(weight)
        run(cases, f"cross_entropy probs {shape} weight={use_weight} ls={smoothing} {reduction}",
            "cross_entropy", F.cross_entropy, dtype, inp, probs,
            {"weight": weight, "reduction": reduction, "label_smoothing": smoothing}, seed, stored)

    # Elementwise regression losses.
    for reduction, dtype in itertools.product(REDUCTIONS, DTYPES):
        seed += 1
        inp = rand([3, 4], seed)
        target = rand([3, 4], seed + 1).to(DTYPES[dtype])
        for op, fn in [("mse_loss", F.mse_loss), ("l1_loss", F.l1_loss)]:
            run(cases, f"{op} {reduction}", op, fn, dtype, inp, target, {"reduction": reduction},
                seed, {"reduction": reduction})
        for beta in [1.0, 0.5, 2.5, 0.0]:
            run(cases, f"smooth_l1_loss beta={beta} {reduction}", "smooth_l1_loss",
                F.smooth_l1_loss, dtype, inp, target, {"reduction": reduction, "beta": beta},
                seed, {"reduction": reduction, "beta": beta})

    # binary_cross_entropy_with_logits: weight [N, C] or [C], pos_weight [C]; large logits.
    for wmode, use_pos, reduction, dtype in itertools.product(
            ["none", "full", "class"], [False, True], REDUCTIONS, DTYPES):
        seed += 1
        inp = rand([4, 3], seed, -4.0, 4.0)
        inp[0, 0] = 35.0
        inp[1, 2] = -35.0
        target = rand([4, 3], seed + 1, 0.0, 1.0)
        target[0, 1] = 0.0
        target[2, 2] = 1.0
        target = target.to(DTYPES[dtype])
        stored = {"reduction": reduction}
        opts = {"reduction": reduction}
        if wmode != "none":
            w = rand([4, 3] if wmode == "full" else [3], seed + 2, 0.1, 2.0).to(DTYPES[dtype])
            opts["weight"] = w
            stored["weight"] = flat(w)
        if use_pos:
            pw = rand([3], seed + 3, 0.3, 3.0).to(DTYPES[dtype])
            opts["pos_weight"] = pw
            stored["pos_weight"] = flat(pw)
        run(cases, f"bce_with_logits weight={wmode} pos_weight={use_pos} {reduction}",
            "binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, dtype, inp,
            target, opts, seed, stored)

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loss_golden.json")
    with open(out, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f, allow_nan=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
