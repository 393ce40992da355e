#!/usr/bin/python3
"""Writes resnet_golden.json: a small ResNet's forward outputs, loss and gradients computed
by PyTorch (Debian's python3-torch), for ember's nn tests to match. Run once by hand:

    /usr/bin/python3 tests/nn/golden/make_resnet_golden.py

The model mirrors ember's ResNet({4, 8}, {1, 1}, classes=3, in_channels=3, CIFAR stem), with
torchvision's parameter names; everything is float64 so the comparison is tight.
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


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


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = nn.Sequential(BasicBlock(4, 4, 1))
        self.layer2 = nn.Sequential(BasicBlock(4, 8, 2))
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def flat(t):
    return {"shape": list(t.shape), "data": t.detach().reshape(-1).tolist()}


def main():
    torch.manual_seed(0)
    model = SmallResNet().double()
    with torch.no_grad():  # non-trivial batch-norm affine parameters and running statistics
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    state = {k: flat(v) for k, v in model.state_dict().items()}

    x = torch.randn(4, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 2, 1, 2])
    model.train()
    out = model(x)
    loss = F.cross_entropy(out, target, label_smoothing=0.1)
    loss.backward()
    grads = {k: flat(p.grad) for k, p in model.named_parameters()}
    running = {k: flat(v) for k, v in model.state_dict().items() if "running" in k}
    model.eval()
    with torch.no_grad():
        eval_out = model(x)

    golden = {
        "state": state, "input": flat(x), "target": target.tolist(), "train_output": flat(out),
        "loss": loss.item(), "input_grad": flat(x.grad), "grads": grads, "running_after": running,
        "eval_output": flat(eval_out),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f)
    print("wrote", path)


if __name__ == "__main__":
    main()
