#!/usr/bin/env python3
"""Writes grad_scaler_golden.json: PyTorch's GradScaler on a short training run with injected
inf/NaN gradients, for ember's GradScaler tests.

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 -O tests/optim/golden/make_grad_scaler_golden.py

torch.cuda.amp.GradScaler in 1.13 runs on CUDA only: its two kernels
(_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) have no CPU build and it
asserts CUDA tensors. So this script runs the real GradScaler class (its stages, inv_scale
computation, skip and update logic) with its asserts stripped (-O), CUDA reported available,
and the two kernels replaced by line-for-line Python versions of PyTorch's CUDA kernels
(aten/src/ATen/native/cuda/AmpKernels.cu).

Each case: a linear model y = x W^T + b (W [2, 3], b [2]) trained with SGD (lr 0.05,
momentum 0.9) on fixed data, loss = mean((y - t)^2) in float32; after backward, the
gradients named in "inject" are overwritten (step -> [param, flat index, value]). Recorded:
the scale after every update(), which steps were skipped, the final parameters and the
growth tracker.
"""
import json
import math
import os
import warnings

import torch

assert not __debug__, "run with python3 -O (GradScaler's CUDA asserts must be stripped)"


def foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    inv = inv_scale.item()
    for g in grads:
        flat = g.view(-1)
        for i in range(flat.numel()):
            val = flat[i].item()
            if not math.isfinite(val):
                found_inf.fill_(1.0)
            if inv != 1.0:
                flat[i] = torch.tensor(val, dtype=torch.float32) * inv_scale[0]


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                  growth_interval):
    if found_inf.item():
        scale.mul_(backoff_factor)  # in f32
        growth_tracker.fill_(0)
    else:
        successful = growth_tracker.item() + 1
        if successful == growth_interval:
            new_scale = scale * growth_factor
            if math.isfinite(new_scale.item()):
                scale.copy_(new_scale)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


torch._amp_foreach_non_finite_check_and_unscale_ = foreach_non_finite_check_and_unscale_
torch._amp_update_scale_ = update_scale_
torch.cuda.is_available = lambda: True
warnings.simplefilter("ignore")

X = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-1.0, 0.75, 1.0], [0.2, 0.4, -1.2]]
T = [[1.0, -0.5], [0.3, 0.8], [-1.2, 0.4], [0.6, 0.1]]
W0 = [[0.1, -0.2, 0.3], [0.4, 0.05, -0.15]]
B0 = [0.02, -0.03]

CASES = [
    # name, scaler options, steps, clip max_norm (None: no unscale_/clip), injections
    ("growth_and_backoff", {"init_scale": 1024.0, "growth_interval": 3}, 12, None,
     {"2": ["weight", 0, "inf"], "6": ["bias", 1, "nan"], "7": ["weight", 4, "-inf"]}),
    ("defaults", {}, 5, None, {"1": ["bias", 0, "inf"]}),
    ("unscale_then_clip", {"init_scale": 256.0, "growth_interval": 2}, 8, 0.5,
     {"3": ["weight", 2, "nan"]}),
]


def run(options, steps, clip, inject):
    x, t = torch.tensor(X), torch.tensor(T)
    weight = torch.tensor(W0, requires_grad=True)
    bias = torch.tensor(B0, requires_grad=True)
    params = {"weight": weight, "bias": bias}
    opt = torch.optim.SGD([weight, bias], lr=0.05, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler(**options)
    scales, skipped, losses = [], [], []
    for step in range(steps):
        opt.zero_grad()
        loss = ((x @ weight.t() + bias - t) ** 2).mean()
        losses.append(loss.item())
        scaler.scale(loss).backward()
        if str(step) in inject:
            name, index, value = inject[str(step)]
            params[name].grad.view(-1)[index] = float(value)
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([weight, bias], clip)
        before = weight.detach().clone()
        scaler.step(opt)
        skipped.append(bool(torch.equal(before, weight.detach())))
        scaler.update()
        scales.append(scaler.get_scale())
    return {
        "options": options,
        "steps": steps,
        "clip": clip,
        "inject": inject,
        "losses": losses,
        "scales": scales,
        "skipped": skipped,
        "weight": weight.detach().view(-1).tolist(),
        "bias": bias.detach().tolist(),
        "state_dict": {k: float(v) for k, v in scaler.state_dict().items()},
    }


golden = {"x": X, "t": T, "weight0": W0, "bias0": B0, "lr": 0.05, "momentum": 0.9,
          "cases": {name: run(o, s, c, i) for name, o, s, c, i in CASES}}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grad_scaler_golden.json")
with open(out, "w") as f:
    json.dump(golden, f, indent=1)
print("wrote", out)
