"""Print, as JSON, the gradient buckets real DDP builds for the example's models at several caps.

One process, gloo, world size 1: each model is wrapped in DistributedDataParallel with each
``bucket_cap_mb`` (and once with DDP's default cap), trained two steps (DDP rebuilds its buckets
after the first), and its layout is read as ``dpro record`` reads it
(:func:`dpro.collectors.metadata.ddp_layout`).
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dpro.collectors.metadata import ddp_layout
from dpro.examples.train_lm import build_model, parse_args, synthetic_batch

CAPS_MB = [None, 0.01, 0.05, 0.25, 1.0, 25.0]  # None: DDP's default


def layouts(arch: str) -> list[dict]:
    args = parse_args(["--arch", arch, "--d-model", "64", "--layers", "3", "--seq-len", "32"])
    out = []
    for cap in CAPS_MB:
        torch.manual_seed(0)
        model = build_model(args)
        ddp = DistributedDataParallel(model, **({} if cap is None else {"bucket_cap_mb": cap}))
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(0)
        for _ in range(2):
            batch = synthetic_batch(gen, 4, args.seq_len, args.vocab)
            loss = F.cross_entropy(ddp(batch[:, :-1]).reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        out.append({"arch": arch, "cap_mb": cap, "layout": ddp_layout(ddp)})
    return out


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    print(json.dumps([entry for arch in ("gpt", "mlp", "cnn") for entry in layouts(arch)]))
    dist.destroy_process_group()
