"""A 2-stage pipeline (4 micro-batches) trained ``--steps`` steps, as a script recorded
unchanged by ``dpro record --probe``. ``--skip-step K --skip-rank R``: rank ``R`` skips its
optimizer step at step ``K`` (as a GradScaler does on an overflow), so that its steps, counted by
optimizer steps, run one behind the other rank's. Prints each step's mean loss and, at the end,
each rank's parameters' sum."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

parser = argparse.ArgumentParser()
parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
parser.add_argument("--steps", type=int, default=16)
parser.add_argument("--skip-step", type=int, default=-1)
parser.add_argument("--skip-rank", type=int, default=-1)
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
for step in range(args.steps):
    x, y = torch.randn(16, 64, generator=gen), torch.randn(16, 64, generator=gen)
    optimizer.zero_grad()
    losses: list[torch.Tensor] = []
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    if not (step == args.skip_step and rank == args.skip_rank):
        optimizer.step()
    if losses:
        print(f"step {step} micro-batches {len(losses)} loss {float(torch.stack(losses).mean()):.5f}", flush=True)
with torch.no_grad():
    print(f"rank {rank} parameters {float(sum(p.sum() for p in module.parameters())):.4f}", flush=True)
dist.destroy_process_group()
