"""A 2-rank gloo DDP job for measured trials: each step holds ``--hold`` s off the CPU (like a
device kernel), 20 ms less under a bucket cap of 1 MB. Under ``static_graph`` it exits with an
error at its third step (as a job whose graph changes between steps would), and under a first
bucket cap it hangs (as a job that deadlocks would). It reads what ``dpro record --apply``
applies from the same variable dpro passes it."""

import argparse
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--hold", type=float, default=0.04)
args = p.parse_args()
applied = json.loads(os.environ.get("DPRO_APPLY") or "{}")
hold = args.hold - (0.02 if applied.get("bucket_cap_mb") == 1 else 0.0)
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    if step == 2 and applied.get("static_graph"):
        sys.exit("the graph changed between steps")
    while step == 2 and applied.get("first_bucket_mb"):
        time.sleep(1)
    time.sleep(hold)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
del model, optimizer
gc.collect()
dist.destroy_process_group()
