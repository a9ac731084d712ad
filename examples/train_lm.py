"""Train a small GPT-style language model (or an MLP or a CNN) with DistributedDataParallel.

Runs with gloo on CPU and with NCCL on GPUs, under torchrun::

    torchrun --standalone --nproc-per-node 2 examples/train_lm.py --steps 40

The data is a synthetic language with learnable structure (each token depends on the two before
it, with noise), generated from a seed, so the job needs no download and its loss falls.
``--arch mlp`` and ``--arch cnn`` train models of other shapes on the same tokens (the MLP on a
bag of one-hot tokens, the CNN on the sequence as a 1-D signal), predicting the next token; the
replay benchmark uses them for variety: the MLP is dominated by few large gradients, the CNN by
many small ones.
``--accumulate K`` and ``--compile`` are two of ``dpro optimize``'s strategies written in
(gradient accumulation; the DDP module compiled with ``torch.compile``).
``--step-times`` and ``--torch-profiler`` exist for dpro's overhead benchmark: the first writes
each step's end time (the moment its optimizer step returned), the second profiles the same steps
as ``dpro record`` would, with a bare torch.profiler.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq_len, seq_len), -math.inf), 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


class TokenMLP(nn.Module):
    """Predicts the token after a window from the window's one-hot encoding: few, wide layers."""

    def __init__(self, vocab: int, seq_len: int, width: int, layers: int) -> None:
        super().__init__()
        dims = [vocab * 2] + [width] * layers
        self.body = nn.Sequential(*(m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())))
        self.head = nn.Linear(width, vocab)
        self.vocab = vocab

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        last_two = F.one_hot(tokens[:, -2:], self.vocab).float().flatten(1)
        return self.head(self.body(last_two)).unsqueeze(1).expand(-1, tokens.shape[1], -1)


class TokenCNN(nn.Module):
    """A stack of causal 1-D convolutions over token embeddings: many small layers."""

    def __init__(self, vocab: int, channels: int, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, channels)
        self.convs = nn.ModuleList(nn.Conv1d(channels, channels, 3, padding=2) for _ in range(layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(channels) for _ in range(layers))
        self.head = nn.Linear(channels, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens).transpose(1, 2)
        for conv, norm in zip(self.convs, self.norms):
            x = x + F.relu(norm(conv(x)[..., :x.shape[-1]]))
        return self.head(x.transpose(1, 2))


class TokenRNN(nn.Module):
    """An embedding and an LSTM cell stepped over the sequence in Python: many small ops per step,
    the kind of job a profiler slows down most."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.cell = nn.LSTMCell(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        h = c = x.new_zeros(x.shape[0], self.cell.hidden_size)
        outputs = []
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            outputs.append(h)
        return self.head(torch.stack(outputs, 1))


def build_model(args: argparse.Namespace) -> nn.Module:
    if args.arch == "rnn":
        return TokenRNN(args.vocab, args.d_model)
    if args.arch == "mlp":
        return TokenMLP(args.vocab, args.seq_len, args.d_model * 8, args.layers)
    if args.arch == "cnn":
        return TokenCNN(args.vocab, args.d_model, args.layers * 4)
    return TinyGPT(args.vocab, args.seq_len, args.d_model, args.layers, args.heads)


def synthetic_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Sequences where token i is (3·t[i-1] + t[i-2] + 1) mod vocab, one token in ten random."""
    seq = torch.empty(batch, seq_len + 1, dtype=torch.long)
    seq[:, :2] = torch.randint(vocab, (batch, 2), generator=gen)
    for i in range(2, seq_len + 1):
        seq[:, i] = (3 * seq[:, i - 1] + seq[:, i - 2] + 1) % vocab
    noise = torch.rand(batch, seq_len + 1, generator=gen) < 0.1
    seq[noise] = torch.randint(vocab, (int(noise.sum()),), generator=gen)
    return seq


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("gpt", "mlp", "cnn", "rnn"), default="gpt")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="gradient accumulation: each step's batch in K micro-batches, DDP's no_sync on all but the last")
    p.add_argument("--compile", action="store_true",
                   help="compile the DDP module with torch.compile (TorchInductor fuses its ops)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float, help="DDP's first bucket cap (bucket_cap_mb_list, torch 2.13)")
    p.add_argument("--static-graph", action="store_true", help="DDP's static_graph")
    p.add_argument("--grad-as-bucket-view", action="store_true", help="DDP's gradient_as_bucket_view")
    p.add_argument("--comm-hook", metavar="fp16|bf16|powersgd:RANK",
                   help="compress gradients with DDP's fp16, bf16 or PowerSGD communication hook")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-rank", type=int, help="make this rank a straggler (extra compute every step)")
    p.add_argument("--slow-ms", type=float, default=30.0, help="the straggler's extra compute per step, in ms")
    p.add_argument("--step-times", help="write each step's end time (ns) to this file + '.<rank>'")
    p.add_argument("--torch-profiler", metavar="DIR",
                   help="profile with a bare torch.profiler (skip 10, warm-up 2, 5 steps) into DIR")
    p.add_argument("--profiler-window", default="10,2,5", help="skip,warmup,steps for --torch-profiler")
    args = p.parse_args(argv)
    if args.accumulate < 1 or args.batch_size % args.accumulate:
        p.error(f"--accumulate must divide the batch size {args.batch_size} (equal micro-batches, the same mean loss)")
    return args


def register_comm_hook(ddp: DistributedDataParallel, name: str) -> None:
    """DDP's fp16 or bf16 compression hook, or PowerSGD of the given rank from the second step."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name.startswith("powersgd:"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name.split(":")[1]),
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return
    hooks = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
    if name not in hooks:
        raise SystemExit(f"--comm-hook: {name!r} is not fp16, bf16 or powersgd:RANK")
    ddp.register_comm_hook(None, hooks[name])


def bare_profiler(trace_dir: str, window: str, rank: int, cuda: bool) -> torch.profiler.profile:
    """A torch.profiler set up as ``dpro record`` sets it up, for comparison."""
    skip, warmup, steps = (int(v) for v in window.split(","))
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    def save(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(os.path.join(trace_dir, f"rank{rank}.json.gz"))

    return torch.profiler.profile(
        activities=activities, record_shapes=True, on_trace_ready=save,
        schedule=torch.profiler.schedule(skip_first=skip, wait=0, warmup=warmup, active=steps, repeat=1))


def write_step_times(path: str, rank: int, ends: list[int]) -> None:
    """Each step's end time (ns), a line each, to ``path.<rank>`` (``--step-times``)."""
    with open(f"{path}.{rank}", "w") as f:
        f.write("".join(f"{t}\n" for t in ends))


def busy_compute(ms: float, device: torch.device) -> None:
    """Matrix products for ``ms`` milliseconds: a rank made slow as a throttled GPU or a busy
    host would make it."""
    a = torch.randn(128, 128, device=device)
    deadline = time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    torch.manual_seed(args.seed)
    model = build_model(args).to(device)
    caps = {"bucket_cap_mb": args.bucket_cap_mb} if args.first_bucket_mb is None else {
        "bucket_cap_mb_list": [args.first_bucket_mb, args.bucket_cap_mb]}
    flags = {name: True for name, on in (("static_graph", args.static_graph),
                                         ("gradient_as_bucket_view", args.grad_as_bucket_view)) if on}
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None, **caps, **flags)
    if args.comm_hook:
        register_comm_hook(ddp, args.comm_hook)
    forward = torch.compile(ddp) if args.compile else ddp  # after DDP wraps the model: DDP's optimizer splits the graph
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    profiler = bare_profiler(args.torch_profiler, args.profiler_window, rank, cuda) if args.torch_profiler else None
    if profiler:
        os.makedirs(args.torch_profiler, exist_ok=True)
        profiler.start()
    ends = []
    for step in range(args.steps):
        batch = synthetic_batch(gen, args.batch_size, args.seq_len, args.vocab).to(device)
        optimizer.zero_grad(set_to_none=True)
        micro_batches = batch.chunk(args.accumulate)
        for i, micro in enumerate(micro_batches):
            with ddp.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
                logits = forward(micro[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, args.vocab), micro[:, 1:].reshape(-1))
                if rank == args.slow_rank and i == 0:
                    busy_compute(args.slow_ms, device)
                (loss / len(micro_batches)).backward()
        optimizer.step()
        ends.append(time.time_ns())
        if profiler:
            profiler.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.3f}", flush=True)
    if profiler:
        profiler.stop()
    if args.step_times:
        write_step_times(args.step_times, rank, ends)
    # Free the process group's last users (DDP's reducer sits in reference cycles; ``forward`` is
    # DDP itself or its compiled wrapper) so that destroying it joins gloo's worker threads now:
    # left running into interpreter shutdown, a worker that frees a finished collective aborts
    # the process with "terminate called without an active exception" (torch 2.13 on CPU: 4 runs
    # in 40 of this script, with or without dpro). Until ``forward`` was freed too, DDP outlived
    # this teardown, and a PowerSGD run still aborted now and then.
    del forward, ddp, optimizer, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
