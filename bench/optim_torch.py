#!/usr/bin/python3
"""The reference for bench/optim_bench: one optimizer step over the same ResNet's parameters
in PyTorch (Debian's python3-torch), for-loop (foreach=False) against foreach=True, with the
same flags and JSON keys. clip_grad_norm_ has no foreach in PyTorch 1.13: its foreach_ms is
the for-loop's there. --compile (PyTorch 2) adds each optimizer's foreach step through
torch.compile: compiled_ms, and compile_s, its first call's extra time (the compilation)."""
import argparse
import inspect
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_torch import call_seconds  # noqa: E402  (the timing helpers of the references)
from train_step_torch import CONFIGS, ResNet  # noqa: E402  (the same models as train_step)

VARIANTS = {
    "sgd_nesterov": (1, lambda p, f: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-4,
                                                     nesterov=True, foreach=f)),
    "adam": (2, lambda p, f: torch.optim.Adam(p, lr=1e-3, foreach=f)),
    "adamw": (2, lambda p, f: torch.optim.AdamW(p, lr=1e-3, foreach=f)),
    "adamw_amsgrad": (3, lambda p, f: torch.optim.AdamW(p, lr=1e-3, amsgrad=True, foreach=f)),
}


def params_with_grads(model):
    params = []
    for p in model.parameters():
        c = p.detach().clone().requires_grad_()
        c.grad = torch.randn_like(c) * 1e-2
        params.append(c)
    return params


def median_times(fns, sync, warmup=3, min_reps=10, min_seconds=1.0, max_reps=100):
    """Median seconds per call of each function, the functions taking turns."""
    for _ in range(warmup):
        for fn in fns:
            fn()
            sync()
    times = [[] for _ in fns]
    rep = 0
    while rep < max_reps and (rep < min_reps or sum(times[0]) < min_seconds):
        for i, fn in enumerate(fns):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[i].append(time.perf_counter() - start)
        rep += 1
    return [statistics.median(t) for t in times]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18", choices=CONFIGS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--optimizer", default="all", help="all, or names separated by commas")
    parser.add_argument("--compile", action="store_true",
                        help="also the foreach step through torch.compile (PyTorch 2): compiled_ms, compile_s")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = ResNet(*CONFIGS[args.model]).to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def report(what, tensors, numel, nbytes, s, first_compiled_s=None):
        line = {
            "bench": "optim_step", "optimizer": what, "model": args.model, "device": args.device,
            "threads": args.threads, "tensors": tensors, "numel": numel,
            "per_param_ms": round(s[0] * 1e3, 4), "foreach_ms": round(s[1] * 1e3, 4),
            "speedup": round(s[0] / s[1], 4), "per_param_gbps": round(nbytes / s[0] * 1e-9, 4),
            "foreach_gbps": round(nbytes / s[1] * 1e-9, 4), "torch": torch.__version__}
        if first_compiled_s is not None:
            line.update({"compiled_ms": round(s[2] * 1e3, 4), "compiled_gbps": round(nbytes / s[2] * 1e-9, 4),
                         "compile_s": round(first_compiled_s - s[2], 3)})
        print(json.dumps(line), flush=True)

    for name, (state_tensors, make) in VARIANTS.items():
        if args.optimizer != "all" and name not in args.optimizer.split(","):
            continue
        a, b = params_with_grads(model), params_with_grads(model)
        per_param, multi = make(a, False), make(b, True)
        steps, first_compiled_s = [per_param.step, multi.step], None
        if args.compile:
            # The step compiled whole (PyTorch's recipe for a compiled optimizer); its first
            # call compiles.
            compiled = torch.compile(make(params_with_grads(model), True).step)
            first_compiled_s = call_seconds(compiled, sync)
            steps.append(compiled)
        numel = sum(p.numel() for p in b)
        s = median_times(steps, sync)
        report(name, len(b), numel, numel * 4 * (3.0 + 2.0 * state_tensors), s, first_compiled_s)

    if args.optimizer == "all" or "clip_grad_norm" in args.optimizer.split(","):
        a, b = params_with_grads(model), params_with_grads(model)
        clip = torch.nn.utils.clip_grad_norm_
        has_foreach = "foreach" in inspect.signature(clip).parameters
        s = median_times([lambda: clip(a, 1.0, 2.0, foreach=False) if has_foreach else clip(a, 1.0),
                          lambda: clip(b, 1.0, 2.0, foreach=True) if has_foreach else clip(b, 1.0)],
                         sync)
        numel = sum(p.numel() for p in b)
        report("clip_grad_norm", len(b), numel, numel * 4 * 3.0, s)


if __name__ == "__main__":
    main()
