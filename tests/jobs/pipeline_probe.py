"""A 2-stage pipeline trained 6 steps; with ``--probe``, steps 3 and 4 run at half its
micro-batches, switched as ``dpro record``'s probe switches them
(:class:`dpro.collectors.probe.MicrobatchProbe`). Prints each step's mean loss and, at the end,
each rank's parameters' sum."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from dpro.collectors.probe import MicrobatchProbe

parser = argparse.ArgumentParser()
parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
parser.add_argument("--probe", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [torch.nn.Linear(64, 64) for _ in range(2 * world)]
module = torch.nn.Sequential(*layers[2 * rank:2 * rank + 2])
stage = PipelineStage(module, rank, world, torch.device("cpu"))
schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule](
    stage, n_microbatches=4, loss_fn=lambda out, target: ((out - target) ** 2).mean())
optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(1)
probe = None
for step in range(6):
    x, y = torch.randn(16, 64, generator=gen), torch.randn(16, 64, generator=gen)
    if args.probe and step == 3:
        probe = MicrobatchProbe.find()
        probe.switch()
    if probe is not None and step == 5:
        probe.restore()
    optimizer.zero_grad()
    losses: list[torch.Tensor] = []
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    optimizer.step()
    if losses:
        print(f"step {step} micro-batches {len(losses)} loss {float(torch.stack(losses).mean()):.5f}", flush=True)
with torch.no_grad():
    print(f"rank {rank} parameters {float(sum(p.sum() for p in module.parameters())):.4f}", flush=True)
dist.destroy_process_group()
