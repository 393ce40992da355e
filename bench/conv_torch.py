#!/usr/bin/python3
"""Reference timings for bench/conv_bench: PyTorch's CPU conv2d (oneDNN) on the same shapes.

    /usr/bin/python3 bench/conv_torch.py   (Debian python3-torch) [--batch 128] [--threads 2]

Prints one JSON line per shape and pass, with the keys conv_bench uses.
"""
import argparse
import json
import time

import torch

# ResNet-20 (CIFAR) convolutions: name, in, out, size, kernel, stride, padding.
SHAPES = [
    ("stem_3x16_32", 3, 16, 32, 3, 1, 1),
    ("s1_16x16_32", 16, 16, 32, 3, 1, 1),
    ("s2_16x32_32_s2", 16, 32, 32, 3, 2, 1),
    ("s2_32x32_16", 32, 32, 16, 3, 1, 1),
    ("s3_32x64_16_s2", 32, 64, 16, 3, 2, 1),
    ("s3_64x64_8", 64, 64, 8, 3, 1, 1),
    ("down_16x32_1x1_s2", 16, 32, 32, 1, 2, 0),
    ("down_32x64_1x1_s2", 32, 64, 16, 1, 2, 0),
]


def median_ms(fn, warmup=2, min_reps=5, min_seconds=0.3, max_reps=50):
    for _ in range(warmup):
        fn()
    times, total = [], 0.0
    while len(times) < max_reps and (len(times) < min_reps or total < min_seconds):
        start = time.perf_counter()
        fn()
        t = time.perf_counter() - start
        times.append(t)
        total += t
    times.sort()
    n = len(times)
    return 1e3 * (times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2]))


def call_seconds(fn, sync=lambda: None):
    """Seconds one call of fn takes (sync after it); timed on its own, the first call under
    torch.compile shows the compilation."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name, cin, cout, size, k, stride, pad in SHAPES:
        x = torch.randn(args.batch, cin, size, size)
        w = torch.randn(cout, cin, k, k) * 0.1
        with torch.no_grad():
            y = torch.nn.functional.conv2d(x, w, None, stride, pad)
        gy = torch.randn_like(y)
        first = name.startswith("stem")  # the data needs no gradient

        def forward():
            with torch.no_grad():
                torch.nn.functional.conv2d(x, w, None, stride, pad)

        def backward():
            torch.ops.aten.convolution_backward(
                gy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                [not first, True, False])

        for pass_name, fn in (("forward", forward), ("backward", backward)):
            print(json.dumps({"bench": "conv", "impl": "torch", "shape": name, "pass": pass_name,
                              "batch": args.batch, "threads": args.threads,
                              "ms": round(median_ms(fn), 4)}), flush=True)


if __name__ == "__main__":
    main()
