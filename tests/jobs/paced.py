"""A 2-rank gloo DDP job whose steps take ``--step-s`` s (a sleep, as a device kernel would hold
the CPU): slow enough that a test can strike at a chosen step. It prints its steps and exits 0."""

import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--step-s", type=float, default=0.2)
args = p.parse_args()
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    time.sleep(args.step_s)
    model(torch.randn(16, 64)).sum().backward()
    optimizer.step()
    if dist.get_rank() == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
del model, optimizer  # DDP's reducer holds the group: freed first, or its threads may outlive the interpreter
gc.collect()  # (torch 2.13: "terminate called without an active exception" at exit, 4 of 16 runs without this)
dist.destroy_process_group()
