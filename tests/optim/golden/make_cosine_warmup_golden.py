#!/usr/bin/env python3
"""Writes cosine_warmup_golden.json: nanoGPT's learning rates for CosineWithWarmupLR's tests.

Run once and commit the output; the tests only read the JSON (no torch needed):
  /usr/bin/python3 tests/optim/golden/make_cosine_warmup_golden.py

get_lr below is nanoGPT's train.py function as first published (warmup from 0), with its
globals made arguments. Each case records the lr of every step 0..steps for each base lr.
"""
import json
import math
import os


def get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


CASES = {
    # nanoGPT's shakespeare_char config, scaled down: lr 1e-3, min_lr 1e-4.
    "shakespeare_char": dict(lrs=[1e-3], warmup=10, max_steps=100, min_lr=1e-4, steps=120),
    # Two groups (decay and no-decay at different lrs), nanoGPT's GPT-2 lr and min_lr.
    "two_groups": dict(lrs=[6e-4, 3e-4], warmup=7, max_steps=40, min_lr=6e-5, steps=50),
    # No warmup: cosine from the first step, to 0.
    "no_warmup": dict(lrs=[0.1], warmup=0, max_steps=25, min_lr=0.0, steps=30),
}


def main():
    out = {}
    for name, c in CASES.items():
        lrs = [[get_lr(it, lr, c["warmup"], c["max_steps"], c["min_lr"]) for lr in c["lrs"]]
               for it in range(c["steps"] + 1)]
        out[name] = dict(c, expected=lrs)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cosine_warmup_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
