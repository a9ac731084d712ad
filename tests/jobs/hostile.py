"""A training script that breaks dpro's hooks in the way given as argument, then trains on.

profiler   torch.profiler.profile cannot be constructed
fds        the script closes every file descriptor above stderr (as daemonising code does)
hooks      the script clears the global optimizer hooks (dpro never sees a step)
"""

import os
import sys

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks

how = sys.argv[1]
if how == "profiler":
    class BrokenProfile:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("this script does not allow profiling")

    torch.profiler.profile = BrokenProfile

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    if step == 1 and how == "fds":
        os.closerange(3, 4096)
    if step == 1 and how == "hooks":
        _global_optimizer_post_hooks.clear()
print("training finished", flush=True)
