#!/usr/bin/env python3
"""Writes join_golden.json: PyTorch's DDP under torch.distributed.algorithms.join.Join on uneven
inputs, for ember's Join tests (tests/dist/join_test.cpp). Run once with PyTorch 1.13:

    /usr/bin/python3 tests/dist/golden/make_join_golden.py

Two processes over gloo on loopback. The model (Linear(4, 8), BatchNorm1d(8), ReLU,
Linear(8, 3), float64) starts from the recorded initial state; rank 0 has 5 batches and rank 1
has 3 (4 rows each, recorded); SGD(lr=0.1, momentum=0.9), cross_entropy. For both values of
divide_by_initial_world_size the file holds every rank's gradients after each of its steps and
every rank's state dict after the Join (the final model sync included).
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

BATCHES = [5, 3]
ROWS = 4


def make_model():
    torch.manual_seed(5)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        torch.nn.Linear(8, 3),
    ).double()


def make_batches():
    g = torch.Generator().manual_seed(11)
    return [[(torch.randn(ROWS, 4, generator=g, dtype=torch.float64),
              torch.randint(0, 3, (ROWS,), generator=g))
             for _ in range(n)] for n in BATCHES]


def tensor_json(t):
    t = t.detach()
    return {"shape": list(t.shape), "data": t.double().flatten().tolist()}


def worker(rank, world, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    batches = make_batches()[rank]
    cases = []
    for by_initial in (True, False):
        ddp = DDP(make_model())
        sgd = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        grads = []
        with Join([ddp], divide_by_initial_world_size=by_initial):
            for x, y in batches:
                sgd.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                grads.append({n: tensor_json(p.grad) for n, p in ddp.module.named_parameters()})
                sgd.step()
        final = {n: tensor_json(t) for n, t in ddp.module.state_dict().items()}
        cases.append({"divide_by_initial_world_size": by_initial, "grads": grads,
                      "final": final})
    out[rank] = cases
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = len(BATCHES)
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(world, port, out), nprocs=world)
    model = make_model()
    golden = {
        "torch_version": torch.__version__,
        "initial": {n: tensor_json(t) for n, t in model.state_dict().items()},
        "batches": [[{"x": tensor_json(x), "y": y.tolist()} for x, y in rank_batches]
                    for rank_batches in make_batches()],
        "cases": [
            {
                "divide_by_initial_world_size": out[0][i]["divide_by_initial_world_size"],
                "grads": [out[r][i]["grads"] for r in range(world)],
                "final": [out[r][i]["final"] for r in range(world)],
            }
            for i in range(2)
        ],
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "join_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f)
        f.write("\n")
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
