#!/usr/bin/env python3
"""Writes sched_golden.json: PyTorch's learning rates for ember's LR-scheduler tests.

Run once with Debian's python3-torch (1.13, CPU) and commit the output; the tests only read
the JSON:  /usr/bin/python3 tests/optim/golden/make_sched_golden.py

Every case builds SGD (momentum 0.9) with two param groups, lrs 0.1 and 0.02, builds the
schedule(s), and records each group's lr after construction and after each of STEPS steps
(optimizer.step() then scheduler.step(), as in a training loop). OneCycleLR cases also record
the momentum. ReduceLROnPlateau cases step on a fixed metric sequence, stored as "metrics".
The lambdas here are written again in tests/optim/lr_scheduler_test.cpp; keep them equal.
"""
import json
import os
import warnings

import torch
from torch.optim import lr_scheduler as S

warnings.filterwarnings("ignore")
STEPS = 45


def make_optimizer():
    params = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    return torch.optim.SGD([{"params": [params[0]], "lr": 0.1},
                            {"params": [params[1]], "lr": 0.02}], lr=0.1, momentum=0.9)


def lam0(e):
    return 0.95 ** e


def lam1(e):
    return 1.0 / (1.0 + 0.1 * e)


def lam_shared(e):
    return 0.5 if e % 10 < 5 else 1.0


def mul0(e):
    return 0.97


def mul1(e):
    return 1.0 - 0.005 * e


# The metric fed to ReduceLROnPlateau: improving, then plateaus with small wiggles.
METRICS = [round(1.0 / (1.0 + t) if t < 8 else 0.11 + 0.01 * ((t * 7) % 5) - 0.0005 * (t // 15),
                 6) for t in range(1, STEPS + 1)]

CASES = {
    "lambda_per_group": lambda o: S.LambdaLR(o, [lam0, lam1]),
    "lambda_shared": lambda o: S.LambdaLR(o, lam_shared),
    "multiplicative": lambda o: S.MultiplicativeLR(o, [mul0, mul1]),
    "exponential": lambda o: S.ExponentialLR(o, 0.9),
    "polynomial": lambda o: S.PolynomialLR(o, total_iters=20, power=2.0),
    "polynomial_default": lambda o: S.PolynomialLR(o),
    "constant": lambda o: S.ConstantLR(o, factor=0.25, total_iters=6),
    "constant_default": lambda o: S.ConstantLR(o),
    "linear": lambda o: S.LinearLR(o, start_factor=0.2, end_factor=0.9, total_iters=10),
    "linear_default": lambda o: S.LinearLR(o),
    "sequential_linear_cosine": lambda o: S.SequentialLR(
        o, [S.LinearLR(o, 0.1, 1.0, 5), S.CosineAnnealingLR(o, 30, 0.001)], [5]),
    "sequential_three": lambda o: S.SequentialLR(
        o, [S.ConstantLR(o, 0.5, 3), S.ExponentialLR(o, 0.9), S.StepLR(o, 5, 0.5)], [4, 15]),
    "sequential_lambda_polynomial": lambda o: S.SequentialLR(
        o, [S.LambdaLR(o, [lam0, lam1]), S.PolynomialLR(o, 12, 1.5)], [10]),
    "sequential_multiplicative_step": lambda o: S.SequentialLR(
        o, [S.MultiplicativeLR(o, [mul0, mul1]), S.StepLR(o, 4, 0.5)], [10]),
    "sequential_linear_onecycle": lambda o: S.SequentialLR(
        o, [S.LinearLR(o, 0.25, 1.0, 5), S.OneCycleLR(o, [1.0, 0.5], total_steps=40)], [5]),
    "chained_exponential_step": lambda o: S.ChainedScheduler(
        [S.ExponentialLR(o, 0.9), S.StepLR(o, 4, 0.5)]),
    "chained_linear_exponential": lambda o: S.ChainedScheduler(
        [S.LinearLR(o, 0.1, 1.0, 8), S.ExponentialLR(o, 0.95)]),
    "chained_constant_exponential": lambda o: S.ChainedScheduler(
        [S.ConstantLR(o, 0.1, 2), S.ExponentialLR(o, 0.9)]),
    "chained_multistep_polynomial_multiplicative": lambda o: S.ChainedScheduler(
        [S.MultiStepLR(o, [6, 6, 20], 0.5), S.PolynomialLR(o, 40, 0.5),
         S.MultiplicativeLR(o, [mul0, mul1])]),
    "chained_nested": lambda o: S.ChainedScheduler(
        [S.ChainedScheduler([S.LinearLR(o, 0.5, 1.0, 4), S.StepLR(o, 10, 0.1)]),
         S.ExponentialLR(o, 0.98)]),
}

PLATEAU_CASES = {
    "plateau_default": {},
    "plateau_min_rel": dict(mode="min", factor=0.5, patience=2),
    "plateau_max_abs_cooldown": dict(mode="max", factor=0.3, patience=1, threshold=0.05,
                                     threshold_mode="abs", cooldown=2, min_lr=[0.01, 0.001]),
    "plateau_eps": dict(mode="min", factor=0.9, patience=0, threshold=0.0, eps=0.005),
}


def lrs(o):
    return [g["lr"] for g in o.param_groups]


def run(make):
    o = make_optimizer()
    s = make(o)
    out = {"lrs": [lrs(o)]}
    onecycle = any(isinstance(c, S.OneCycleLR) for c in getattr(s, "_schedulers", [s]))
    if onecycle:
        out["momenta"] = [[g["momentum"] for g in o.param_groups]]
    for _ in range(STEPS):
        o.step()
        s.step()
        out["lrs"].append(lrs(o))
        if onecycle:
            out["momenta"].append([g["momentum"] for g in o.param_groups])
    return out


def run_plateau(kwargs):
    o = make_optimizer()
    s = S.ReduceLROnPlateau(o, **kwargs)
    metrics = METRICS if kwargs.get("mode", "min") == "min" else [1.0 - m for m in METRICS]
    out = {"metrics": metrics, "lrs": [lrs(o)], "num_bad_epochs": [s.num_bad_epochs],
           "cooldown_counter": [s.cooldown_counter]}
    for m in metrics:
        o.step()
        s.step(m)
        out["lrs"].append(lrs(o))
        out["num_bad_epochs"].append(s.num_bad_epochs)
        out["cooldown_counter"].append(s.cooldown_counter)
    return out


def main():
    golden = {"torch_version": torch.__version__, "steps": STEPS, "schedules": {}}
    for name, make in CASES.items():
        golden["schedules"][name] = run(make)
    for name, kwargs in PLATEAU_CASES.items():
        golden["schedules"][name] = run_plateau(kwargs)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sched_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
