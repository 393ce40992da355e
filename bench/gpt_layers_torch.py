#!/usr/bin/python3
"""Reference timings for bench/gpt_layers_bench: PyTorch's CPU layer_norm and gelu.

    /usr/bin/python3 bench/gpt_layers_torch.py   (Debian python3-torch) [--rows 2048] [--threads 2]

Prints one JSON line per op and pass, with the keys gpt_layers_bench uses.
"""
import argparse
import json

import torch
import torch.nn.functional as F

from conv_torch import median_ms  # the same timing rule (this folder is on sys.path)


def bench_op(op, x, f, threads):
    def line(pass_name, ms):
        print(json.dumps({"bench": "gpt_layers", "impl": "torch", "op": op, "pass": pass_name,
                          "shape": str(list(x.shape)).replace(" ", ""), "threads": threads,
                          "ms": round(ms, 4)}), flush=True)

    def forward():
        with torch.no_grad():
            f(x)

    line("forward", median_ms(forward))
    leaf = x.detach().clone().requires_grad_(True)
    grad = torch.randn_like(x)

    def forward_backward():
        leaf.grad = None
        f(leaf).backward(grad)

    line("forward_backward", median_ms(forward_backward))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    width = 768
    w = torch.ones(width, requires_grad=True)
    b = torch.zeros(width, requires_grad=True)
    bench_op("layer_norm", torch.randn(args.rows, width),
             lambda x: F.layer_norm(x, [width], w, b), args.threads)
    hidden = torch.randn(args.rows, 4 * width)
    bench_op("gelu", hidden, lambda x: F.gelu(x), args.threads)
    bench_op("gelu_tanh", hidden, lambda x: F.gelu(x, approximate="tanh"), args.threads)


if __name__ == "__main__":
    main()
