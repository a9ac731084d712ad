"""A 2-rank gloo DDP job whose steps hold 40 ms off the CPU (like a device kernel); the steps
named by ``--slow FIRST LAST`` hold 40 ms more, as a busy machine would slow them."""

import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=14)
p.add_argument("--slow", type=int, nargs=2, default=(-1, -1), metavar=("FIRST", "LAST"))
args = p.parse_args()
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    time.sleep(0.08 if args.slow[0] <= step <= args.slow[1] else 0.04)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
del model, optimizer  # DDP's reducer sits in reference cycles: freed before gloo is torn down
gc.collect()  # (see the README's known upstream issue: an abort at exit otherwise)
dist.destroy_process_group()
