#!/usr/bin/python3
"""The reference for bench/train_step: the same ResNet training step in PyTorch (Debian's
python3-torch, or scripts/torch_ref.sh's 2.x), with the same flags and JSON keys. Models are
built to match ember's (CIFAR ResNets with 1x1 projection shortcuts; ResNet-18/34 with the
CIFAR stem). The first step is timed on its own (first_step_s); under --compile (2.x) its
extra time over the median step, the compilation, is compile_s."""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_torch import call_seconds  # noqa: E402  (the timing helpers of the references)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self, channels, blocks, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels[0])
        layers, cin = [], channels[0]
        for i, (c, n) in enumerate(zip(channels, blocks)):
            stage = []
            for b in range(n):
                stage.append(BasicBlock(cin, c, 2 if i > 0 and b == 0 else 1))
                cin = c
            layers.append(nn.Sequential(*stage))
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


CONFIGS = {
    "resnet20": ([16, 32, 64], [3, 3, 3]), "resnet32": ([16, 32, 64], [5, 5, 5]),
    "resnet56": ([16, 32, 64], [9, 9, 9]), "resnet110": ([16, 32, 64], [18, 18, 18]),
    "resnet18": ([64, 128, 256, 512], [2, 2, 2, 2]), "resnet34": ([64, 128, 256, 512], [3, 4, 6, 3]),
}


def forward_flops(model):
    """Forward FLOPs per 32x32 image, counted as bench/train_step.cpp counts them: 2 per
    multiply-add of the stem, each block's two 3x3 convolutions, its 1x1 projection where the
    shape changes, and the classifier."""
    channels, blocks = CONFIGS[model]
    size, cin = 32, channels[0]
    macs = 3 * cin * 9 * size * size
    for stage, (cout, n) in enumerate(zip(channels, blocks)):
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            size //= stride
            macs += (cin * cout * 9 + cout * cout * 9) * size * size
            if stride != 1 or cin != cout:
                macs += cin * cout * size * size
            cin = cout
    return 2.0 * (macs + cin * 10)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet20", choices=CONFIGS)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ddp", action="store_true", help="under mpirun: gloo DDP beside no_sync")
    parser.add_argument("--channels-last", action="store_true",
                        help="model and images in torch.channels_last")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"],
                        help="as bench/train_step: fp32/tf32 set the TF32 switches, bf16/fp16 autocast "
                             "(fp16 with a GradScaler)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the device's dense peak for this precision, for the MFU field")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = ResNet(*CONFIGS[args.model]).to(device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    trained = model
    if args.ddp:
        rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=rank, world_size=world)
        trained = ddp = nn.parallel.DistributedDataParallel(model)
    if args.compile:
        trained = torch.compile(trained)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    # As ember's --precision (apps/precision.h): fp32 turns TF32 off, tf32 on, for cuBLAS and cuDNN.
    if args.precision in ("fp32", "tf32"):
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = None
    if args.precision == "fp16":
        scaler = (torch.amp.GradScaler(device.type) if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())
    images = torch.randn(args.batch, 3, 32, 32, device=device).to(memory_format=memory_format)
    labels = torch.randint(0, 10, (args.batch,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=low or torch.bfloat16, enabled=low is not None):
            loss = F.cross_entropy(trained(images), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    def local_step():
        with ddp.no_sync():
            step()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
        if args.ddp:
            dist.barrier()  # as bench/train_step: a common start, and the slowest rank's finish

    def median_times(fns):
        """Median seconds per call of each function, the functions taking turns after one
        untimed round (with the first step, bench/train_step's two warm-up steps)."""
        for fn in fns:
            fn()
        sync()
        times = [[] for _ in fns]
        for _ in range(args.steps):
            for fn, fn_times in zip(fns, times):
                sync()
                start = time.perf_counter()
                fn()
                sync()
                fn_times.append(time.perf_counter() - start)
        return [statistics.median(t) for t in times]

    # The first step on its own: under --compile it compiles (reported apart as compile_s).
    first_step_s = call_seconds(step, sync)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    extra = {}
    if args.ddp:
        step_s, no_sync_s = median_times([step, local_step])
        extra = {"ranks": int(os.environ["OMPI_COMM_WORLD_SIZE"]), "no_sync_step_s": round(no_sync_s, 4),
                 "ddp_over_no_sync": round(step_s / no_sync_s, 3)}
        if int(os.environ["OMPI_COMM_WORLD_RANK"]) != 0:
            return
    else:
        (step_s,) = median_times([step])
    flops = forward_flops(args.model)
    extra["ms_per_step"] = round(1e3 * step_s, 3)
    extra["first_step_s"] = round(first_step_s, 3)
    if args.compile:
        extra["compile_s"] = round(first_step_s - step_s, 3)
    extra["train_gflop_per_image"] = round(3 * flops / 1e9, 4)
    if device.type == "cuda":
        extra["peak_gpu_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if args.peak_tflops > 0:
        extra["peak_tflops"] = args.peak_tflops
        extra["mfu"] = round(args.batch / step_s * 3 * flops / (args.peak_tflops * 1e12), 4)
    print(json.dumps({
        "framework": "torch-" + torch.__version__, "model": args.model, "batch": args.batch, "device": args.device,
        "precision": args.precision, "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        # Eager PyTorch runs batch norm, add and relu one by one (ember's --no-fuse).
        "channels_last": args.channels_last, "compile": args.compile, "fused": False, "threads": args.threads, "step_s": round(step_s, 4), "images_per_s": round(args.batch / step_s, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1), **extra,
    }))


if __name__ == "__main__":
    main()
