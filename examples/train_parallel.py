"""Train the small GPT of ``train_lm.py`` sharded (FSDP2), tensor parallel (with data parallel on
a 2-D mesh) or pipelined (``torch.distributed.pipelining``).

Runs with gloo on CPU and with NCCL on GPUs, under torchrun::

    torchrun --standalone --nproc-per-node 2 examples/train_parallel.py --form fsdp
    torchrun --standalone --nproc-per-node 4 examples/train_parallel.py --form tp --tp 2
    torchrun --standalone --nproc-per-node 2 examples/train_parallel.py --form pp --microbatches 4

- ``fsdp``: every block and then the whole model under ``fully_shard`` (one FSDP unit per
  block, one for the rest); ``--no-reshard`` keeps the parameters gathered after the forward,
  ``--blocks-per-unit G`` wraps every ``G`` blocks as one unit (``fully_shard([...])``),
  ``--checkpoint`` runs every block under activation checkpointing, ``--replicate R`` shards
  over ``world/R`` ranks and replicates over ``R`` (HSDP: an ``R × world/R`` mesh).
- ``tp``: a ``(dp, tp)`` device mesh; each block's attention projections and MLP split column-
  then row-wise over ``tp`` with ``parallelize_module``, the gradients averaged over ``dp`` by
  an all-reduce per parameter after the backward.
- ``pp``: the blocks split into as many stages as ranks, one per rank; the batch in
  ``--microbatches`` micro-batches under ``--schedule`` (``gpipe`` or ``1f1b``).

The micro-batch count and schedule are read from ``PP_MICROBATCHES`` and ``PP_SCHEDULE`` when
set, so a launcher can change them without editing the command line.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

try:
    from examples.train_lm import TinyGPT, synthetic_batch, write_step_times
except ImportError:  # run as a script: its own folder is on the path, not the repository
    from train_lm import TinyGPT, synthetic_batch, write_step_times

FORMS = ("fsdp", "tp", "pp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--form", choices=FORMS, default="fsdp")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-reshard", action="store_true", help="fsdp: reshard_after_forward=False")
    p.add_argument("--blocks-per-unit", type=int, default=1, help="fsdp: consecutive blocks wrapped as one unit")
    p.add_argument("--checkpoint", action="store_true", help="fsdp: every block under activation checkpointing")
    p.add_argument("--replicate", type=int, default=1, metavar="R",
                   help="fsdp: sharded over world/R ranks, replicated over R (HSDP)")
    p.add_argument("--tp", type=int, default=2, help="tp: the tensor-parallel degree (the mesh is world/tp × tp)")
    p.add_argument("--microbatches", type=int, default=int(os.environ.get("PP_MICROBATCHES", 4)))
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default=os.environ.get("PP_SCHEDULE", "gpipe"))
    p.add_argument("--step-times", help="write each step's end time (ns) to this file + '.<rank>'")
    args = p.parse_args(argv)
    if args.batch_size % args.microbatches:
        p.error(f"--microbatches must divide the batch size {args.batch_size}")
    return args


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Stage(nn.Module):
    """A contiguous run of the GPT's blocks; the first stage embeds, the last projects to tokens."""

    def __init__(self, gpt: TinyGPT, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.tok, self.pos = (gpt.tok, gpt.pos) if first else (None, None)
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        self.ln, self.head = (gpt.ln, gpt.head) if last else (None, None)
        self.register_buffer("mask", gpt.mask.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        t = x.shape[1]
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x)) if self.head is not None else x


class TPBlock(nn.Module):
    """A pre-norm block with attention written out in linear layers, so that ``parallelize_module``
    can split its projections: q, k, v column-wise (heads split over the tensor-parallel ranks),
    the output projection row-wise; the MLP likewise."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.o = nn.Linear(d_model, d_model)
        self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).view(b, t, -1, self.q.out_features // self.heads).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))  # -1: the heads local to this rank
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(att)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TPGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(TPBlock(d_model, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def build_fsdp(args: argparse.Namespace, device: torch.device):
    from torch.distributed.fsdp import fully_shard

    mesh = fsdp_mesh(device, args.replicate)
    model = TinyGPT(args.vocab, args.seq_len, args.d_model, args.layers, args.heads).to(device)
    if args.checkpoint:  # each block's activations recomputed in the backward pass
        for block in model.blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    blocks, size = list(model.blocks), args.blocks_per_unit
    for i in range(0, len(blocks), size):  # fully_shard of a list: one unit for them all
        unit = blocks[i:i + size]
        fully_shard(unit[0] if size == 1 else unit, mesh=mesh, reshard_after_forward=not args.no_reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=not args.no_reshard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = loss_of(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        return loss

    return model, optimizer, step


def fsdp_mesh(device: torch.device, replicate: int):
    """FSDP2's mesh: ``(replicate, shard)`` for HSDP, else None (FSDP2's own, over every rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if replicate < 1 or world % replicate:
        raise SystemExit(f"--replicate {replicate} does not divide the world size {world}")
    if replicate == 1:
        return None
    return init_device_mesh(device.type, (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))


def build_tp(args: argparse.Namespace, device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the world size {world}")
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    model = TPGPT(args.vocab, args.seq_len, args.d_model, args.layers, args.heads).to(device)
    plan = {**{name: ColwiseParallel() for name in ("q", "k", "v", "up")},
            **{name: RowwiseParallel() for name in ("o", "down")}}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    dp_group = mesh["dp"].get_group()

    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = loss_of(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        if dist.get_world_size(dp_group) > 1:
            for param in model.parameters():
                grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                dist.all_reduce(grad, group=dp_group)
                grad.div_(dist.get_world_size(dp_group))
        return loss

    return model, optimizer, step


def build_pp(args: argparse.Namespace, device: torch.device):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    if args.layers % world:
        raise SystemExit(f"--layers {args.layers} does not split into {world} equal stages")
    gpt = TinyGPT(args.vocab, args.seq_len, args.d_model, args.layers, args.heads)
    per = args.layers // world
    stage_module = Stage(gpt, range(rank * per, (rank + 1) * per), rank == 0, rank == world - 1).to(device)
    del gpt
    stage = PipelineStage(stage_module, rank, world, device)
    schedule_class = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
    schedule = schedule_class(stage, n_microbatches=args.microbatches, loss_fn=loss_of)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=args.lr)

    def step(batch: torch.Tensor) -> torch.Tensor | None:
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(batch[:, :-1])
        elif rank == world - 1:
            schedule.step(target=batch[:, 1:], losses=losses)
        else:
            schedule.step()
        return torch.stack(losses).mean() if losses else None

    return stage_module, optimizer, step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    model, optimizer, train_step = {"fsdp": build_fsdp, "tp": build_tp, "pp": build_pp}[args.form](args, device)
    # Data parallel ranks read different data; tensor- and pipeline-parallel ranks the same.
    data_rank = {"fsdp": rank, "tp": rank // args.tp, "pp": 0}[args.form]
    gen = torch.Generator().manual_seed(args.seed * 1000 + data_rank)
    ends = []
    for step in range(args.steps):
        batch = synthetic_batch(gen, args.batch_size, args.seq_len, args.vocab).to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = train_step(batch)
        optimizer.step()
        ends.append(time.time_ns())
        if loss is not None and (step % 10 == 0 or step == args.steps - 1):
            print(f"rank {rank} step {step:4d}  loss {loss.item():.3f}", flush=True)
    if args.step_times:
        write_step_times(args.step_times, rank, ends)
    del model, optimizer, train_step  # freed before the group is destroyed, as train_lm.py explains
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
