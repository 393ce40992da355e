#!/usr/bin/python3
"""Reference timings for bench/gpt_layers_bench: PyTorch's CPU layer_norm and gelu.

    /usr/bin/python3 bench/gpt_layers_torch.py   (Debian python3-torch) [--rows 2048] [--threads 2]
        [--compile]   (PyTorch 2, e.g. scripts/torch_ref.sh's venv: each op through torch.compile)

Prints one JSON line per op and pass, with the keys gpt_layers_bench uses; under --compile
each line adds compile_s, the first call's extra time over the median (the compilation).
"""
import argparse
import json

import torch
import torch.nn.functional as F

from conv_torch import call_seconds, median_ms  # the same timing rule (this folder is on sys.path)


def bench_op(op, x, f, threads, compile_):
    if compile_:
        f = torch.compile(f)

    def line(pass_name, fn):
        first_s = call_seconds(fn)
        ms = median_ms(fn)
        out = {"bench": "gpt_layers", "impl": "torch-compile" if compile_ else "torch", "op": op,
               "pass": pass_name, "shape": str(list(x.shape)).replace(" ", ""), "threads": threads,
               "ms": round(ms, 4), "torch": torch.__version__}
        if compile_:
            out["compile_s"] = round(first_s - ms * 1e-3, 3)
        print(json.dumps(out), flush=True)

    def forward():
        with torch.no_grad():
            f(x)

    line("forward", forward)
    leaf = x.detach().clone().requires_grad_(True)
    grad = torch.randn_like(x)

    def forward_backward():
        leaf.grad = None
        f(leaf).backward(grad)

    line("forward_backward", forward_backward)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile each op (PyTorch 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    width = 768
    w = torch.ones(width, requires_grad=True)
    b = torch.zeros(width, requires_grad=True)
    bench_op("layer_norm", torch.randn(args.rows, width),
             lambda x: F.layer_norm(x, [width], w, b), args.threads, args.compile)
    hidden = torch.randn(args.rows, 4 * width)
    bench_op("gelu", hidden, lambda x: F.gelu(x), args.threads, args.compile)
    bench_op("gelu_tanh", hidden, lambda x: F.gelu(x, approximate="tanh"), args.threads, args.compile)


if __name__ == "__main__":
    main()
