"""A 2-rank gloo job that waits on one all-reduce a step from Python and prints, as JSON, the
steps during which ``Work.wait`` was not torch's own (``dpro.collectors.settled_waits``) and
whether it is torch's again at the end."""

import gc
import json

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

dist.init_process_group("gloo")
own = Work.wait
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
changed = []
for step in range(12):
    if Work.__dict__["wait"] is not own:
        changed.append(step)
    model(torch.randn(8, 16)).sum().backward()
    dist.all_reduce(model.weight.grad, async_op=True).wait()
    optimizer.step()
if dist.get_rank() == 0:
    print(json.dumps({"changed": changed, "own_at_end": Work.__dict__["wait"] is own}), flush=True)
del model, optimizer
gc.collect()  # (torch 2.13: "terminate called without an active exception" at exit, see docs/getting-started.md)
dist.destroy_process_group()
