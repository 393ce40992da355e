#!/usr/bin/env python3
"""Writes optim_golden.json: reference values from PyTorch for ember's optim tests.

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/optim/golden/make_optim_golden.py

- "optimizers": parameter trajectories of SGD / Adam / AdamW over several steps, with the
  gradient of every step computed from the parameter as grad = p*p - 0.5*p + 0.3 (float32,
  in exactly this order of operations, so ember can reproduce it bit for bit).
- "schedules": the learning rates (and OneCycle's momentum) after construction and after
  each of 40 steps.
- "clip": clip_grad_norm_ on fixed gradients: the total norm and the clipped gradients.
- "optimizers_f64" / "clip_f64": the same in float64 (parameters, gradients and every
  hyper-parameter in double precision, as torch.set_default_dtype(torch.float64) gives), for
  checking that no option is rounded through float32 on the way.
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float32)

P0 = [[0.5, -0.3, 0.8], [1.2, -1.1, 0.25]]
P1 = [0.9, -0.6, 0.35, 1.5]
STEPS = 8


def grad_of(p):
    return p * p - 0.5 * p + 0.3


OPTIMIZER_CASES = [
    # name, class, defaults, per-group overrides ([] = one group with both parameters)
    ("sgd_plain", "SGD", {"lr": 0.1}, []),
    ("sgd_momentum", "SGD", {"lr": 0.1, "momentum": 0.9}, []),
    ("sgd_nesterov_wd", "SGD",
     {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}, []),
    ("sgd_dampened", "SGD",
     {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 1e-3}, []),
    ("sgd_groups", "SGD", {"lr": 0.1, "momentum": 0.9},
     [{}, {"lr": 0.01, "momentum": 0.5, "weight_decay": 1e-2}]),
    ("adam", "Adam", {"lr": 0.01}, []),
    ("adam_wd_amsgrad", "Adam",
     {"lr": 0.02, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 1e-2, "amsgrad": True},
     []),
    ("adamw", "AdamW", {"lr": 0.01, "weight_decay": 0.05}, []),
    ("adamw_amsgrad", "AdamW",
     {"lr": 0.02, "betas": (0.85, 0.99), "weight_decay": 1e-2, "amsgrad": True}, []),
    ("adamw_groups", "AdamW", {"lr": 0.01},
     [{"lr": 0.03, "betas": (0.5, 0.9)}, {"weight_decay": 0.1, "amsgrad": True}]),
]


# float64 cases: options that float32 cannot hold exactly, so a rounded option shows.
OPTIMIZER_CASES_F64 = [
    ("sgd_plain", "SGD", {"lr": 0.1}, []),
    ("sgd_momentum", "SGD", {"lr": 0.03, "momentum": 0.9}, []),
    ("sgd_nesterov_wd", "SGD",
     {"lr": 0.03, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, []),
    ("sgd_dampened", "SGD",
     {"lr": 0.07, "momentum": 0.7, "dampening": 0.3, "weight_decay": 0.003}, []),
    ("adam", "Adam", {"lr": 0.01}, []),
    ("adam_wd_amsgrad", "Adam",
     {"lr": 0.02, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 1e-2, "amsgrad": True},
     []),
    ("adamw", "AdamW", {"lr": 0.01, "weight_decay": 0.05}, []),
    ("adamw_amsgrad", "AdamW",
     {"lr": 0.03, "betas": (0.85, 0.99), "eps": 1e-7, "weight_decay": 0.1, "amsgrad": True},
     []),
    ("adamw_groups", "AdamW", {"lr": 0.01},
     [{"lr": 0.03, "betas": (0.5, 0.9)}, {"weight_decay": 0.1, "amsgrad": True}]),
]


def run_optimizer(cls_name, defaults, groups, dtype=torch.float32):
    p0 = torch.tensor(P0, dtype=dtype, requires_grad=True)
    p1 = torch.tensor(P1, dtype=dtype, requires_grad=True)
    params = [p0, p1]
    if groups:
        param_groups = [dict(params=[p], **o) for p, o in zip(params, groups)]
    else:
        param_groups = [dict(params=params)]
    cls = getattr(torch.optim, cls_name)
    opt = cls(param_groups, foreach=False, **defaults)
    trajectory = []
    for _ in range(STEPS):
        with torch.no_grad():
            for p in params:
                p.grad = grad_of(p.detach())
        opt.step()
        trajectory.append([p.detach().flatten().tolist() for p in params])
    return trajectory


def option_json(options):
    out = {}
    for key, value in options.items():
        if key == "betas":
            out["beta1"], out["beta2"] = value
        else:
            out[key] = float(value)
    return out


def schedule(make, steps=40, momentum_key=None):
    opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": 0.1},
                           {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.02}],
                          lr=0.1, momentum=0.9)
    if momentum_key == "beta1":
        opt = torch.optim.Adam([{"params": [torch.zeros(1, requires_grad=True)], "lr": 0.1},
                                {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.02}])
    sched = make(opt)
    lrs, momenta = [], []

    def record():
        lrs.append([g["lr"] for g in opt.param_groups])
        if momentum_key == "momentum":
            momenta.append([g["momentum"] for g in opt.param_groups])
        elif momentum_key == "beta1":
            momenta.append([g["betas"][0] for g in opt.param_groups])

    record()
    for _ in range(steps):
        opt.step()
        sched.step()
        record()
    out = {"lrs": lrs}
    if momentum_key:
        out["momenta"] = momenta
    return out


S = torch.optim.lr_scheduler
SCHEDULES = {
    "step": schedule(lambda o: S.StepLR(o, step_size=7, gamma=0.5)),
    "multistep": schedule(lambda o: S.MultiStepLR(o, milestones=[12, 5, 12, 30], gamma=0.3)),
    "cosine": schedule(lambda o: S.CosineAnnealingLR(o, T_max=15, eta_min=0.001)),
    "cosine_zero_min": schedule(lambda o: S.CosineAnnealingLR(o, T_max=10)),
    "onecycle": schedule(lambda o: S.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=40),
                         momentum_key="momentum"),
    "onecycle_three_phase_linear": schedule(
        lambda o: S.OneCycleLR(o, max_lr=0.01, total_steps=30, pct_start=0.25,
                               anneal_strategy="linear", three_phase=True, div_factor=10.0,
                               final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9),
        steps=30, momentum_key="beta1"),
    "warmup_cosine": schedule(lambda o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.1, total_iters=5), S.CosineAnnealingLR(o, T_max=20)],
        milestones=[5])),
    "warmup_step": schedule(lambda o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.25, total_iters=4), S.StepLR(o, 6, gamma=0.5)],
        milestones=[4])),
    "warmup_constant": schedule(lambda o: S.LinearLR(o, start_factor=0.2, total_iters=6)),
}

CLIP_GRADS = [
    [[0.5, -1.5, 2.0], [0.25, -0.75, 1.0]],
    [3.0, -0.5, 0.125, -2.5],
    [[-4.0]],
]
CLIP_CASES = [(1.0, 2.0), (2.5, 1.0), (0.7, math.inf), (1.3, 3.0), (100.0, 2.0)]


CLIP_CASES_F64 = [(1.0, 2.0), (0.3, 2.0), (2.5, 1.0), (0.7, math.inf), (1.3, 3.0), (0.1, 1.5),
                  (100.0, 2.0)]


def clip_cases(cases=CLIP_CASES, dtype=torch.float32):
    out = []
    for max_norm, norm_type in cases:
        params = [torch.zeros(torch.tensor(g).shape, dtype=dtype, requires_grad=True)
                  for g in CLIP_GRADS]
        for p, g in zip(params, CLIP_GRADS):
            p.grad = torch.tensor(g, dtype=dtype)
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        out.append({"max_norm": max_norm, "norm_type": "inf" if math.isinf(norm_type) else norm_type,
                    "total_norm": total.item(),
                    "grads": [p.grad.flatten().tolist() for p in params]})
    return out


def main():
    optimizers = []
    for name, cls_name, defaults, groups in OPTIMIZER_CASES:
        optimizers.append({
            "name": name, "optimizer": cls_name, "defaults": option_json(defaults),
            "groups": [option_json(g) for g in groups],
            "trajectory": run_optimizer(cls_name, defaults, groups)})
    optimizers_f64 = []
    for name, cls_name, defaults, groups in OPTIMIZER_CASES_F64:
        optimizers_f64.append({
            "name": name, "optimizer": cls_name, "defaults": option_json(defaults),
            "groups": [option_json(g) for g in groups],
            "trajectory": run_optimizer(cls_name, defaults, groups, torch.float64)})
    golden = {
        "torch_version": torch.__version__,
        "initial": [sum(P0, []), P1], "shapes": [[2, 3], [4]], "steps": STEPS,
        "optimizers": optimizers, "schedules": SCHEDULES,
        "clip": {"grads": [torch.tensor(g).flatten().tolist() for g in CLIP_GRADS],
                 "shapes": [list(torch.tensor(g).shape) for g in CLIP_GRADS],
                 "cases": clip_cases()},
        "optimizers_f64": optimizers_f64,
        "clip_f64": {"cases": clip_cases(CLIP_CASES_F64, torch.float64)},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
