#!/usr/bin/python3
"""ember-train's default recipe in PyTorch, end to end: ResNet-20 on Fashion-MNIST (Debian's
dataset-fashion-mnist files), the reference beside `ember-train --epochs N` for wall time and
final test accuracy (scripts/gpu_session.sh's e2e stage runs both on the GPU).

The recipe is ember-train's where its command line is silent: SGD with Nesterov momentum 0.9,
weight decay 5e-4 on every parameter, lr 0.1 per 128 images, OneCycleLR over the run's steps
(PyTorch's defaults: pct_start 0.3, momentum cycled 0.95 -> 0.85), label smoothing 0.1,
random 28x28 crops of the image padded by 3 and horizontal flips, the dataset's mean and std
(0.2860, 0.3530), the last partial batch dropped, a test evaluation after every epoch. The
model is bench/train_step_torch.py's ResNet-20 with a 1-channel stem and torchvision's
initialisation, as ember's. Augmentation runs on the training device, batched, so the data
pipeline does not bound the GPU figure. Prints one JSON line at the end.

  bench/fashion_recipe_torch.py --device cuda --precision bf16 --epochs 10
  bench/fashion_recipe_torch.py --device cpu --threads 2 --epochs 1
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_torch import CONFIGS, ResNet  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    """An IDX file (gzipped or not) as a uint8 tensor, its header checked against its size."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise SystemExit(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    count = 1
    for d in dims:
        count *= d
    if len(body) != count:
        raise SystemExit(f"{path}: header says {dims}, file holds {len(body)} bytes")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def load_split(root, prefix, device):
    def find(name):
        for candidate in (name + ".gz", name):
            path = os.path.join(root, candidate)
            if os.path.exists(path):
                return path
        raise SystemExit(f"{root}: no {name}[.gz] (install dataset-fashion-mnist or pass --data)")

    images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    x = images.to(device).unsqueeze(1)  # [N, 1, 28, 28] uint8
    y = labels.to(device=device, dtype=torch.int64)
    return x, y


def normalise(x_uint8):
    return (x_uint8.float() / 255.0 - MEAN) / STD


def augment(x_uint8, generator):
    """Random 28x28 crops of the images zero-padded by 3, then a horizontal flip of half."""
    n, _, h, w = x_uint8.shape
    pad = h // 8
    padded = F.pad(x_uint8.float(), (pad, pad, pad, pad))
    dev = x_uint8.device
    oy = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (n,), device=dev, generator=generator)
    rows = (oy[:, None] + torch.arange(h, device=dev)[None, :])[:, :, None]
    cols = (ox[:, None] + torch.arange(w, device=dev)[None, :])[:, None, :]
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    cols = torch.where(flip[:, None, None], cols.flip(-1), cols)
    crops = padded[torch.arange(n, device=dev)[:, None, None], 0, rows, cols].unsqueeze(1)
    return (crops / 255.0 - MEAN) / STD


def resnet20_fashion():
    model = ResNet(*CONFIGS["resnet20"], classes=10)
    model.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on for CUDA, as ember-train")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1, help="per 128 images")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (a smoke run)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    channels_last = cuda if a.channels_last is None else a.channels_last
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    start = time.perf_counter()
    x_train, y_train = load_split(a.data, "train", device)
    x_test, y_test = load_split(a.data, "t10k", device)
    model = resnet20_fashion().to(device).to(memory_format=fmt)
    lr = a.lr * a.batch / 128
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps_per_epoch = len(x_train) // a.batch
    total = a.epochs * steps_per_epoch
    if a.max_steps > 0:
        total = min(total, a.max_steps)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def evaluate():
        model.eval()
        correct, loss = 0, 0.0
        with torch.no_grad(), autocast:
            for i in range(0, len(x_test), 1000):
                xb = normalise(x_test[i:i + 1000]).contiguous(memory_format=fmt)
                out = model(xb).float()
                loss += F.cross_entropy(out, y_test[i:i + 1000], reduction="sum").item()
                correct += (out.argmax(1) == y_test[i:i + 1000]).sum().item()
        model.train()
        return correct / len(x_test), loss / len(x_test)

    step, epochs, train_s = 0, [], 0.0
    for epoch in range(a.epochs):
        if step >= total:
            break
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        order = torch.randperm(len(x_train), device=device, generator=gen)
        loss_sum = torch.zeros((), device=device)
        n = 0
        for k in range(steps_per_epoch):
            if step >= total:
                break
            idx = order[k * a.batch:(k + 1) * a.batch]
            xb = augment(x_train[idx], gen).contiguous(memory_format=fmt)
            with autocast:
                loss = criterion(model(xb).float(), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            loss_sum += loss.detach()
            step += 1
            n += 1
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        train_s += seconds
        accuracy, test_loss = evaluate()
        epochs.append({"epoch": epoch + 1, "train_loss": round(loss_sum.item() / max(n, 1), 5),
                       "test_accuracy": round(accuracy, 5), "test_loss": round(test_loss, 5),
                       "epoch_s": round(seconds, 2)})
        print(json.dumps(epochs[-1]), file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    print(json.dumps({
        "framework": "pytorch", "torch": torch.__version__, "recipe": "resnet20 fashion-mnist onecycle",
        "device": str(device), "precision": a.precision, "channels_last": channels_last,
        "epochs": len(epochs), "steps": step, "batch": a.batch, "train_s": round(train_s, 2),
        "wall_s": round(wall, 2), "final_test_accuracy": epochs[-1]["test_accuracy"] if epochs else None,
        "per_epoch": epochs}))


if __name__ == "__main__":
    main()
