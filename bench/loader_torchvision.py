#!/usr/bin/env python3
"""torchvision's CIFAR-10 training pipeline on the data bench/loader_bench.cpp uses.

32x32x3 u8 images through RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor +
Normalize, batch 128, shuffled, DataLoader with 1 and 2 worker processes; one JSON line per
worker count with loader_bench's keys. Needs Debian's python3-torchvision (not a test
dependency): /usr/bin/python3 bench/loader_torchvision.py [--quick]
"""
import json
import statistics
import sys
import time

import numpy as np
import torch
from PIL import Image
from torchvision import transforms


class Synthetic(torch.utils.data.Dataset):
    """Images held as HWC u8 arrays and turned into PIL images per sample, as torchvision's
    CIFAR10 dataset does."""

    def __init__(self, images, targets, transform):
        self.images, self.targets, self.transform = images, targets, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), int(self.targets[i])


def main():
    quick = "--quick" in sys.argv[1:]
    images = 1280 if quick else 5120
    batch = 128
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(images, 32, 32, 3), dtype=np.uint8)
    targets = rng.integers(0, 10, size=images)
    transform = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    ])
    dataset = Synthetic(data, targets, transform)
    for workers in (1, 2):
        # Persistent workers keep process start-up out of the timed epochs.
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                             num_workers=workers, persistent_workers=True)
        checksum = 0.0
        times = []
        for epoch in range(4):  # the first epoch is warm-up
            start = time.perf_counter()
            for x, _ in loader:
                checksum += float(x[0, 0, 0, 0])
            if epoch > 0:
                times.append(time.perf_counter() - start)
        per_s = images / statistics.median(times)
        print(json.dumps({
            "bench": "loader", "impl": "torchvision", "workers": workers, "batch": batch,
            "images": images, "pipeline": "crop32pad4+hflip+to_tensor+normalize",
            "images_per_s": float("%.4g" % per_s),
            "images_per_s_per_worker": float("%.4g" % (per_s / workers)),
            "checksum": float("%.4g" % checksum),
        }), flush=True)


if __name__ == "__main__":
    main()
